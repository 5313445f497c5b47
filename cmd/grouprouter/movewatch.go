package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// followProgress subscribes to the nodes' progress events and returns
// them on a channel, and a function that ends the subscription. An event
// that finds the channel full is dropped (a later one says more), and a
// subscription that fails leaves the channel empty: the group's record
// still tells when the hand-over is done.
func followProgress(nc *nats.Conn) (<-chan proposals.Event, func()) {
	ch := make(chan proposals.Event, 64)
	sub, err := nc.Subscribe(proposals.SubjectEventsPrefix+proposals.EventProgress, func(m *nats.Msg) {
		var e proposals.Event
		if json.Unmarshal(m.Data, &e) != nil {
			return
		}
		select {
		case ch <- e:
		default:
		}
	})
	if err != nil {
		return ch, func() {}
	}
	return ch, func() { _ = sub.Unsubscribe() }
}

// Stages of a hand-over as move --wait shows them, in order.
const (
	stageMoving = iota + 1
	stageDrain
	stageCatchUp
)

// moveWatch turns what move --wait sees, the group's record and the new
// node's progress events, into progress lines: the step (moving, drain,
// catchup, settled) and the messages moved off the old queues and routed
// from the ingress so far. Not safe for concurrent use.
type moveWatch struct {
	o       moveOptions
	written kvbinding.Binding // the record the handler wrote
	start   time.Time
	line    *progressLine
	cur     kvbinding.Binding          // the record as last read
	drain   []string                   // the queues of the drain step, once read
	steps   map[string]proposals.Event // the last progress event of each step
}

// record shows the group's record as read now.
func (w *moveWatch) record(b kvbinding.Binding) {
	w.cur = b
	if b.Phase() == kvbinding.PhaseDraining {
		w.drain = b.Drain
	}
	w.render()
}

// event takes a progress event in, if it is about this hand-over: from
// the target node, about the group or a batch of groups (the group may be
// one of them).
func (w *moveWatch) event(e proposals.Event) {
	if w.o.node == "" || e.Node != w.o.node || (e.Group != w.o.group && (e.Group != "" || e.Groups <= 1)) {
		return
	}
	if w.steps == nil {
		w.steps = map[string]proposals.Event{}
	}
	w.steps[e.Step] = e
	w.render()
}

// drainEvents takes in the events already received.
func (w *moveWatch) drainEvents(events <-chan proposals.Event) {
	for {
		select {
		case e := <-events:
			w.event(e)
		default:
			return
		}
	}
}

func (w *moveWatch) render() {
	if s := w.describe(); s != "" {
		w.line.show(w.o.what() + ": " + s)
	}
}

// stage is how far the hand-over is: what the record says, or further
// when a progress event says so (events arrive before the next read).
func (w *moveWatch) stage() int {
	st := 0
	switch w.cur.Phase() {
	case kvbinding.PhaseMoving:
		st = stageMoving
	case kvbinding.PhaseDraining:
		st = stageDrain
	case kvbinding.PhaseCatchingUp:
		st = stageCatchUp
	}
	if _, ok := w.steps[string(kvbinding.StepDrain)]; ok && st < stageDrain {
		st = stageDrain
	}
	if _, ok := w.steps[string(kvbinding.StepCatchUp)]; ok && st < stageCatchUp {
		st = stageCatchUp
	}
	return st
}

// describe says in one line where the hand-over is ("" when the record
// shows none in progress).
func (w *moveWatch) describe() string {
	from := w.cur.PrevNode
	if from == "" {
		from = w.written.PrevNode
	}
	switch w.stage() {
	case stageMoving:
		if w.cur.Node == "" {
			return fmt.Sprintf("moving: %s routes what it has of the group, then releases it", from)
		}
		return fmt.Sprintf("moving: %s stops routing the group and hands it over to %s", from, w.cur.Node)
	case stageDrain:
		drain := w.drain
		if len(drain) == 0 {
			drain = []string{from}
		}
		return fmt.Sprintf("drain: %s moves the group's waiting messages off %s%s", w.o.node, queuesOf(drain), w.counts(kvbinding.StepDrain, "moved"))
	case stageCatchUp:
		return fmt.Sprintf("catchup: %s routes from the ingress what it skipped%s", w.o.node, w.counts(kvbinding.StepCatchUp, "routed"))
	}
	return ""
}

// counts says how many messages a step has done of those it found, from
// its last progress event ("" without one).
func (w *moveWatch) counts(step kvbinding.Step, verb string) string {
	e, ok := w.steps[string(step)]
	if !ok {
		return ""
	}
	s := fmt.Sprintf(": %d messages %s", e.Count, verb)
	if e.Total > 0 {
		s = fmt.Sprintf(": %d of %d messages %s", e.Count, e.Total, verb)
	}
	if e.Groups > 1 {
		s += fmt.Sprintf(" (in a batch of %d groups)", e.Groups)
	}
	if strings.HasPrefix(e.Reason, "stopped") {
		s += "; " + e.Reason + ", to be taken again"
	}
	return s
}

// settled shows the last line: the operation is done, how long it took,
// and what the long steps moved and routed.
func (w *moveWatch) settled(b kvbinding.Binding) {
	took := time.Since(w.start).Round(time.Millisecond)
	var s string
	switch {
	case w.o.op == opMove:
		s = fmt.Sprintf("settled: bound to %s after %v", b.Node, took)
		var done []string
		if e, ok := w.steps[string(kvbinding.StepDrain)]; ok {
			done = append(done, fmt.Sprintf("%d messages moved off %s", e.Count, queuesOf(w.drainedFrom())))
		}
		if e, ok := w.steps[string(kvbinding.StepCatchUp)]; ok {
			done = append(done, fmt.Sprintf("%d routed from the ingress", e.Count))
		}
		if len(done) > 0 {
			s += "; " + strings.Join(done, ", ")
		}
	case b.Phase() == kvbinding.PhaseNone || b.Phase() == kvbinding.PhaseReleased:
		s = fmt.Sprintf("released after %v", took)
	default:
		s = fmt.Sprintf("released after %v, and bound again since", took)
	}
	w.line.finish(w.o.what() + ": " + s)
}

// drainedFrom names the queues the drain moved messages off.
func (w *moveWatch) drainedFrom() []string {
	if len(w.drain) > 0 {
		return w.drain
	}
	return []string{w.written.PrevNode}
}

// queuesOf names node queues: "n1's queue", "the queues of n1 and n2".
func queuesOf(nodes []string) string {
	switch len(nodes) {
	case 0:
		return "the old queues"
	case 1:
		return nodes[0] + "'s queue"
	}
	return "the queues of " + strings.Join(nodes[:len(nodes)-1], ", ") + " and " + nodes[len(nodes)-1]
}
