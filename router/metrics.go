package router

import (
	"context"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// A node's metrics (docs/metrics.md) are read at scrape time from what the
// node keeps anyway: its counters, its binding cache's per-node counts, the
// node registry's announcements. Nothing is added to the per-message path;
// the decision latency histogram is observed once per decided group, and
// the ingress stream's last sequence is read at most once per
// ingressInfoMaxAge however often the node is scraped. What a scrape reads
// is O(nodes), whatever the number of bindings (BenchmarkScrape).

// ingressInfoMaxAge is how long a read of the ingress stream's last
// sequence serves scrapes and status requests.
const ingressInfoMaxAge = 2 * time.Second

// nodeMetrics are the metrics observed as things happen; collector reads
// the rest at scrape time.
type nodeMetrics struct {
	decisionLatency prometheus.Histogram
	// handler counts the LOCAL handler's decisions (LOCAL nodes only).
	handler *proposals.Metrics
}

func newNodeMetrics(typ HandlerType) *nodeMetrics {
	m := &nodeMetrics{
		decisionLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "grouprouter_decision_latency_seconds",
			Help: "Time from sending a bind proposal (its latest attempt) to the binding seen in this node's cache, " +
				"for the groups this node proposed.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}
	if typ == Local {
		m.handler = proposals.NewMetrics()
	}
	return m
}

// register registers the node's metrics with reg.
func (r *Router) registerMetrics(reg prometheus.Registerer) error {
	cs := []prometheus.Collector{newCollector(r), r.metrics.decisionLatency}
	if r.metrics.handler != nil {
		cs = append(cs, r.metrics.handler)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// collector reads a node's counters and gauges at scrape time: one table,
// each metric's description beside what a scrape reads for it, so that
// what Describe announces and what Collect sends cannot drift apart.
type collector struct {
	r       *Router
	metrics []scraped
}

// scraped is one metric of the table.
type scraped struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	early bool // collected before the node is ready, too
	read  func(s *scrape, emit func(v float64, labels ...string))
}

// scrape is what one Collect reads once and its metrics share.
type scrape struct {
	r      *Router
	st     Stats
	counts map[string]int                // bindings per node, from the cache
	live   map[string]kvbinding.NodeInfo // the registry's live nodes
}

func newCollector(r *Router) *collector {
	c := &collector{r: r}
	add := func(kind prometheus.ValueType, name, help string, labels []string, read func(*scrape, func(float64, ...string))) {
		c.metrics = append(c.metrics, scraped{
			desc: prometheus.NewDesc("grouprouter_"+name, help, labels, nil), kind: kind, read: read,
		})
	}
	gauge := func(name, help string, v func(*scrape) float64) {
		add(prometheus.GaugeValue, name, help, nil, func(s *scrape, emit func(float64, ...string)) { emit(v(s)) })
	}
	counter := func(name, help string, v func(*scrape) uint64) {
		add(prometheus.CounterValue, name, help, nil, func(s *scrape, emit func(float64, ...string)) { emit(float64(v(s))) })
	}
	early := func() { c.metrics[len(c.metrics)-1].early = true }

	add(prometheus.GaugeValue, "node_info", "Always 1: this node's id, type and grouping-handler name.",
		[]string{"node", "type", "handler"}, func(s *scrape, emit func(float64, ...string)) {
			emit(1, s.r.cfg.Node, string(s.r.cfg.Type), s.r.cfg.Name)
		})
	early()
	gauge("ready", "1 while the node routes (as /readyz): binding cache loaded, NATS connected, ingress reader reading.",
		func(s *scrape) float64 { return b2f(s.r.CheckReady() == nil) })
	early()
	counter("nats_reconnects_total", "Reconnections of the node's NATS connection.",
		func(s *scrape) uint64 { return s.r.nc.Stats().Reconnects })
	early()

	counter("messages_routed_total", "Messages this node republished onto queues.",
		func(s *scrape) uint64 { return s.st.Routed })
	counter("messages_skipped_total", "Ingress messages this node read and left to the node they are bound to.",
		func(s *scrape) uint64 { return s.st.Skipped })
	counter("messages_dead_lettered_total", "Messages this node put on the dead-letter stream.",
		func(s *scrape) uint64 { return s.st.DeadLettered })
	counter("queue_publish_errors_total", "Failed queue or dead-letter publishes (each is retried).",
		func(s *scrape) uint64 { return s.st.PublishErrors })
	counter("proposals_total", "Record changes this node asked of the LOCAL handler: bind proposals (every attempt), fences, releases, dead-letter records.",
		func(s *scrape) uint64 { return s.st.Proposals })
	add(prometheus.CounterValue, "proposal_failures_total",
		"Failed bind proposal attempts (the group waits and is retried), by reason: timeout, no_handler, error.",
		[]string{"reason"}, func(s *scrape, emit func(float64, ...string)) {
			emit(float64(s.st.DecisionTimeouts), "timeout")
			emit(float64(s.st.NoHandler), "no_handler")
			emit(float64(s.st.DecisionErrors-s.st.DecisionTimeouts-s.st.NoHandler), "error")
		})

	gauge("held_messages", "Messages this node holds in memory: undecided, or queued behind their group's publish.",
		func(s *scrape) float64 { return float64(s.st.Held) })
	gauge("held_bytes", "Size of the held messages, headers included.",
		func(s *scrape) float64 { return float64(s.st.HeldBytes) })
	gauge("spilled_messages",
		"Messages waiting for a decision that this node holds without their body (past half of --max-held-bytes); each is read again from the ingress when it is published.",
		func(s *scrape) float64 { return float64(s.st.Spilled) })
	gauge("spilled_bytes", "What the spilled messages take in memory (bounded by --max-spilled-bytes).",
		func(s *scrape) float64 { return float64(s.st.SpilledBytes) })
	gauge("held_back_groups",
		"Groups held back for their share of this node's queue window: past it, their next messages wait on the node's held subject and go onto the queue as the consumer acknowledges the earlier ones (--group-share).",
		func(s *scrape) float64 { return float64(s.st.HeldBackGroups) })
	gauge("held_back_messages", "Messages of the held-back groups waiting on this node's held subject.",
		func(s *scrape) float64 { return float64(s.st.HeldBackMessages) })
	counter("held_back_total", "Times a group started being held back for its share of this node's queue window.",
		func(s *scrape) uint64 { return s.st.HeldBackTotal })
	gauge("group_share", "How many of a group's messages may be on this node's queue unacknowledged now (0: no bound).",
		func(s *scrape) float64 { return float64(s.st.GroupShare) })
	counter("queue_batches_total",
		"Batches this node published onto its queue (several messages of one group that has a backlog, one PubAck round trip): atomic on a replicated queue stream, fast-ingest on R1.",
		func(s *scrape) uint64 { return s.st.Batches })
	counter("queue_batch_failures_total",
		"Batches that failed: none or all of an atomic batch's messages were stored, a prefix of a fast-ingest one's; each went again alone, deduplicated by its own Nats-Msg-Id.",
		func(s *scrape) uint64 { return s.st.BatchFailures })
	counter("queue_batched_messages_total",
		"Messages stored as part of a batch (divided by queue_batches_total: the mean batch; messages_routed_total minus it: those sent alone).",
		func(s *scrape) uint64 { return s.st.BatchedMessages })
	gauge("queue_batches_in_flight", "Batches awaiting their outcome.",
		func(s *scrape) float64 { return float64(s.st.InFlightBatches) })
	gauge("queue_max_batch",
		"The most messages of a group this node publishes as one batch; 1: one at a time (batches off, or a queue stream that does not allow the batches its replicas call for).",
		func(s *scrape) float64 { return float64(s.st.MaxBatch) })
	add(prometheus.GaugeValue, "ingress_lag_messages",
		"Ingress messages stored after the last one this node read (stream last sequence minus the node's position).",
		nil, func(s *scrape, emit func(float64, ...string)) {
			if last, ok := s.r.ingressLastCached(context.Background()); ok {
				emit(float64(lag(last, s.st.Position)))
			}
		})
	add(prometheus.CounterValue, "ingress_full_seconds_total",
		"Time this node's ingress reader waited for room because the held messages reached their bound (back-pressure: every group waits).",
		nil, func(s *scrape, emit func(float64, ...string)) { emit(s.r.fullTime().Seconds()) })
	add(prometheus.CounterValue, "ingress_consumer_resets_total",
		"Re-creations of this node's ingress consumer, by reason: gap (a delivery lost), status (the server dropped the consumer), heartbeat (silence), reconnect.",
		[]string{"reason"}, func(s *scrape, emit func(float64, ...string)) {
			for i, reason := range resetCauses {
				emit(float64(s.r.rs.resets[i].Load()), reason)
			}
		})
	counter("ingress_gaps_total",
		"Gaps in the ingress stream this node read over: messages gone before it read them (expired by max age, removed, or lost by a server).",
		func(s *scrape) uint64 { return s.st.IngressGaps })
	counter("ingress_missing_messages_total",
		"Ingress messages in those gaps: never read by this node, so not routed by it.",
		func(s *scrape) uint64 { return s.st.IngressMissing })
	counter("queue_rewinds_total",
		"Times this node found the queue stream without a message it had stored there: its servers lost acknowledged writes.",
		func(s *scrape) uint64 { return s.st.QueueRewinds })
	counter("queue_lost_sequences_total",
		"Queue sequences lost in those rewinds (any node's messages; those not consumed yet are not delivered).",
		func(s *scrape) uint64 { return s.st.QueueLostSeqs })
	counter("queue_orphans_removed_total",
		"Messages of this node's queue it removed because they lay at or below its consumer's ack floor: acknowledged, yet kept by the stream across a server restart.",
		func(s *scrape) uint64 { return s.st.QueueOrphans })
	counter("bindings_rewinds_total",
		"Times the bindings bucket went back below what this node had read (its servers lost acknowledged writes); the node read it again.",
		func(s *scrape) uint64 { return s.st.BindingsRewinds })

	counter("invalid_records_ignored_total", "Binding records the cache ignored as invalid.",
		func(s *scrape) uint64 { return s.r.cache.Ignored() })
	gauge("binding_records", "Records in this node's binding cache, ended ones included.",
		func(s *scrape) float64 { return float64(s.r.cache.Len()) })
	gauge("groups_unsettled", "Groups whose record is moving or in a hand-over step.",
		func(s *scrape) float64 { return float64(s.r.cache.UnsettledLen()) })

	gauge("live_nodes", "Nodes announcing themselves.",
		func(s *scrape) float64 { return float64(len(s.live)) })
	add(prometheus.GaugeValue, "bindings", "Groups bound to each node, from this node's binding cache.",
		[]string{"node"}, func(s *scrape, emit func(float64, ...string)) {
			for _, node := range nodeIDs(s.counts, s.live) {
				emit(float64(s.counts[node]), node)
			}
		})
	add(prometheus.GaugeValue, "queue_consumer_present", "1 when a live node's queue consumer has an active puller.",
		[]string{"node"}, func(s *scrape, emit func(float64, ...string)) {
			for _, node := range slices.Sorted(maps.Keys(s.live)) {
				emit(b2f(s.live[node].HasConsumer), node)
			}
		})
	add(prometheus.GaugeValue, "queue_backlog_messages",
		"Messages on each live node's queue, as its last announcement said: state=pending (not yet delivered) or unacked (delivered, not acked).",
		[]string{"node", "state"}, func(s *scrape, emit func(float64, ...string)) {
			for _, node := range slices.Sorted(maps.Keys(s.live)) {
				emit(float64(s.live[node].QueuePending), node, "pending")
				emit(float64(s.live[node].QueueUnacked), node, "unacked")
			}
		})
	return c
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
}

// Collect implements prometheus.Collector. Before the node is ready it
// collects only what exists then (info, ready, reconnects).
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := &scrape{r: c.r}
	ready := c.r.isReady()
	if ready {
		s.st = c.r.Stats()
		s.counts = c.r.cache.Counts()
		s.live = c.r.reg.Live()
	}
	for _, m := range c.metrics {
		if !ready && !m.early {
			continue
		}
		m.read(s, func(v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(m.desc, m.kind, v, labels...)
		})
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// lag is how many ingress messages are stored from position (the next
// sequence to read) through last.
func lag(last, position uint64) uint64 {
	if position == 0 || last+1 <= position {
		return 0
	}
	return last + 1 - position
}

// nodeIDs returns the ids of both maps, sorted.
func nodeIDs[A, B any](a map[string]A, b map[string]B) []string {
	ids := make([]string, 0, len(a)+len(b))
	for id := range a {
		ids = append(ids, id)
	}
	for id := range b {
		if _, dup := a[id]; !dup {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// ingressInfo caches the ingress stream's last sequence for scrapes and
// status requests; its lock is held during the read, so a burst of scrapes
// makes one request.
type ingressInfo struct {
	mu   sync.Mutex
	last uint64
	at   time.Time
	ok   bool
}

// ingressLastCached returns the ingress stream's last sequence, read at
// most once per ingressInfoMaxAge, and whether it is known.
func (r *Router) ingressLastCached(ctx context.Context) (uint64, bool) {
	c := &r.rs.ingress
	c.mu.Lock()
	defer c.mu.Unlock()
	if (!c.at.IsZero() && time.Since(c.at) < ingressInfoMaxAge) || r.nc.Status() != nats.CONNECTED {
		return c.last, c.ok // disconnected: a request would only wait out its timeout
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	s, err := r.js.Stream(ctx, IngressStream) // one request: the stream's info
	c.at = time.Now()
	if err != nil {
		r.log.Debug("ingress stream info not read", "err", err)
		return c.last, c.ok // the last known value, if any
	}
	c.last, c.ok = s.CachedInfo().State.LastSeq, true
	return c.last, true
}

// fullTime is how long the ingress reader has waited for room, the wait
// under way included.
func (r *Router) fullTime() time.Duration {
	d := time.Duration(r.rs.fullNanos.Load())
	if since := r.rs.fullSince.Load(); since != 0 {
		d += max(time.Since(time.Unix(0, since)), 0)
	}
	return d
}
