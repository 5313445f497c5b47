package router

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

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

// collector reads a node's counters and gauges at scrape time.
type collector struct {
	r *Router

	info, ready, reconnects                                           *prometheus.Desc
	routed, skipped, deadLettered, publishErrors, proposals, failures *prometheus.Desc
	held, heldBytes, lag, full, resets, gaps, missing                 *prometheus.Desc
	spilled, spilledBytes                                             *prometheus.Desc
	heldBackGroups, heldBackMsgs, heldBackTotal, groupShare           *prometheus.Desc
	batches, batchFailures, batched, batchesInFlight, maxBatch        *prometheus.Desc
	queueRewinds, queueLost, bindingsRewinds                          *prometheus.Desc
	queueOrphans                                                      *prometheus.Desc
	invalid, records, unsettled                                       *prometheus.Desc
	liveNodes, bindings, consumer, backlog                            *prometheus.Desc
}

func newCollector(r *Router) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("grouprouter_"+name, help, labels, nil)
	}
	return &collector{
		r:          r,
		info:       d("node_info", "Always 1: this node's id, type and grouping-handler name.", "node", "type", "handler"),
		ready:      d("ready", "1 while the node routes (as /readyz): binding cache loaded, NATS connected, ingress reader reading."),
		reconnects: d("nats_reconnects_total", "Reconnections of the node's NATS connection."),

		routed:        d("messages_routed_total", "Messages this node republished onto queues."),
		skipped:       d("messages_skipped_total", "Ingress messages this node read and left to the node they are bound to."),
		deadLettered:  d("messages_dead_lettered_total", "Messages this node put on the dead-letter stream."),
		publishErrors: d("queue_publish_errors_total", "Failed queue or dead-letter publishes (each is retried)."),
		proposals:     d("proposals_total", "Record changes this node asked of the LOCAL handler: bind proposals (every attempt), fences, releases, dead-letter records."),
		failures: d("proposal_failures_total",
			"Failed bind proposal attempts (the group waits and is retried), by reason: timeout, no_handler, error.", "reason"),

		held:      d("held_messages", "Messages this node holds in memory: undecided, or queued behind their group's publish."),
		heldBytes: d("held_bytes", "Size of the held messages, headers included."),
		spilled: d("spilled_messages",
			"Messages waiting for a decision that this node holds without their body (past half of --max-held-bytes); each is read again from the ingress when it is published."),
		spilledBytes: d("spilled_bytes", "What the spilled messages take in memory (bounded by --max-spilled-bytes)."),
		heldBackGroups: d("held_back_groups",
			"Groups held back for their share of this node's queue window: past it, their next messages wait on the node's held subject and go onto the queue as the consumer acknowledges the earlier ones (--group-share)."),
		heldBackMsgs:  d("held_back_messages", "Messages of the held-back groups waiting on this node's held subject."),
		heldBackTotal: d("held_back_total", "Times a group started being held back for its share of this node's queue window."),
		groupShare:    d("group_share", "How many of a group's messages may be on this node's queue unacknowledged now (0: no bound)."),
		batches: d("queue_batches_total",
			"Batches this node published onto its queue (several messages of one group that has a backlog, one PubAck round trip): atomic on a replicated queue stream, fast-ingest on R1."),
		batchFailures: d("queue_batch_failures_total",
			"Batches that failed: none or all of an atomic batch's messages were stored, a prefix of a fast-ingest one's; each went again alone, deduplicated by its own Nats-Msg-Id."),
		batched: d("queue_batched_messages_total",
			"Messages stored as part of a batch (divided by queue_batches_total: the mean batch; messages_routed_total minus it: those sent alone)."),
		batchesInFlight: d("queue_batches_in_flight", "Batches awaiting their outcome."),
		maxBatch: d("queue_max_batch",
			"The most messages of a group this node publishes as one batch; 1: one at a time (batches off, or a queue stream that does not allow the batches its replicas call for)."),
		lag: d("ingress_lag_messages", "Ingress messages stored after the last one this node read (stream last sequence minus the node's position)."),
		full: d("ingress_full_seconds_total",
			"Time this node's ingress reader waited for room because the held messages reached their bound (back-pressure: every group waits)."),
		resets: d("ingress_consumer_resets_total",
			"Re-creations of this node's ingress consumer, by reason: gap (a delivery lost), status (the server dropped the consumer), heartbeat (silence), reconnect.",
			"reason"),
		gaps: d("ingress_gaps_total",
			"Gaps in the ingress stream this node read over: messages gone before it read them (expired by max age, removed, or lost by a server)."),
		missing: d("ingress_missing_messages_total",
			"Ingress messages in those gaps: never read by this node, so not routed by it."),
		queueRewinds: d("queue_rewinds_total",
			"Times this node found the queue stream without a message it had stored there: its servers lost acknowledged writes."),
		queueLost: d("queue_lost_sequences_total",
			"Queue sequences lost in those rewinds (any node's messages; those not consumed yet are not delivered)."),
		queueOrphans: d("queue_orphans_removed_total",
			"Messages of this node's queue it removed because they lay at or below its consumer's ack floor: acknowledged, yet kept by the stream across a server restart."),
		bindingsRewinds: d("bindings_rewinds_total",
			"Times the bindings bucket went back below what this node had read (its servers lost acknowledged writes); the node read it again."),

		invalid:   d("invalid_records_ignored_total", "Binding records the cache ignored as invalid."),
		records:   d("binding_records", "Records in this node's binding cache, ended ones included."),
		unsettled: d("groups_unsettled", "Groups whose record is moving or in a hand-over step."),

		liveNodes: d("live_nodes", "Nodes announcing themselves."),
		bindings:  d("bindings", "Groups bound to each node, from this node's binding cache.", "node"),
		consumer:  d("queue_consumer_present", "1 when a live node's queue consumer has an active puller.", "node"),
		backlog: d("queue_backlog_messages",
			"Messages on each live node's queue, as its last announcement said: state=pending (not yet delivered) or unacked (delivered, not acked).",
			"node", "state"),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.info, c.ready, c.reconnects, c.routed, c.skipped, c.deadLettered,
		c.publishErrors, c.proposals, c.failures, c.held, c.heldBytes, c.spilled, c.spilledBytes,
		c.batches, c.batchFailures, c.batched, c.batchesInFlight, c.maxBatch, c.lag, c.full, c.resets, c.gaps, c.missing, c.queueRewinds, c.queueLost, c.queueOrphans, c.bindingsRewinds, c.invalid, c.records, c.unsettled,
		c.liveNodes, c.bindings, c.consumer, c.backlog} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. Before the node is ready it
// collects only what exists then (info, ready, reconnects).
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	r := c.r
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.info, 1, r.cfg.Node, string(r.cfg.Type), r.cfg.Name)
	gauge(c.ready, b2f(r.CheckReady() == nil))
	counter(c.reconnects, r.nc.Stats().Reconnects)
	if !r.isReady() {
		return
	}
	st := r.Stats()
	counter(c.routed, st.Routed)
	counter(c.skipped, st.Skipped)
	counter(c.deadLettered, st.DeadLettered)
	counter(c.publishErrors, st.PublishErrors)
	counter(c.proposals, st.Proposals)
	counter(c.failures, st.DecisionTimeouts, "timeout")
	counter(c.failures, st.NoHandler, "no_handler")
	counter(c.failures, st.DecisionErrors-st.DecisionTimeouts-st.NoHandler, "error")
	gauge(c.held, float64(st.Held))
	gauge(c.heldBytes, float64(st.HeldBytes))
	gauge(c.spilled, float64(st.Spilled))
	gauge(c.spilledBytes, float64(st.SpilledBytes))
	gauge(c.heldBackGroups, float64(st.HeldBackGroups))
	gauge(c.heldBackMsgs, float64(st.HeldBackMessages))
	counter(c.heldBackTotal, st.HeldBackTotal)
	gauge(c.groupShare, float64(st.GroupShare))
	counter(c.batches, st.Batches)
	counter(c.batchFailures, st.BatchFailures)
	counter(c.batched, st.BatchedMessages)
	gauge(c.batchesInFlight, float64(st.InFlightBatches))
	gauge(c.maxBatch, float64(st.MaxBatch))
	if last, ok := r.ingressLastCached(context.Background()); ok {
		gauge(c.lag, float64(lag(last, st.Position)))
	}
	ch <- prometheus.MustNewConstMetric(c.full, prometheus.CounterValue, r.fullTime().Seconds())
	for i, reason := range resetCauses {
		counter(c.resets, r.rs.resets[i].Load(), reason)
	}
	counter(c.gaps, st.IngressGaps)
	counter(c.missing, st.IngressMissing)
	counter(c.queueRewinds, st.QueueRewinds)
	counter(c.queueLost, st.QueueLostSeqs)
	counter(c.queueOrphans, st.QueueOrphans)
	counter(c.bindingsRewinds, st.BindingsRewinds)

	cache := r.cache
	counter(c.invalid, cache.Ignored())
	gauge(c.records, float64(cache.Len()))
	gauge(c.unsettled, float64(cache.UnsettledLen()))
	counts := cache.Counts()
	live := r.reg.Live()
	gauge(c.liveNodes, float64(len(live)))
	for _, node := range nodeIDs(counts, live) {
		gauge(c.bindings, float64(counts[node]), node)
	}
	for node, info := range live {
		gauge(c.consumer, b2f(info.HasConsumer), node)
		gauge(c.backlog, float64(info.QueuePending), node, "pending")
		gauge(c.backlog, float64(info.QueueUnacked), node, "unacked")
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
