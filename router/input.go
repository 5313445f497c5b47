package router

import (
	"fmt"
	"time"

	"github.com/grouprouter/grouprouter/proposals"
)

// The engine's door. Everything a shell brings to the engine is one of the
// input values below, handed to engine.step (by Router.step, which takes
// Router.mu, steps, and carries out the actions the step emitted; the
// ingress reader steps under its own hold of the lock, as it waits there
// for room). The engine's other methods are of two kinds only:
//
//   - pulls, which hand a shell its next work and mark it taken: askBatch
//     (asks to send), fairRead (held messages to release, queue sequences
//     to check), reap (idle groups, and the long ids it needs named), take
//     (the actions emitted);
//   - views, which change nothing: full, position, nextDue, busyGroups,
//     retryingGroups, heldBack, fenced, takeoverFrom, ungroupedDestination
//     and the checkpoint's figures.
//
// The simulation's nodes (simNode.step) and the scripts of testdata/engine
// go through step too; the engine's Go tests call the methods it
// dispatches to directly.
type input interface{ isInput() }

type (
	// inMsg: an ingress message read, of group ("" when it has none
	// usable), in order. m is the engine's from then on: the shell keeps
	// no hold of it.
	inMsg struct {
		group string
		m     *msgRec
	}
	// inOutcomes: publish outcomes, in the order the publisher reported
	// them, each naming its lane and messages by ids (outcome).
	inOutcomes struct{ batch []outcome }
	// inReplied: the handler's answer to a batch of asks (err for the
	// whole request, else a decision per ask), naming them by id.
	inReplied struct {
		batch []sentAsk
		ds    []proposals.Decision
		err   error
	}
	// inAbandon: asks pulled by askBatch that were not sent (the node
	// stops).
	inAbandon struct{ batch []sentAsk }
	// inChanged: binding records changed, by ref.
	inChanged struct{ refs []string }
	// inLive: the live nodes this node counts on, with their consumers.
	inLive struct {
		state map[string]proposals.NodeState
	}
	// inAlive: this node's liveness record is good until until.
	inAlive struct{ until time.Time }
	// inConsumer: whether this node's queue has a consumer.
	inConsumer struct{ has bool }
	// inRetry: a LOCAL handler took over; failed asks are retried now.
	inRetry struct{}
	// inTick: the time came for what was due (nextDue).
	inTick struct{}
	// inReapNamed: the ids of long idle groups reap asked for, by ref.
	inReapNamed struct{ names map[string]string }
	// inHeldFound: at start, the messages found on the node's held
	// subject, count and group by ref.
	inHeldFound struct {
		counts map[string]int
		groups map[string]string
	}
	// inHeldGone: a held group's message at queue sequence seq is
	// consumed.
	inHeldGone struct {
		ref string
		seq uint64
	}
	// inReleased: held messages of ref went onto the queue (queueSeqs);
	// left: some are still held.
	inReleased struct {
		ref       string
		queueSeqs []uint64
		left      bool
	}
	// inDutyDone: the shell gave up a takeover step; the record hands it
	// again.
	inDutyDone struct {
		group string
		rev   uint64
	}
	// inBegin: where the node reads the ingress from, and the routing
	// floor, once at start.
	inBegin struct {
		resume resumePoint
		floor  uint64
	}
	// inStop: the node stops.
	inStop struct{}
)

func (inMsg) isInput()       {}
func (inOutcomes) isInput()  {}
func (inReplied) isInput()   {}
func (inAbandon) isInput()   {}
func (inChanged) isInput()   {}
func (inLive) isInput()      {}
func (inAlive) isInput()     {}
func (inConsumer) isInput()  {}
func (inRetry) isInput()     {}
func (inTick) isInput()      {}
func (inReapNamed) isInput() {}
func (inHeldFound) isInput() {}
func (inHeldGone) isInput()  {}
func (inReleased) isInput()  {}
func (inDutyDone) isInput()  {}
func (inBegin) isInput()     {}
func (inStop) isInput()      {}

// step takes one input at now. Its actions are emitted for take.
func (e *engine) step(in input, now time.Time) {
	switch in := in.(type) {
	case inMsg:
		e.ingest(in.group, in.m, now)
	case inOutcomes:
		for _, o := range in.batch {
			e.outcome(o, now)
		}
	case inReplied:
		e.replied(in.batch, in.ds, in.err, now)
	case inAbandon:
		e.abandon(in.batch)
	case inChanged:
		for _, ref := range in.refs {
			e.changed(ref, now)
		}
	case inLive:
		e.setLive(in.state, now)
	case inAlive:
		e.alive(in.until, now)
	case inConsumer:
		e.consumerPresent(in.has)
	case inRetry:
		e.retryNow(now)
	case inTick:
		e.due(now)
	case inReapNamed:
		e.reapNamed(in.names, now)
	case inHeldFound:
		e.fair.restore(in.counts, func(ref string) string { return in.groups[ref] }, now)
	case inHeldGone:
		e.fair.gone(in.ref, in.seq)
	case inReleased:
		e.fairReleased(in.ref, in.queueSeqs, in.left, now)
	case inDutyDone:
		e.dutyDone(in.group, in.rev)
	case inBegin:
		e.begin(in.resume, in.floor)
	case inStop:
		e.close()
	default:
		panic(fmt.Sprintf("router: the engine takes no input %T", in))
	}
}

// outcome takes one publish outcome, which names what it reports by ids
// (outcome): the engine finds the lane by group (e.lanes holds a long id's
// lane by group too; byRef serves the record changes) and the message by
// its ingress sequence (inFlight); a batch's must be the lane's batch in
// flight, which starts at o.ingress. These are the lane and the message
// the action was emitted for (what the outcome pointed to when it carried
// pointers): a lane stays while it has a publish in flight (pump drops a
// lane only when ln.inflight, which counts each publish until its
// outcome, is 0; and a lane is made only for a group with none); a
// group's messages in flight stay at the front of its lane until their
// outcome pops them (the head; a batch's messages; a lane dead-lettering
// its messages keeps them all until the dead-letter record), and the
// ungrouped lane's among its flights until their outcome takes them. An
// outcome that finds nothing in flight is of no publish the engine asked
// for, which does not happen: it is dropped and counted
// (stats.strayOutcomes; the simulation fails on one).
func (e *engine) outcome(o outcome, now time.Time) {
	ln := e.lanes[o.group]
	if o.batch > 0 {
		if ln == nil || ln.batch != o.batch || ln.msgs[0].seq != o.ingress {
			e.stats.strayOutcomes++
			return
		}
		e.ackedBatch(ln, o.err, o.seq, now)
		return
	}
	m := e.inFlight(ln, o.ingress)
	if m == nil {
		e.stats.strayOutcomes++
		return
	}
	if o.stripped {
		e.stripped(m)
	}
	if o.payload != nil && m.payload == nil {
		m.payload = o.payload // read again by the shell: kept for a retry
	}
	e.acked(ln, m, o.dlq, o.reason, o.err, o.seq, now)
}
