package router

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// Progress of a takeover step. A step that moves or routes many messages
// (a node's groups after its loss, a group with a long backlog) takes
// seconds to minutes; while it runs, the node publishes progress events
// (proposals.EventProgress: messages done of those found, groups, step)
// every progressInterval, and after every progressEvery messages at most
// every progressMinGap, plus one when such a step ends.
// The periodic ones are also logged at info level. 'grouprouter move
// --wait' follows them.
const (
	progressInterval = time.Second
	progressEvery    = 100
	progressMinGap   = 100 * time.Millisecond
)

// stepProgress counts one batch's step as it runs. Its counting methods
// are safe for concurrent use and do nothing on a nil *stepProgress (the
// steps run without one in unit tests).
type stepProgress struct {
	h      *handOver
	step   kvbinding.Step
	groups int
	group  string // the group, when the batch has one
	prev   string // its previous node
	start  time.Time

	done  atomic.Int64
	total atomic.Int64

	mu       sync.Mutex
	lastSent time.Time
	lastDone int64 // done when the last event was sent
	sent     int   // events sent

	stop chan struct{}
	wg   sync.WaitGroup
}

type progressKey struct{}

// startProgress starts counting a batch's step and returns ctx carrying the
// counter for drainQueues, moveGroup and catchUp (progressOf). The caller
// calls end once the step returned.
func (h *handOver) startProgress(ctx context.Context, duty proposals.Duty, routes map[string]kvbinding.Binding) (context.Context, *stepProgress) {
	p := &stepProgress{h: h, step: kvbinding.StepCatchUp, groups: len(routes), start: h.clock.Now(), stop: make(chan struct{})}
	if duty == proposals.DutyDrain {
		p.step = kvbinding.StepDrain
	}
	if len(routes) == 1 {
		for g, route := range routes {
			p.group, p.prev = g, route.PrevNode
		}
	}
	if h.nc != nil { // nothing to send events on (the simulation's shells)
		p.wg.Add(1)
		go p.tick()
	}
	return context.WithValue(ctx, progressKey{}, p), p
}

// progressOf returns the step counter ctx carries, or nil.
func progressOf(ctx context.Context) *stepProgress {
	p, _ := ctx.Value(progressKey{}).(*stepProgress)
	return p
}

// found records how many messages the step has to move or route.
func (p *stepProgress) found(n int) {
	if p == nil {
		return
	}
	p.total.Store(int64(n))
}

// add counts n more messages moved or routed.
func (p *stepProgress) add(n int) {
	if p == nil {
		return
	}
	d := p.done.Add(int64(n))
	p.mu.Lock()
	defer p.mu.Unlock()
	if d-p.lastDone >= progressEvery && since(p.h.clock, p.lastSent) >= progressMinGap {
		p.sendLocked("", false)
	}
}

// tick sends a progress event every progressInterval until end.
func (p *stepProgress) tick() {
	defer p.wg.Done()
	t := p.h.clock.NewTimer(progressInterval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C():
			t.Reset(progressInterval)
			p.mu.Lock()
			p.sendLocked("", true)
			p.mu.Unlock()
		}
	}
}

// end stops the counter and, when the step was long enough to report its
// progress, sends its last event: "done", or why it stopped (err). A
// short step (under progressEvery messages and progressInterval) sends
// nothing: its record's next revision and the handoff event tell all.
func (p *stepProgress) end(err error) {
	if p == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sent == 0 {
		return
	}
	reason := "done"
	if err != nil {
		reason = "stopped: " + err.Error()
	}
	p.sendLocked(reason, false)
}

// sendLocked publishes the progress so far (and logs it when log is set).
// p.mu is held.
func (p *stepProgress) sendLocked(reason string, log bool) {
	done, total := p.done.Load(), p.total.Load()
	p.lastSent, p.lastDone = p.h.clock.Now(), done
	p.sent++
	if p.h.nc != nil {
		proposals.Event{Kind: proposals.EventProgress, Group: p.group, Node: p.h.node, PrevNode: p.prev, By: p.h.node,
			Step: string(p.step), Count: int(done), Total: int(total), Groups: p.groups, Reason: reason}.Publish(p.h.nc)
	}
	if log {
		p.h.log.Info("hand-over step in progress", "step", p.step, "groups", p.groups, "messages", done, "found", total,
			"took", since(p.h.clock, p.start).Round(time.Millisecond))
	}
}

// countFound counts the messages of a step's groups.
func countFound[T any](byGroup map[string][]T) int {
	n := 0
	for _, l := range byGroup {
		n += len(l)
	}
	return n
}
