package ops

import (
	"fmt"
	"html/template"
	"sync"
	"time"

	"github.com/grouprouter/grouprouter/router"
)

// view is what the status page shows and /status.json returns.
type view struct {
	At            time.Time `json:"at"`
	Node          string    `json:"node"`
	Type          string    `json:"type"`
	Handler       string    `json:"handler"`
	Ready         bool      `json:"ready"`
	NotReady      string    `json:"not_ready,omitempty"`
	HandlerActive bool      `json:"handler_active"`
	// ActiveHandler is the handler lease's holder, name/node.
	ActiveHandler string `json:"active_handler,omitempty"`
	// IngressLast is the ingress stream's last sequence (0: unknown).
	IngressLast    uint64 `json:"ingress_last"`
	BindingRecords int    `json:"binding_records"`
	Unsettled      int    `json:"groups_unsettled"`
	HeldMessages   int    `json:"held_messages"`
	HeldBytes      int64  `json:"held_bytes"`
	// Counters are this node's, since it started.
	Counters counters `json:"counters"`
	// Rates are per second over the last few seconds of status requests
	// (absent until two requests a second or more apart).
	Rates *rates   `json:"rates,omitempty"`
	Nodes []nodeV  `json:"nodes"`
	Moves []eventV `json:"moves"`
	// Events are the latest events of every kind, newest first; Moves
	// those of kinds move, handoff and unbind. Following says whether the
	// events stream is being read now.
	Events []eventV `json:"events"`
	// Steps are the latest progress events of the hand-over steps (a
	// node draining or catching up groups it took over), one per step,
	// newest first.
	Steps []eventV `json:"steps"`
	// Parked are the groups parked by their consumers (package consumer),
	// the first of them by id; nil when the node has no NATS connection
	// to read them with.
	Parked    *parkedList `json:"parked,omitempty"`
	Following bool        `json:"events_following"`
	// EventsLoaded: the follower has read the events stored when it
	// started, so an empty list means none.
	EventsLoaded bool `json:"events_loaded"`
	// History is what the charts draw: a sample every HistoryEvery over
	// the last HistorySpan; Charts the same drawn as SVG, for the page.
	History chartsJSON      `json:"history"`
	Charts  []template.HTML `json:"-"`
}

type counters struct {
	Routed           uint64 `json:"routed"`
	Skipped          uint64 `json:"skipped"`
	DeadLettered     uint64 `json:"dead_lettered"`
	DecisionFailures uint64 `json:"decision_failures"`
	PublishErrors    uint64 `json:"publish_errors"`
	Proposals        uint64 `json:"proposals"`
}

// rates are per second.
type rates struct {
	Window           float64 `json:"window_seconds"`
	Ingress          float64 `json:"ingress"`
	Routed           float64 `json:"routed"`
	Skipped          float64 `json:"skipped"`
	DeadLettered     float64 `json:"dead_lettered"`
	DecisionFailures float64 `json:"decision_failures"`
}

// nodeV is one node's row.
type nodeV struct {
	Node         string   `json:"node"`
	Live         bool     `json:"live"`
	Type         string   `json:"type,omitempty"`
	Role         string   `json:"handler,omitempty"`
	HasConsumer  bool     `json:"has_consumer"`
	Groups       int      `json:"groups"`
	Position     uint64   `json:"position,omitempty"`
	Lag          uint64   `json:"lag"`
	Held         int      `json:"held"`
	Waiting      int      `json:"waiting_groups"`
	Routed       uint64   `json:"routed"`
	RoutedRate   *float64 `json:"routed_per_second,omitempty"`
	QueuePending uint64   `json:"queue_pending"`
	QueueUnacked uint64   `json:"queue_unacked"`
	// HeldBack: messages of groups held back for their share of the
	// node's queue window, HeldBackGroups: how many groups.
	HeldBack       int `json:"held_back"`
	HeldBackGroups int `json:"held_back_groups"`
	// HeartbeatAge is the age of its last announcement, in seconds.
	HeartbeatAge float64 `json:"heartbeat_age_seconds,omitempty"`
	Self         bool    `json:"self,omitempty"`
}

// build turns a status snapshot into the page's view, sampling the
// counters for the rates.
func (s *Server) build(st router.Status) view {
	v := view{
		At: st.At, Node: st.Node, Type: string(st.Type), Handler: st.Handler,
		Ready: st.NotReady == "", NotReady: st.NotReady, HandlerActive: st.HandlerActive, ActiveHandler: st.ActiveHandler,
		IngressLast: st.IngressLast, BindingRecords: st.Records, Unsettled: st.Unsettled,
		HeldMessages: st.Stats.Held, HeldBytes: st.Stats.HeldBytes,
		Counters: counters{
			Routed: st.Stats.Routed, Skipped: st.Stats.Skipped, DeadLettered: st.Stats.DeadLettered,
			DecisionFailures: st.Stats.DecisionErrors, PublishErrors: st.Stats.PublishErrors, Proposals: st.Stats.Proposals,
		},
		Nodes: []nodeV{},
	}
	r, nodeRates, ok := s.rates.observe(rateSampleOf(st))
	if ok {
		v.Rates = &r
	}
	for _, n := range st.Nodes {
		row := nodeV{Node: n.Node, Live: n.Live, Type: n.Type, Role: n.Role, HasConsumer: n.HasConsumer, Groups: n.Groups,
			Position: n.Position, Lag: n.Lag, Held: n.Held, Waiting: n.Waiting, Routed: n.Routed,
			QueuePending: n.QueuePending, QueueUnacked: n.QueueUnacked, HeldBack: n.HeldBack, HeldBackGroups: n.HeldBackGroups,
			Self: n.Node == st.Node}
		if rate, ok := nodeRates[n.Node]; ok {
			row.RoutedRate = &rate
		}
		if n.Live && !n.Heartbeat.IsZero() {
			row.HeartbeatAge = max(st.At.Sub(n.Heartbeat).Seconds(), 0)
		}
		v.Nodes = append(v.Nodes, row)
	}
	v.Events, v.Moves, v.Steps, v.Following, v.EventsLoaded = s.events.latest()
	if s.cfg.Conn == nil {
		v.EventsLoaded = true // no events to read
	}
	charts := s.samples.charts()
	v.History = chartsJSON{EverySeconds: HistoryEvery.Seconds(), Charts: charts}
	v.Charts = renderCharts(charts, HistoryEvery)
	return v
}

// rateSampleOf is the counters of a status snapshot.
func rateSampleOf(st router.Status) sample {
	cur := sample{at: st.At, ingress: st.IngressLast, routed: st.Stats.Routed, skipped: st.Stats.Skipped,
		dead: st.Stats.DeadLettered, failures: st.Stats.DecisionErrors, nodes: map[string]uint64{}}
	for _, n := range st.Nodes {
		if n.Live {
			cur.nodes[n.Node] = n.Routed
		}
	}
	return cur
}

// Rates are computed from the counters seen by status requests and by the
// history's sampler (so the first request has rates): each is a sample; a rate is the increase from the oldest sample of
// the last rateWindow to now. Samples are kept at most one per
// sampleEvery, so a burst of requests costs no memory.
const (
	rateWindow  = 10 * time.Second
	sampleEvery = time.Second
	minRateSpan = time.Second
)

// sample is the counters at one time.
type sample struct {
	at                                       time.Time
	ingress, routed, skipped, dead, failures uint64
	nodes                                    map[string]uint64 // routed, per live node (their announcements)
}

// rateSampler keeps the samples of the last rateWindow.
type rateSampler struct {
	mu      sync.Mutex
	samples []sample
}

// observe takes the current counters and returns the rates since the
// oldest sample of the window (and per node, for the nodes in both), and
// whether there was one at least minRateSpan old.
func (rs *rateSampler) observe(cur sample) (rates, map[string]float64, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	cut := cur.at.Add(-rateWindow)
	i := 0
	for i < len(rs.samples) && rs.samples[i].at.Before(cut) {
		i++
	}
	rs.samples = append(rs.samples[:0], rs.samples[i:]...)
	var (
		out   rates
		nodes map[string]float64
		ok    bool
	)
	if len(rs.samples) > 0 {
		base := rs.samples[0]
		if span := cur.at.Sub(base.at); span >= minRateSpan {
			sec := span.Seconds()
			per := func(now, then uint64) float64 { return float64(increase(now, then)) / sec }
			out = rates{Window: sec, Ingress: per(cur.ingress, base.ingress), Routed: per(cur.routed, base.routed),
				Skipped: per(cur.skipped, base.skipped), DeadLettered: per(cur.dead, base.dead), DecisionFailures: per(cur.failures, base.failures)}
			nodes = map[string]float64{}
			for n, now := range cur.nodes {
				if then, ok := base.nodes[n]; ok {
					nodes[n] = per(now, then)
				}
			}
			ok = true
		}
	}
	if len(rs.samples) == 0 || cur.at.Sub(rs.samples[len(rs.samples)-1].at) >= sampleEvery {
		rs.samples = append(rs.samples, cur)
	}
	return out, nodes, ok
}

// increase is how much a counter grew; a counter lower than before was
// reset (its node restarted) and grew from 0.
func increase(now, then uint64) uint64 {
	if now < then {
		return now
	}
	return now - then
}

// pageFuncs are the status page template's functions.
func pageFuncs() template.FuncMap {
	return template.FuncMap{
		"rate": func(f float64) string { return fmt.Sprintf("%.1f", f) },
		"ratep": func(f *float64) string {
			if f == nil {
				return "–"
			}
			return fmt.Sprintf("%.1f", *f)
		},
		"ago": func(sec float64) string {
			if sec == 0 {
				return "–"
			}
			return fmt.Sprintf("%.1fs ago", sec)
		},
		"bytes": func(n int64) string {
			switch {
			case n >= 1<<20:
				return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
			case n >= 1<<10:
				return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
			}
			return fmt.Sprintf("%d B", n)
		},
		"clock": func(t time.Time) string { return t.UTC().Format("15:04:05.000") },
		"stamp": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") },
		"progress": func(count, total int) string {
			if total == 0 {
				return fmt.Sprintf("%d", count)
			}
			return fmt.Sprintf("%d of %d (%.0f%%)", count, total, 100*float64(count)/float64(total))
		},
		"yesno": func(b bool) string {
			if b {
				return "yes"
			}
			return "no"
		},
	}
}
