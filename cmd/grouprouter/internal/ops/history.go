package ops

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/grouprouter/grouprouter/router"
)

// The status page's charts come from a history of status snapshots: one
// every HistoryEvery, the last HistorySpan of them, in memory (a fixed
// ring: 300 samples of a few numbers per node).
const (
	// HistoryEvery is how often Run samples the node's status.
	HistoryEvery = 2 * time.Second
	// HistorySpan is how far back the charts go.
	HistorySpan = 10 * time.Minute
	// rateSpan is how many sample intervals a rate in the charts spans
	// (the ingress stream's last sequence is read at most every 2 s, so a
	// rate over one interval would jump between 0 and twice the truth).
	rateSpan = 3
)

// nodeSample is one node in a history sample.
type nodeSample struct {
	live         bool
	position     uint64 // the next ingress sequence it reads
	routed       uint64 // since it started
	groups       int
	held         int
	queuePending uint64
	queueUnacked uint64
}

// histSample is the status at one time, as the charts need it.
type histSample struct {
	at          time.Time
	ingressLast uint64 // 0: not known
	unsettled   int
	nodes       map[string]nodeSample
}

// sampleOf takes from a status snapshot what the charts draw.
func sampleOf(st router.Status) histSample {
	s := histSample{at: st.At, unsettled: st.Unsettled, nodes: make(map[string]nodeSample, len(st.Nodes))}
	if st.IngressKnown {
		s.ingressLast = st.IngressLast
	}
	for _, n := range st.Nodes {
		s.nodes[n.Node] = nodeSample{live: n.Live, position: n.Position, routed: n.Routed, groups: n.Groups,
			held: n.Held, queuePending: n.QueuePending, queueUnacked: n.QueueUnacked}
	}
	return s
}

// historyRing keeps the last len(buf) samples. It is not safe for
// concurrent use.
type historyRing struct {
	buf  []histSample
	next int
	n    int
}

func newHistoryRing(capacity int) *historyRing {
	return &historyRing{buf: make([]histSample, max(capacity, 1))}
}

// add keeps s, dropping the oldest sample when full.
func (h *historyRing) add(s histSample) {
	h.buf[h.next] = s
	h.next = (h.next + 1) % len(h.buf)
	h.n = min(h.n+1, len(h.buf))
}

// samples returns the samples kept, oldest first.
func (h *historyRing) samples() []histSample {
	out := make([]histSample, 0, h.n)
	for i := h.n; i >= 1; i-- {
		out = append(out, h.buf[(h.next-i+len(h.buf))%len(h.buf)])
	}
	return out
}

// chartPoint is one value of a series at a time; ok false is a gap (the
// node was gone, or the value unknown). In JSON: [unix milliseconds,
// value or null].
type chartPoint struct {
	at time.Time
	v  float64
	ok bool
}

func (p chartPoint) MarshalJSON() ([]byte, error) {
	b := []byte{'['}
	b = strconv.AppendInt(b, p.at.UnixMilli(), 10)
	b = append(b, ',')
	if p.ok && !math.IsNaN(p.v) && !math.IsInf(p.v, 0) {
		b = strconv.AppendFloat(b, math.Round(p.v*100)/100, 'f', -1, 64)
	} else {
		b = append(b, "null"...)
	}
	return append(b, ']'), nil
}

// chartSeries is one line of a chart.
type chartSeries struct {
	Name   string       `json:"name"`
	Points []chartPoint `json:"points"`
	// color is the index of the line's color: a node keeps its color
	// across the charts.
	color int
}

// chart is one chart of the page.
type chart struct {
	ID     string        `json:"id"`
	Title  string        `json:"title"`
	Unit   string        `json:"unit"`
	Series []chartSeries `json:"series"`
	// Counts: its values are whole counts; its axis labels are too.
	Counts bool `json:"counts,omitempty"`
}

// chartsOf turns the samples (oldest first) into the page's charts:
// ingress rates (stored, and read by each node), routed rates per node,
// groups per node, held and waiting messages, and moves in progress.
// Rates span up to rateSpan sample intervals; a node's rate is a gap where
// it was not live at both ends.
func chartsOf(samples []histSample) []chart {
	var names []string
	for _, s := range samples {
		for n := range s.nodes {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	color := func(node string) int { return 1 + slices.Index(names, node) } // 0 is the cluster-wide lines' color

	rate := func(i int, value func(histSample) (uint64, bool)) chartPoint {
		p := chartPoint{at: samples[i].at}
		j := max(i-rateSpan, 0)
		if j == i {
			return p
		}
		now, ok1 := value(samples[i])
		then, ok2 := value(samples[j])
		sec := samples[i].at.Sub(samples[j].at).Seconds()
		if ok1 && ok2 && sec > 0 {
			p.v, p.ok = float64(increase(now, then))/sec, true
		}
		return p
	}
	nodeValue := func(node string, f func(nodeSample) uint64) func(histSample) (uint64, bool) {
		return func(s histSample) (uint64, bool) {
			n, ok := s.nodes[node]
			return f(n), ok && n.live
		}
	}
	perSample := func(f func(histSample) (float64, bool)) []chartPoint {
		out := make([]chartPoint, len(samples))
		for i, s := range samples {
			v, ok := f(s)
			out[i] = chartPoint{at: s.at, v: v, ok: ok}
		}
		return out
	}

	ingress := chart{ID: "ingress", Title: "Ingress: stored, and read by each node", Unit: "msgs/s"}
	stored := chartSeries{Name: "stored"}
	for i := range samples {
		stored.Points = append(stored.Points, rate(i, storedThrough))
	}
	ingress.Series = append(ingress.Series, stored)
	routed := chart{ID: "routed", Title: "Routed to the queues, by node", Unit: "msgs/s"}
	groups := chart{ID: "groups", Title: "Groups per node", Unit: "groups", Counts: true}
	for _, n := range names {
		read, rt := chartSeries{Name: n, color: color(n)}, chartSeries{Name: n, color: color(n)}
		for i := range samples {
			read.Points = append(read.Points, rate(i, nodeValue(n, func(ns nodeSample) uint64 { return ns.position })))
			rt.Points = append(rt.Points, rate(i, nodeValue(n, func(ns nodeSample) uint64 { return ns.routed })))
		}
		ingress.Series = append(ingress.Series, read)
		routed.Series = append(routed.Series, rt)
		groups.Series = append(groups.Series, chartSeries{Name: n, color: color(n), Points: perSample(func(s histSample) (float64, bool) {
			ns, ok := s.nodes[n]
			return float64(ns.groups), ok
		})})
	}

	backlog := chart{ID: "backlog", Title: "Held by the routers, waiting and unacked on the queues", Unit: "messages", Counts: true}
	backlog.Series = []chartSeries{
		{Name: "held (most any router holds)", color: 0, Points: perSample(func(s histSample) (float64, bool) {
			most, live := 0, false
			for _, n := range s.nodes {
				if n.live {
					most, live = max(most, n.held), true
				}
			}
			return float64(most), live
		})},
		{Name: "waiting on the queues", color: 2, Points: perSample(func(s histSample) (float64, bool) {
			var sum uint64
			for _, n := range s.nodes {
				if n.live {
					sum += n.queuePending
				}
			}
			return float64(sum), len(s.nodes) > 0
		})},
		{Name: "unacked", color: 3, Points: perSample(func(s histSample) (float64, bool) {
			var sum uint64
			for _, n := range s.nodes {
				if n.live {
					sum += n.queueUnacked
				}
			}
			return float64(sum), len(s.nodes) > 0
		})},
	}

	moves := chart{ID: "moves", Title: "Moves and hand-overs in progress", Unit: "groups / nodes", Counts: true}
	moves.Series = []chartSeries{
		{Name: "groups moving or in a hand-over step", color: 0, Points: perSample(func(s histSample) (float64, bool) {
			return float64(s.unsettled), true
		})},
		{Name: "gone nodes with groups", color: 4, Points: perSample(func(s histSample) (float64, bool) {
			gone := 0
			for _, n := range s.nodes {
				if !n.live && n.groups > 0 {
					gone++
				}
			}
			return float64(gone), true
		})},
	}
	return []chart{ingress, routed, groups, backlog, moves}
}

// storedThrough is the ingress stream's last sequence in a sample: the
// last sequence the status read (it reads it at most every 2 s, so it may
// be a sample old) or, when higher, the last one a live node has read (the
// nodes announce their positions every heartbeat).
func storedThrough(s histSample) (uint64, bool) {
	last := s.ingressLast
	for _, n := range s.nodes {
		if n.live && n.position > 0 {
			last = max(last, n.position-1)
		}
	}
	return last, last > 0
}

// history is the Server's sampled history, safe for concurrent use.
type history struct {
	mu   sync.Mutex
	ring *historyRing
}

func newHistory() *history {
	return &history{ring: newHistoryRing(int(HistorySpan / HistoryEvery))}
}

func (h *history) add(s histSample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ring.add(s)
}

// charts returns the charts of the samples kept.
func (h *history) charts() []chart {
	h.mu.Lock()
	samples := h.ring.samples()
	h.mu.Unlock()
	return chartsOf(samples)
}

// sampleHistory adds a status sample every HistoryEvery until ctx ends,
// while the node is ready (before, its status has no nodes to draw).
func (s *Server) sampleHistory(ctx context.Context) {
	t := time.NewTicker(HistoryEvery)
	defer t.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, HistoryEvery)
		st := s.cfg.Node.Status(sctx)
		cancel()
		if st.NotReady == "" {
			s.samples.add(sampleOf(st))
			s.rates.observe(rateSampleOf(st))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// chartsJSON is the charts as /status.json lists them.
type chartsJSON struct {
	EverySeconds float64 `json:"every_seconds"`
	Charts       []chart `json:"charts"`
}

var _ json.Marshaler = chartPoint{}
