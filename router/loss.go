package router

import (
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/proposals"
)

// Ingress messages a node never read because they were gone: sequences
// missing from the ingress stream between two it read, or between its
// checkpoint and the first it read after a start. They expired (max age,
// 24 h) before the node got to them, were removed (an operator, a purge),
// or a server lost them (a store that lost acknowledged writes: see the
// servers' fsync policy in docs/operations.md). The node cannot route
// what it never saw; it reads over the gap and says so: counted
// (Stats.IngressGaps, Stats.IngressMissing and their metrics), logged at
// error and announced as a "gap" event, both at most once per
// gapReportEvery with the gaps in between summed.

// gapReportEvery is the least time between two reports of ingress gaps.
const gapReportEvery = 10 * time.Second

// gapReport sums the gaps seen since the last report.
type gapReport struct {
	gaps        int
	missing     uint64
	first, last uint64 // lowest and highest missing sequence
}

// add adds the gap of sequences from through to.
func (g *gapReport) add(from, to uint64) {
	if g.gaps == 0 || from < g.first {
		g.first = from
	}
	g.last = max(g.last, to)
	g.gaps++
	g.missing += to - from + 1
}

// gapLimiter decides when gaps are reported: the first after a quiet
// spell at once, the later ones summed, at most once per every. It does no
// I/O; time is an argument.
type gapLimiter struct {
	every   time.Duration
	last    time.Time // of the last report (zero: none yet)
	pending gapReport
}

// note records the gap of sequences from through to, seen at now, and
// returns what to report now, if anything.
func (l *gapLimiter) note(from, to uint64, now time.Time) (gapReport, bool) {
	l.pending.add(from, to)
	return l.due(now)
}

// due returns the pending report if one is waiting and its time has come.
func (l *gapLimiter) due(now time.Time) (gapReport, bool) {
	if l.pending.gaps == 0 || (!l.last.IsZero() && now.Sub(l.last) < l.every) {
		return gapReport{}, false
	}
	return l.flush(now)
}

// flush returns the pending report whatever the time (at a stop).
func (l *gapLimiter) flush(now time.Time) (gapReport, bool) {
	if l.pending.gaps == 0 {
		return gapReport{}, false
	}
	rep := l.pending
	l.pending = gapReport{}
	l.last = now
	return rep, true
}

// wait is how long until the pending report is due (0: none is pending).
func (l *gapLimiter) wait(now time.Time) time.Duration {
	if l.pending.gaps == 0 {
		return 0
	}
	return max(l.every-now.Sub(l.last), time.Nanosecond)
}

// missedRange returns the sequences a delivery of seq skips when next was
// expected and sequences below from are not the node's to miss: none
// (ok false) unless seq is past both.
func missedRange(next, from, seq uint64) (lo, hi uint64, ok bool) {
	lo = max(next, from)
	if seq <= lo {
		return 0, 0, false
	}
	return lo, seq - 1, true
}

// ingressLoss counts, logs and announces a node's ingress gaps. The
// counters are read by Stats and the metrics; note is called by the
// reader's goroutine, the timer's report by its own; close stops the timer
// and reports what is pending.
type ingressLoss struct {
	gaps, missing atomic.Uint64

	mu     sync.Mutex
	lim    gapLimiter
	timer  *time.Timer
	closed bool
	log    *slog.Logger
	nc     *nats.Conn
	node   string
}

// note records that the sequences from through to are gone.
func (l *ingressLoss) note(from, to uint64) {
	l.gaps.Add(1)
	l.missing.Add(to - from + 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if rep, ok := l.lim.note(from, to, now); ok {
		l.report(rep)
		return
	}
	if l.timer == nil && !l.closed {
		l.timer = time.AfterFunc(l.lim.wait(now), l.onTimer)
	}
}

func (l *ingressLoss) onTimer() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.timer = nil
	if rep, ok := l.lim.flush(time.Now()); ok && !l.closed {
		l.report(rep)
	}
}

// close stops the timer and reports the gaps not reported yet.
func (l *ingressLoss) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	if rep, ok := l.lim.flush(time.Now()); ok {
		l.report(rep)
	}
}

// report logs and announces rep (l.mu held).
func (l *ingressLoss) report(rep gapReport) {
	l.log.Error("ingress messages gone before this node read them: not routed by it (expired by max age, removed, or lost by a server)",
		"from_seq", rep.first, "to_seq", rep.last, "missing", rep.missing, "gaps", rep.gaps,
		"missing_total", l.missing.Load(), "gaps_total", l.gaps.Load())
	reason := "ingress sequences " + strconv.FormatUint(rep.first, 10) + "-" + strconv.FormatUint(rep.last, 10) +
		" missing (" + strconv.Itoa(rep.gaps) + " gaps): expired, removed, or lost by a server"
	proposals.Event{Kind: proposals.EventIngressGap, Node: l.node, By: l.node, FromSeq: rep.first,
		Count: int(min(rep.missing, 1<<31-1)), Reason: reason}.Publish(l.nc)
}
