package proposals

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// What a move was started for: the cause label of grouprouter_moves_total.
const (
	causeOperator     = "operator"      // grouprouter move or unbind
	causeNodeGone     = "node_gone"     // the node was gone longer than NodeGrace
	causeNoConsumer   = "no_consumer"   // the node's queue had no consumer for RebindAfter
	causeFenceOverdue = "fence_overdue" // the old node did not fence within FenceDeadline
	causeRebalance    = "rebalance"     // the handler spread groups over the nodes with a consumer
)

// The label values the handler's metrics take, in a fixed order so that
// counting is an array index and an atomic add (a decision is counted per
// proposal, tens of thousands a second under load).
var (
	metricOps      = [...]Op{OpBind, OpFence, OpDrained, OpCaughtUp, OpRelease, OpDeadLetter, OpMove, OpUnbind, OpEvacuate}
	metricOutcomes = [...]Outcome{Accepted, Rejected, Refused, Failed}
	moveCauses     = [...]string{causeOperator, causeNodeGone, causeNoConsumer, causeFenceOverdue, causeRebalance}
)

// Metrics are a LOCAL handler's metrics, a prometheus.Collector: whether
// it is active, its decisions by op and outcome, requests dropped or
// refused busy, moves by cause and their durations. Create them with
// NewMetrics, register them, and pass them in HandlerConfig.Metrics; they
// collect nothing until a handler uses them. Counters are atomics read at
// scrape time, so a scrape costs the same whatever the number of
// bindings; the only state kept for metrics alone is the start time of
// each move in progress, to observe its duration when its record settles.
// They are safe for concurrent use.
type Metrics struct {
	h atomic.Pointer[Handler]

	decisions [len(metricOps) + 1][len(metricOutcomes)]atomic.Uint64 // last row: ops not listed
	moves     [len(moveCauses)]atomic.Uint64

	moveDuration prometheus.Histogram

	mu         sync.Mutex
	moveStarts map[string]time.Time // group -> when this handler wrote its move's first record
	moving     atomic.Int64         // len(moveStarts): a bind need not take mu when it is 0

	descActive, descDecisions, descDropped, descBusy, descMoves *prometheus.Desc
	descBound, descLimit, descLimitRefused                      *prometheus.Desc
}

// NewMetrics returns metrics for one handler.
func NewMetrics() *Metrics {
	return &Metrics{
		moveDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "grouprouter_move_duration_seconds",
			Help: "Time from the record that starts moving a group (operator move or unbind, evacuation, rebind) " +
				"to the record that ends the move (settled on the new node, or released), as seen by the handler that wrote both.",
			// From a fraction of a second (nothing waiting) to minutes (a
			// large takeover behind others).
			Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300},
		}),
		moveStarts: map[string]time.Time{},
		descActive: prometheus.NewDesc("grouprouter_handler_active",
			"1 while this node's LOCAL handler holds the lease and answers proposals, 0 while it stands by.", nil, nil),
		descDecisions: prometheus.NewDesc("grouprouter_decisions_total",
			"Changes of group records decided by this node's LOCAL handler, by op and outcome.", []string{"op", "outcome"}, nil),
		descDropped: prometheus.NewDesc("grouprouter_handler_requests_dropped_total",
			"Requests to the handler dropped unanswered because their reply subject is not an inbox.", nil, nil),
		descBusy: prometheus.NewDesc("grouprouter_handler_requests_busy_total",
			"Requests to the handler refused at once because every worker was busy (the asker retries).", nil, nil),
		descBound: prometheus.NewDesc("grouprouter_handler_groups_bound",
			"Groups bound or being moved, as this node's LOCAL handler's cache holds them: what the group limit counts.", nil, nil),
		descLimit: prometheus.NewDesc("grouprouter_handler_group_limit",
			"The group limit (--max-groups; 0: none): past it, new groups are refused and dead-lettered.", nil, nil),
		descLimitRefused: prometheus.NewDesc("grouprouter_handler_groups_refused_total",
			"Binds this node's LOCAL handler refused because the group limit was reached (their messages are dead-lettered).", nil, nil),
		descMoves: prometheus.NewDesc("grouprouter_moves_total",
			"Records written by this node's handler that move groups off a node, by cause.", []string{"cause"}, nil),
	}
}

func opIndex(op Op) int {
	for i, o := range metricOps {
		if o == op {
			return i
		}
	}
	return len(metricOps)
}

// decided counts one decision.
func (m *Metrics) decided(op Op, o Outcome) {
	for j, mo := range metricOutcomes {
		if mo == o {
			m.decisions[opIndex(op)][j].Add(1)
			return
		}
	}
}

// written takes a record the handler stored at now: the start of a move
// (cause != ""), or a record that ends one (settled, or released).
func (m *Metrics) written(group, cause string, b kvbinding.Binding, now time.Time) {
	if cause != "" {
		for i, c := range moveCauses {
			if c == cause {
				m.moves[i].Add(1)
			}
		}
	}
	ends := b.State == kvbinding.StateReleased || b.Settled()
	if cause == "" && (!ends || m.moving.Load() == 0) {
		return // nearly every record: a new binding, with no move in progress
	}
	m.mu.Lock()
	start, moving := m.moveStarts[group]
	if cause != "" && !moving {
		// A move redirected (its new node went away, or the old one did
		// not fence) keeps the time of its first record.
		start, moving = now, true
		m.moveStarts[group] = now
	}
	if ends && moving {
		delete(m.moveStarts, group)
	}
	m.moving.Store(int64(len(m.moveStarts)))
	m.mu.Unlock()
	if ends && moving {
		m.moveDuration.Observe(now.Sub(start).Seconds())
	}
}

// prune forgets moves started before the given time whose group is not
// moving any more (its record changed by another way, or by another
// handler): unsettled is the cache's view taken at that time.
func (m *Metrics) prune(unsettled map[string]kvbinding.Binding, before time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for g, start := range m.moveStarts {
		if _, ok := unsettled[g]; !ok && start.Before(before) {
			delete(m.moveStarts, g)
		}
	}
	m.moving.Store(int64(len(m.moveStarts)))
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.descActive
	ch <- m.descDecisions
	ch <- m.descDropped
	ch <- m.descBusy
	ch <- m.descMoves
	ch <- m.descBound
	ch <- m.descLimit
	ch <- m.descLimitRefused
	m.moveDuration.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	h := m.h.Load()
	if h == nil {
		return
	}
	active := 0.0
	if h.Active() {
		active = 1
	}
	ch <- prometheus.MustNewConstMetric(m.descActive, prometheus.GaugeValue, active)
	for i, op := range metricOps {
		for j, o := range metricOutcomes {
			ch <- prometheus.MustNewConstMetric(m.descDecisions, prometheus.CounterValue,
				float64(m.decisions[i][j].Load()), string(op), string(o))
		}
	}
	for j, o := range metricOutcomes {
		if n := m.decisions[len(metricOps)][j].Load(); n > 0 {
			ch <- prometheus.MustNewConstMetric(m.descDecisions, prometheus.CounterValue, float64(n), "other", string(o))
		}
	}
	ch <- prometheus.MustNewConstMetric(m.descDropped, prometheus.CounterValue, float64(h.dropped.Load()))
	ch <- prometheus.MustNewConstMetric(m.descBusy, prometheus.CounterValue, float64(h.busy.Load()))
	for i, cause := range moveCauses {
		ch <- prometheus.MustNewConstMetric(m.descMoves, prometheus.CounterValue, float64(m.moves[i].Load()), cause)
	}
	if h.cache != nil {
		ch <- prometheus.MustNewConstMetric(m.descBound, prometheus.GaugeValue, float64(h.cache.Bound()))
	}
	ch <- prometheus.MustNewConstMetric(m.descLimit, prometheus.GaugeValue, float64(max(h.cfg.MaxGroups, 0)))
	ch <- prometheus.MustNewConstMetric(m.descLimitRefused, prometheus.CounterValue, float64(h.limitRefused.Load()))
	m.moveDuration.Collect(ch)
}
