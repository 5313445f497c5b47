package router

import (
	"log/slog"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// The drain's decisions, with no I/O and no clock: which of a moving
// group's messages on the old queues its new node may move now, which it
// must leave to the old queue's consumer, and when the wait for that
// consumer ends. The hand-over shell (handover.go) decides with these
// functions, in production and in the simulation, which runs it.
//
// A message the old consumer was delivered belongs to that consumer until
// it acks it: moving it earlier gives two consumers the group at once, and
// the old one then processes it a second time (seen: 40 ms a message,
// default prefetch, a move: 195 of 600 processed twice). So the new node
// moves the group's messages only once none of them is delivered and
// unacked on an old queue whose consumer is alive and acknowledging. A
// consumer is taken as gone once it has made no progress (no ack, as
// JetStream reports it) for its ack wait: what it holds would be delivered
// again by then anyway, so it is moved (at-least-once; the epoch tells the
// copies apart). The old queues' consumers are paused while their records
// say they are drained, so "not delivered yet" stays true while the drain
// looks.

// consumerView is what a drain knows of an old queue's consumer.
type consumerView struct {
	// exists is false when the queue has no consumer: nothing on it was
	// delivered to anyone.
	exists bool
	// delivered is the last stream sequence delivered (Delivered.Stream):
	// a message after it was not delivered; one at or before it and still
	// on the queue was delivered and is not acked.
	delivered uint64
	// ackFloor is the stream sequence at or below which every message is
	// acked (AckFloor.Stream).
	ackFloor uint64
	// pending is how many messages are delivered and not acked
	// (NumAckPending).
	pending int
	// ackWait is the consumer's ack wait.
	ackWait time.Duration
	// progress is when the drain last saw the consumer make progress (its
	// ack floor or its pending count moved), or when it began watching it.
	progress time.Time
	// quiet: its last delivered sequence did not move between the last two
	// readings, or the last reading found the pause in effect (paused): on
	// a replicated consumer a pause applies a little after the call
	// returns; once it does, what is past delivered stays undelivered.
	quiet bool
	// paused: the reading found the consumer paused: its leader answered
	// with the pause applied (it delivers nothing while it is, and
	// delivered is read under the same lock as its deliveries), for
	// pauseLeft more.
	paused    bool
	pauseLeft time.Duration
	// unsure: until when what its previous leader delivered may be unknown
	// to it (zero: no leader change within its ack wait). A replicated
	// consumer's leader delivers before its replicas learn of it: one that
	// crashed, or was cut off with its clients on the losing side of a
	// partition (it delivers there until it steps down), delivered
	// messages its successor takes for never delivered. Until its ack wait
	// has passed since the election, such a message may be in a live
	// consumer's hands; after it, JetStream would deliver it again anyway.
	unsure time.Time
}

// observe returns the view after a new reading of the consumer, taken at
// now: progress moves when the consumer acked anything since the last
// reading (its ack floor or its pending count changed). The first reading
// (v.progress zero) starts the clock. The consumer is quiet when its
// delivered sequence held still since the previous reading, or when this
// reading found it paused (no second reading needed).
func (v consumerView) observe(read consumerView, now time.Time) consumerView {
	read.progress = v.progress
	if v.progress.IsZero() || read.ackFloor != v.ackFloor || read.pending != v.pending || read.exists != v.exists {
		read.progress = now
	}
	read.quiet = (read.exists && read.paused) || (!v.progress.IsZero() && read.exists == v.exists && read.delivered == v.delivered)
	return read
}

// logAttr is the reading of node's consumer as a log attribute group.
func (v consumerView) logAttr(node string, now time.Time) slog.Attr {
	return slog.Group("consumer_"+node, "exists", v.exists, "delivered", v.delivered, "ack_floor", v.ackFloor, "pending", v.pending,
		"paused", v.paused, "pause_left", v.pauseLeft, "quiet", v.quiet, "unsure_for", max(0, v.unsure.Sub(now)).Round(time.Millisecond),
		"no_progress_for", now.Sub(v.progress).Round(time.Millisecond))
}

// doubtful reports whether what the consumer reports undelivered may have
// been delivered by its previous leader (see unsure).
func (v consumerView) doubtful(now time.Time) bool { return now.Before(v.unsure) }

// stalled reports whether the consumer has made no progress for its ack
// wait: what it was delivered and has not acked is taken as lapsed.
func (v consumerView) stalled(now time.Time) bool {
	return v.exists && v.ackWait > 0 && now.Sub(v.progress) >= v.ackWait
}

// drainMsg is one of a group's messages found on an old queue.
type drainMsg struct {
	node       string // the old queue's node
	seq        uint64 // its stream sequence in the queue stream
	ingressSeq uint64
	// gone: the message is no longer on the queue (acked meanwhile).
	gone bool
	// held: it waits on the old node's held subject (fairshare.go),
	// which no consumer reads: never delivered.
	held bool
	// lapsed: planDrain moves it although its old consumer was delivered
	// it (fateLapsed).
	lapsed bool
	// ref is the caller's index of the message.
	ref int
}

// Fate of a group's message on an old queue, as planDrain sees it.
type drainFate uint8

const (
	// fateMove: not delivered to the old consumer (or the consumer is
	// gone, or stalled past its ack wait): the new node moves it.
	fateMove drainFate = iota + 1
	// fateAwait: delivered to a live old consumer and not acked: the
	// group waits for it.
	fateAwait
	// fateDone: acked by the old consumer: nothing to move.
	fateDone
	// fateLapsed: delivered, not acked, and the consumer made no progress
	// for its ack wait: moved (the old consumer may still process it).
	fateLapsed
)

// fateOf decides what becomes of one message, given its queue's consumer.
func fateOf(m drainMsg, v consumerView, now time.Time) drainFate {
	switch {
	case m.gone:
		return fateDone
	case m.held, !v.exists:
		return fateMove
	case m.seq <= v.ackFloor:
		return fateDone
	case m.seq > v.delivered && v.quiet && !v.doubtful(now):
		return fateMove
	case m.seq > v.delivered:
		// Not delivered as far as the last reading says, but deliveries
		// may not have stopped yet: look again.
		return fateAwait
	case v.stalled(now):
		return fateLapsed
	}
	return fateAwait
}

// drainPlan is what planDrain decides for one group.
type drainPlan struct {
	// ready: nothing of the group is awaited: move Move now.
	ready bool
	// move: the messages to move, in the order given (ingress order).
	move []drainMsg
	// awaited counts the messages delivered to a live old consumer and
	// not acked; lapsed those moved although delivered (at-least-once).
	awaited, lapsed int
}

// planDrain decides, for one group's messages on the old queues (msgs, in
// ingress order), whether the group can be moved now and what to move.
// The group waits while any of its messages is delivered and unacked on a
// queue whose consumer is alive and acknowledging: moving the later ones
// first would hand the group to the new node's consumer while the old one
// still works on it.
func planDrain(msgs []drainMsg, views map[string]consumerView, now time.Time) drainPlan {
	var p drainPlan
	for _, m := range msgs {
		switch fateOf(m, views[m.node], now) {
		case fateAwait:
			p.awaited++
		case fateLapsed:
			p.lapsed++
			m.lapsed = true
			p.move = append(p.move, m)
		case fateMove:
			p.move = append(p.move, m)
		}
	}
	p.ready = p.awaited == 0
	if !p.ready {
		p.move, p.lapsed = nil, 0
	}
	return p
}

// catchUpSpan returns the ingress sequences [from, until) a catch-up
// routes for a group taken over under route: from the record's FromSeq up
// to where the node's lane takes over (laneFrom), starting after what is
// known to be routed already: the last message the drain found on another
// queue (movedThrough), what an earlier taker caught up (route.Routed, from
// its checkpoint), what this node caught up before (caught). from >= until
// means nothing is left to catch up.
func catchUpSpan(route kvbinding.Binding, laneFrom, movedThrough, caught uint64) (from, until uint64) {
	from, until = route.FromSeq, laneFrom
	for _, t := range []uint64{movedThrough, route.Routed, caught} {
		if t >= from {
			from = t + 1
		}
	}
	return from, until
}
