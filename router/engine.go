package router

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// The lane engine is a node's routing logic without I/O and without a
// clock: it takes ingress messages, publish outcomes, record changes,
// replies to its asks and the time, and says what to publish and what to
// ask the handler. The shells around it (reader, publisher, asker,
// hand-over, liveness) do the I/O. It is not safe for concurrent use: the
// Router calls it with Router.mu held.

// records is what the engine reads of the binding records. The engine
// looks records up by ref (kvbinding.Ref: the group id, or the digest ref
// of a long id), which it computes once per lane.
type records interface {
	Lookup(ref string) (kvbinding.Binding, bool)
}

// engineConfig is what the engine needs of the node's configuration.
type engineConfig struct {
	node            string
	maxHeldMessages int
	maxHeldBytes    int64
	maxInFlight     int
	maxAttempts     int
	timeout         time.Duration // proposal timeout: a non-proposer's fallback delay
	localFirst      bool
	groupTimeout    time.Duration
	// maxBatch: a group with a backlog publishes up to this many of its
	// next messages as one atomic batch (below 2: one message at a time);
	// maxBatchBytes bounds a batch's size, maxBatches the batches in
	// flight at once (the servers take 50 per stream).
	maxBatch      int
	maxBatchBytes int
	maxBatches    int
	// spillFrom: once the held messages take this many bytes, a message
	// that waits for a decision keeps only its sequence (spill), and
	// maxSpilledBytes bounds what spilled messages take (0: no spilling).
	// The node keeps reading while a flood of new groups waits for
	// decisions, so that groups bound already keep flowing.
	spillFrom       int64
	maxSpilledBytes int64
	// groupShare: Config.GroupShare (fairshare.go); holds: the queue
	// stream takes the node's held subject (the shell found it so).
	groupShare int
	holds      bool
}

// msgRec is an ingress message held by the router.
type msgRec struct {
	seq     uint64
	subject string // ingress subject
	size    int    // body, subject and headers
	invalid string // why its group id is unusable ("" if fine)
	close   bool   // Group-Seq: -1: the group ends after this message
	// stripped: its dead-letter copy goes without its body and the
	// producer's headers (the servers refused the whole one).
	stripped bool
	// spilled: it waits for a decision and the engine let its body go
	// (spill): payload is nil, and the shell reads the message again from
	// the ingress by sequence before it publishes it. size is then what
	// the engine still keeps of it (spillCost).
	spilled bool
	// target: where its first publish went, and so where every retry
	// goes (a retry deduplicated by its Nats-Msg-Id must not land a copy
	// on the other side): targetQueue or targetHeld; 0 not yet published.
	target uint8
	// payload is the shell's (the message to republish, prepared when
	// first needed).
	payload any
}

// pub returns the copy of m an action carries to the shell that
// publishes it.
func (m *msgRec) pub() pubMsg {
	return pubMsg{seq: m.seq, subject: m.subject, stripped: m.stripped, payload: m.payload}
}

// pubMsg is what a shell needs of a held message to publish it: a copy,
// taken under Router.mu when the engine emits the action, since the shell
// reads it after releasing the lock, while the engine goes on with its
// msgRec. The outcome names the message again by seq (outcome).
type pubMsg struct {
	seq     uint64 // ingress sequence
	subject string // ingress subject
	// payload: msgRec.payload, the shell's message to republish (a
	// *held); nil when the message is spilled (the shell reads it again,
	// fetchSpilled). Copying the interface copies the pointer, which is
	// fine: the engine never reads or writes what it points to (it keeps
	// it, hands it out, drops it when it spills the message, and takes
	// back a body the shell read again); only the shell publishing the
	// message touches it (outMsg prepares it in place), and a message has
	// one publish in flight at a time.
	payload any
	// stripped: its dead-letter copy goes without its body
	// (msgRec.stripped); the shell sets it on its copy too when the
	// ingress no longer holds the message (outcome.stripped).
	stripped bool
}

// msgRec.target values.
const (
	targetQueue uint8 = iota + 1
	targetHeld
)

// lane holds one group's messages that are not done yet, in ingress order.
// For a group, one publish at a time is in flight: the head alone, or the
// first batch messages as one batch (atomic: all stored or none;
// fast-ingest, on R1: a prefix of them when it fails). The lane
// of ungrouped messages (group "") publishes without that limit.
type lane struct {
	group string
	// ref is the group's kvbinding.Ref: the id itself (the same string)
	// but for a long id, whose records the cache knows only by digest.
	ref      string
	msgs     []*msgRec
	inflight int
	// batch: the lane's publish in flight is its first batch messages, as
	// one batch (0: one message, or nothing). singles: after a
	// batch failed, that many of its messages go one at a time (each
	// deduplicated by its own Nats-Msg-Id) before the lane batches again.
	batch   int
	singles int
	waiting bool // the head needs a binding
	ask     *ask // the lane's ask of the handler, if any
	// changing: this node asked for a change of the group's record
	// (fence, release) or is dead-lettering it: nothing moves until the
	// record changes or the ask fails.
	changing      bool
	deadLettering bool
	dlqPending    int // dead-letter publishes in flight
	// epoch is the group's epoch the lane last published under, and
	// epochHdr its header value, shared by the lane's publishes.
	epoch    uint64
	epochHdr []string
	// heldSeq/heldAt: the first message the lane was seen held undecided
	// from by an announcement (heldUndecided), and when.
	heldSeq uint64
	heldAt  int64 // unix nanoseconds
	// fairSince: since when the lane waits, in memory, for room in its
	// group's share of the queue window (zero: it does not); fairTold:
	// a hold event said so; fairTick: the fair round that last saw it
	// wait (fairshare.go).
	fairSince time.Time
	fairTold  bool
	fairTick  uint64
	// fairHead: since when its head waits for room (zero: it does not).
	fairHead time.Time
}

// epochHeader returns the header value of the group's epoch under route,
// reusing the lane's while the epoch stays the same.
func (ln *lane) epochHeader(epoch uint64) []string {
	if ln.epochHdr == nil || ln.epoch != epoch {
		ln.epoch, ln.epochHdr = epoch, []string{strconv.FormatUint(epoch, 10)}
	}
	return ln.epochHdr
}

// ask is one request of the handler for a lane's group.
type ask struct {
	p        proposals.Proposal
	lane     *lane
	attempt  int
	due      time.Time
	inFlight bool
	index    int // in askHeap, -1 when not there
	// after is the record revision the ask was made on (steps): a later
	// revision answers it.
	after uint64
	// waitRev/waitUntil: the reply named a revision not seen yet; the ask
	// fails if it is still not seen by waitUntil.
	waitRev   uint64
	waitUntil time.Time
	// sent is when the latest attempt of a bind ask was sent (zero: not
	// sent yet, or its decision was already observed).
	sent time.Time
}

// sentAsk is an ask as askBatch hands it to the asker: a copy of its
// proposal, and the id the answer names it by (inReplied, inAbandon). The
// asker reads it without Router.mu, while the engine goes on with its ask.
type sentAsk struct {
	id uint64
	p  proposals.Proposal
}

// sentAsk returns the ask askBatch handed out as id, and forgets that it
// is out (nil: none is, which does not happen: an answer names each ask
// of a batch once; it is counted in stats.strayOutcomes).
func (e *engine) sentAsk(id uint64) *ask {
	a := e.asks.sent[id]
	if a == nil {
		e.stats.strayOutcomes++
		return nil
	}
	delete(e.asks.sent, id)
	return a
}

// askHeap orders asks waiting for their next attempt by due time.
type askHeap []*ask

func (h askHeap) Len() int           { return len(h) }
func (h askHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h askHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *askHeap) Push(x any) { a := x.(*ask); a.index = len(*h); *h = append(*h, a) }
func (h *askHeap) Pop() any {
	old := *h
	a := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	a.index = -1
	return a
}

// flights are the ungrouped lane's messages whose publish is in flight,
// in the order their publishes were emitted: that lane publishes its
// messages without keeping their order, all at once, and lets them go
// from its msgs as it does, so an outcome finds its message here by
// sequence, usually the first (the publisher reports in order). Taken out
// from the front, the list keeps its array: head is where the messages
// still in flight start.
type flights struct {
	ms   []*msgRec
	head int
}

// add records a publish of m emitted.
func (f *flights) add(m *msgRec) {
	if len(f.ms) == cap(f.ms) && f.head > 0 {
		// Full but for the front taken out: move the rest down instead
		// of growing.
		n := copy(f.ms, f.ms[f.head:])
		clear(f.ms[n:])
		f.ms, f.head = f.ms[:n], 0
	}
	f.ms = append(f.ms, m)
}

// take returns the message at ingress sequence seq and forgets it (nil:
// none is in flight).
func (f *flights) take(seq uint64) *msgRec {
	for i := f.head; i < len(f.ms); i++ {
		m := f.ms[i]
		if m.seq != seq {
			continue
		}
		if i == f.head {
			f.ms[i] = nil
			f.head++
		} else {
			copy(f.ms[i:], f.ms[i+1:])
			f.ms[len(f.ms)-1] = nil
			f.ms = f.ms[:len(f.ms)-1]
		}
		if f.head == len(f.ms) {
			f.ms, f.head = f.ms[:0], 0
		}
		return m
	}
	return nil
}

// retry is a failed publish waiting for its next attempt.
type retry struct {
	ln     *lane
	m      *msgRec
	dlq    bool
	reason string
	due    time.Time
}

// waitHeap orders asks waiting for a revision by deadline.
type waitHeap []waitEntry

type waitEntry struct {
	until time.Time
	a     *ask
}

func (h waitHeap) Len() int           { return len(h) }
func (h waitHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h waitHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *waitHeap) Push(x any)        { *h = append(*h, x.(waitEntry)) }
func (h *waitHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = waitEntry{}
	*h = old[:len(old)-1]
	return w
}

// actKind is what an action asks the shells to do.
type actKind uint8

const (
	// actPublish: publish msg, of group, onto node's queue (or the
	// dead-letter stream when dlq) and report the outcome (acked).
	actPublish actKind = iota + 1
	// actAsk: asks are waiting (wake the asker).
	actAsk
	// actDuty: a record asks this node to take group over (drain or
	// catch up); the hand-over shell does it.
	actDuty
	// actRetry: something is due at the time given (wake the timer).
	actRetry
	// actFailure: a bind attempt failed (announce it).
	actFailure
	// actDeadLettered: a group's held messages are on the dead-letter
	// stream (announce it).
	actDeadLettered
	// actDecided: a group this node proposed got its record, took after
	// the ask was sent (observe it).
	actDecided
	// actWindow: a timeout halved the window of proposals in flight to
	// count (log it, aggregated).
	actWindow
	// actBatch: publish batch, the first messages of group's lane, onto
	// node's queue as one atomic batch and report the outcome
	// (ackedBatch).
	actBatch
	// actHold: group started (count > 0: messages held) or stopped (took:
	// for how long, count: messages) being held back (announce it).
	actHold
	// actFairWake: a group started waiting for room in its share (wake
	// the fair shell, which may be between idle rounds).
	actFairWake
)

// action is one thing the engine asks its shells to do. It carries
// copies and ids, not pointers into the engine's state (its lanes, its
// message records): a shell reads an action after releasing Router.mu,
// while the engine goes on changing that state under the lock. (epoch is
// a lane's slice, shared because it is never written: a new epoch gets a
// new one.) A publish's outcome names the lane by group and the message by
// its ingress sequence (outcome).
type action struct {
	kind actKind
	// group: actPublish, actBatch: the lane's (its messages' group, ""
	// for the ungrouped lane); actDuty, actDeadLettered, actHold: the
	// group the action is about.
	group string
	// msg: actPublish: the message, copied when the action was emitted.
	msg pubMsg
	// batch: actBatch: the messages, copied likewise, in ingress order.
	batch []pubMsg
	node  string // actPublish, actBatch: destination queue's node
	dlq   bool   // actPublish: to the dead-letter stream, reason in reason
	// held: actPublish, actBatch: onto the node's held subject, not its
	// queue (fairshare.go).
	held bool
	on   bool // actHold: started
	// epoch: actPublish to a queue, actBatch: the HeaderEpoch value (the
	// lane's, shared: never written).
	epoch []string
	duty  proposals.Duty
	rev   uint64    // actDuty: the record revision
	at    time.Time // actRetry
	// reason: why a message is dead-lettered.
	reason string
	fail   *failure      // actFailure
	count  int           // actDeadLettered; actWindow: the new limit; actHold
	took   time.Duration // actDecided; actHold
}

// Engine counters (read by Stats under the lock). decisionErrors counts
// every failed bind attempt; timeouts and noHandler those of its failures
// that were a timeout or found no handler.
type engineStats struct {
	skipped, deadLettered, decisionErrors, publishErrors, asked uint64
	timeouts, noHandler                                         uint64
	windowCuts                                                  uint64 // times a timeout halved the window of proposals in flight
	belowFloor                                                  uint64
	limitRefused                                                uint64 // binds refused at the group limit
	spilled                                                     uint64 // messages spilled (maybeSpill), ever
	refused                                                     uint64 // publishes the servers refused for good (dead-lettered)
	batches, batchFailures                                      uint64 // batches published, and those that failed (their messages went one at a time)
	batchedMsgs                                                 uint64 // messages stored as part of a batch
	heldBack                                                    uint64 // times a group started being held back (fairshare.go)
	strayOutcomes                                               uint64 // outcomes of no publish in flight (engine.outcome), answers of no ask out (sentAsk): there are none
}

// engine is the lane engine.
type engine struct {
	cfg  engineConfig
	recs records
	out  []action

	lanes map[string]*lane // by group
	// byRef holds the lanes of long ids by ref (record changes come by
	// ref); the others' ref is their group.
	byRef    map[string]*lane
	mem      heldUse // what the held messages take
	inflight int
	batches  int // batches in flight
	track    tracker
	resume   resumePoint
	closing  bool
	// floor is the routing floor as this node knows it (proposals
	// NextFloor): a message below it that no binding covers was routed
	// already, under a binding that has ended since; it is dropped.
	floor uint64

	asks     askQueues // the asks to the handler and their pace
	pubRetry []retry
	rnd      *rand.Rand

	// ungrouped: the ungrouped lane's messages in flight (flights).
	ungrouped flights

	// view: the live nodes as this node knows them, and whether its own
	// queue has a consumer: what its choices of a node are made on.
	view nodeView

	act activity // what the node routed lately
	// duties: the record revisions of takeovers handed to the shell, so
	// that each is handed once, by ref.
	duties map[string]uint64
	lapse  fenceState // the liveness fence
	// fair: each group's share of the queue window (fairshare.go);
	// fairWait: the lanes waiting in memory for room in it; fairTick
	// counts the fair shell's rounds.
	fair     fairShare
	fairWait map[*lane]struct{}
	fairTick uint64

	// lost: how far this node routed its groups lately, and which were
	// taken from it (lost.go).
	lost lostBook

	stats engineStats
}

// nodeView is the live set as the engine knows it (setLive): the live
// node ids, sorted, and their states (consumer presence, group counts);
// whether this node's own queue has a consumer; and the round robin that
// breaks ties between equally loaded nodes.
type nodeView struct {
	live        []string
	state       map[string]proposals.NodeState
	hasConsumer bool
	rr          int
}

// heldUse is what the messages a node holds take in memory.
type heldUse struct {
	heldMsgs  int
	heldBytes int64
	// spilledMsgs/spilledBytes: messages held without their body
	// (msgRec.spilled), apart from heldMsgs and heldBytes.
	spilledMsgs  int
	spilledBytes int64
}

// askQueues are the lanes' asks to the handler: due now, due later,
// waiting for the revision their reply named; assigned counts, by node,
// the groups the ungrouped rule assigned; pace bounds the proposals in
// flight (pace.go).
type askQueues struct {
	askQ     []*lane
	retryQ   askHeap
	waitQ    waitHeap
	assigned map[string]int
	pace     window
	// sent: the asks askBatch handed out, by the id the asker's answer
	// names them by (sentAsk), until it answers (replied) or gives them
	// back (abandon); lastID: the last id given.
	sent   map[uint64]*ask
	lastID uint64
}

// activity is what the node routed lately: lastActive, when each group
// bound here last had a message routed (only with a group timeout), by
// ref; recent, the groups that had a message routed since the last
// announcement (busyGroups), at most MaxBusyListed; recentMore: more did.
type activity struct {
	lastActive map[string]int64
	recent     map[string]struct{}
	recentMore bool
}

// fenceState is the liveness fence: aliveUntil, until when this node's
// liveness record surely exists (zero: not known, not fenced); held, the
// lanes that stopped while it was fenced.
type fenceState struct {
	aliveUntil time.Time
	held       map[*lane]struct{}
}

func newEngine(cfg engineConfig, recs records, rnd *rand.Rand) *engine {
	e := &engine{
		cfg:      cfg,
		recs:     recs,
		rnd:      rnd,
		lanes:    make(map[string]*lane),
		byRef:    make(map[string]*lane),
		view:     nodeView{state: map[string]proposals.NodeState{}},
		duties:   make(map[string]uint64),
		lapse:    fenceState{held: make(map[*lane]struct{})},
		act:      activity{recent: make(map[string]struct{})},
		asks:     askQueues{assigned: make(map[string]int), sent: make(map[uint64]*ask), pace: newWindow(windowMin, windowMax, maxBatch)},
		fair:     newFairShare(cfg.groupShare),
		fairWait: make(map[*lane]struct{}),
	}
	if cfg.groupTimeout > 0 {
		e.act.lastActive = make(map[string]int64)
	}
	return e
}

// newLane registers an empty lane for group, whose ref is ref.
func (e *engine) newLane(group, ref string) *lane {
	ln := &lane{group: group, ref: ref}
	e.lanes[group] = ln
	if ref != group {
		e.byRef[ref] = ln
	}
	return ln
}

// dropLane forgets a lane.
func (e *engine) dropLane(ln *lane) {
	delete(e.lanes, ln.group)
	if ln.ref != ln.group {
		delete(e.byRef, ln.ref)
	}
}

// laneOf returns the lane of the group whose ref is ref, if any.
func (e *engine) laneOf(ref string) *lane {
	if kvbinding.IsRef(ref) {
		return e.byRef[ref]
	}
	return e.lanes[ref]
}

// take returns the actions produced so far and resets the list.
func (e *engine) take() []action {
	out := e.out
	e.out = nil
	return out
}

func (e *engine) emit(a action) { e.out = append(e.out, a) }

// publish emits a, the publish of ln's message m, with the lane's group
// and a copy of m. A message of the ungrouped lane goes among its flights,
// where its outcome finds it (inFlight).
func (e *engine) publish(ln *lane, m *msgRec, a action) {
	a.kind, a.group, a.msg = actPublish, ln.group, m.pub()
	if ln.group == "" {
		e.ungrouped.add(m)
	}
	e.emit(a)
}

// full reports whether the node must stop reading the ingress until work
// is done: too many messages held or publishes in flight.
func (e *engine) full() bool {
	return e.mem.heldMsgs >= e.cfg.maxHeldMessages || e.mem.heldBytes >= e.cfg.maxHeldBytes || e.inflight >= e.cfg.maxInFlight ||
		(e.cfg.spillFrom > 0 && e.mem.spilledBytes >= e.cfg.maxSpilledBytes)
}

// The held messages are past spillFrom bytes, or half of maxHeldMessages.

// spillCost is what the engine counts for a spilled message of group: the
// record, its subject and the group id (a lane's, counted per message to
// stay on the safe side).
func spillCost(m *msgRec, group string) int {
	return 160 + len(m.subject) + len(group)
}

// maybeSpill lets m's body go if m waits for a decision in ln and the held
// messages are past spillFrom: the node then keeps reading (the next
// messages may be of groups bound already) while the decisions come, at
// the cost of reading m again from the ingress when it is published.
// Past the bytes alone, a message whose group id is most of it (what
// spilling keeps) is not spilled: that would cost the read and free
// little. Past half of the messages, any is (the count is the bound).
func (e *engine) maybeSpill(ln *lane, m *msgRec) {
	if e.cfg.spillFrom <= 0 || !ln.waiting || m.spilled || len(ln.msgs) == 0 || ln.msgs[len(ln.msgs)-1] != m {
		return
	}
	cost := spillCost(m, ln.group)
	byCount := e.mem.heldMsgs >= e.cfg.maxHeldMessages/2
	if !byCount && (e.mem.heldBytes < e.cfg.spillFrom || 2*cost > m.size) {
		return
	}
	e.mem.heldMsgs--
	e.mem.heldBytes -= int64(m.size)
	m.spilled, m.payload = true, nil
	m.size = cost
	e.mem.spilledMsgs++
	e.mem.spilledBytes += int64(m.size)
	e.stats.spilled++
}

// position is the next ingress sequence this node will read.
func (e *engine) position() uint64 {
	if n := e.track.next(); n > 0 {
		return n
	}
	if s := e.resume.start(); s > 0 {
		return s
	}
	return 1
}

// ingest takes one ingress message of group, in stream order.
func (e *engine) ingest(group string, m *msgRec, now time.Time) {
	e.track.add(m.seq)
	if e.resume.done(m.seq) {
		e.track.resolve(m.seq)
		return
	}
	ln := e.lanes[group]
	if ln == nil {
		ref := kvbinding.Ref(group)
		if route, ok := e.recs.Lookup(ref); ok {
			if owner, act := proposals.Owner(route, m.seq, e.cfg.node); act == proposals.RouteTo && owner != e.cfg.node {
				// Routed by another node (or dead-lettered by one).
				e.track.resolve(m.seq)
				e.stats.skipped++
				return
			}
		}
		ln = e.newLane(group, ref)
	}
	ln.msgs = append(ln.msgs, m)
	e.mem.heldMsgs++
	e.mem.heldBytes += int64(m.size)
	e.pump(ln, now)
	e.maybeSpill(ln, m)
}

// pump moves a lane forward as far as it can.
func (e *engine) pump(ln *lane, now time.Time) {
	if ln.deadLettering || ln.changing {
		return
	}
	route, known := e.recs.Lookup(ln.ref)
	if known && ln.inflight == 0 {
		if duty := proposals.DutyOf(route, e.cfg.node); duty == proposals.DutyFence {
			e.fence(ln, route, now)
			return
		}
	}
	for len(ln.msgs) > 0 && (ln.inflight == 0 || ln.group == "") {
		m := ln.msgs[0]
		owner, act := "", proposals.RoutePropose
		if known {
			owner, act = proposals.Owner(route, m.seq, e.cfg.node)
		}
		switch act {
		case proposals.RoutePropose:
			if m.seq < e.floor {
				// Below the routing floor: every node resolved it while a
				// binding covered it; a binding now would route it again.
				e.popDone(ln)
				e.stats.skipped++
				e.stats.belowFloor++
				if len(ln.msgs) == 0 {
					ln.waiting = false
					e.dropAsk(ln)
				}
				continue
			}
			ln.waiting = true
			e.needBinding(ln, now)
			return
		case proposals.RouteWait:
			e.decided(ln, now)
			ln.waiting = false
			e.dropAsk(ln)
			e.duty(ln.ref, ln.group, route)
			return
		}
		e.decided(ln, now)
		ln.waiting = false
		e.dropAsk(ln)
		if owner != e.cfg.node {
			e.popDone(ln)
			e.stats.skipped++
			continue
		}
		if e.fenced(now) {
			// This node's liveness record may have lapsed: the handler may
			// give its groups to others. It publishes nothing until an
			// announcement is stored again (unfence pumps the lane).
			e.lapse.held[ln] = struct{}{}
			return
		}
		if ln.group == "" {
			// Ungrouped: no order to keep, publish them all at once.
			ln.msgs[0] = nil
			ln.msgs = ln.msgs[1:]
			ln.inflight++
			e.inflight++
			if m.invalid != "" {
				e.publish(ln, m, action{dlq: true, reason: m.invalid})
				continue
			}
			e.publish(ln, m, action{node: e.ungroupedDestination(), epoch: ln.epochHeader(route.Epoch)})
			continue
		}
		if m.close && e.fair.holding(ln.ref) {
			// The group ends after this message: it goes once its held
			// messages are on the queue (released pumps the lane), so
			// that its binding ends behind all of them.
			return
		}
		if e.fairWaits(ln, m, now) {
			return // at its share of the queue window: fairRead pumps it
		}
		held := e.aim(ln, m)
		ln.inflight = 1
		if n := e.batchable(ln, route, held); n > 1 {
			ln.batch = n
			e.inflight += n
			e.batches++
			e.stats.batches++
			batch := make([]pubMsg, n)
			for i, bm := range ln.msgs[:n] {
				batch[i] = bm.pub()
			}
			e.emit(action{kind: actBatch, group: ln.group, batch: batch, node: e.cfg.node, epoch: ln.epochHeader(route.Epoch), held: held})
			return
		}
		e.inflight++
		e.publish(ln, m, action{node: e.cfg.node, epoch: ln.epochHeader(route.Epoch), held: held})
		return
	}
	if len(ln.msgs) == 0 && ln.inflight == 0 && ln.ask == nil {
		e.dropLane(ln)
	}
}

// batchable returns how many of a grouped lane's first messages, routed
// by this node under route, go as one atomic batch: as many as follow in
// this node's range of the group, up to the bounds, ending with a closing
// message. 1 (the head alone) when batches are off or the lane has no
// backlog, so that a group with none keeps one publish's latency; after a
// failed batch, while its messages go one at a time; or when the node has
// its bound of batches in flight.
func (e *engine) batchable(ln *lane, route kvbinding.Binding, held bool) int {
	if e.cfg.maxBatch < 2 || len(ln.msgs) < 2 || ln.singles > 0 || e.batches >= e.cfg.maxBatches || ln.msgs[0].spilled {
		return 1
	}
	most := e.cfg.maxBatch
	if !held {
		most = min(most, max(e.fair.room(ln.ref), 1)) // the group's share of the queue window
	}
	want := ln.msgs[0].target
	size := 0
	n := 0
	for _, m := range ln.msgs[:min(len(ln.msgs), most)] {
		if n > 0 {
			if owner, act := proposals.Owner(route, m.seq, e.cfg.node); act != proposals.RouteTo || owner != e.cfg.node ||
				m.invalid != "" || m.spilled || size+m.size > e.cfg.maxBatchBytes || (m.target != 0 && m.target != want) ||
				(held && m.close) { // a closing message goes onto the queue, behind the held ones (pump)
				break
			}
			m.target = want
		}
		size += m.size
		n++
		if m.close {
			break // the group ends after it: its release waits for it
		}
	}
	return n
}

// decided observes, for a lane waiting for a binding this node asked for,
// the time from sending the ask (its latest attempt) to the record that
// decides the lane's head, as the cache shows it.
func (e *engine) decided(ln *lane, now time.Time) {
	if a := ln.ask; ln.waiting && a != nil && a.p.Op == "" && !a.sent.IsZero() {
		e.emit(action{kind: actDecided, took: now.Sub(a.sent)})
		a.sent = time.Time{}
	}
}

// fenced reports whether this node must not publish its groups now: its
// last stored announcement is too old for its liveness record to be sure
// to exist (aliveUntil; zero: not fenced).
func (e *engine) fenced(now time.Time) bool {
	return !e.lapse.aliveUntil.IsZero() && !now.Before(e.lapse.aliveUntil)
}

// alive takes the time until which this node's liveness record is known
// to exist (an announcement was stored), and routes what it held while it
// was fenced.
func (e *engine) alive(until, now time.Time) {
	e.lapse.aliveUntil = until
	if e.fenced(now) {
		return
	}
	if len(e.pubRetry) > 0 {
		e.due(now) // the retries held back while fenced
	}
	if len(e.lapse.held) == 0 {
		return
	}
	held := make([]*lane, 0, len(e.lapse.held))
	for ln := range e.lapse.held {
		held = append(held, ln)
	}
	e.lapse.held = make(map[*lane]struct{})
	// In group order: the publishes come out the same way every time (the
	// simulation replays a seed exactly).
	sort.Slice(held, func(i, j int) bool { return held[i].group < held[j].group })
	for _, ln := range held {
		if e.lanes[ln.group] == ln {
			e.pump(ln, now)
		}
	}
}

// popDone removes a lane's head as done.
func (e *engine) popDone(ln *lane) {
	m := ln.msgs[0]
	ln.popHead()
	e.release(m)
}

// popHead drops the lane's head.
func (ln *lane) popHead() {
	ln.msgs[0] = nil
	ln.msgs = ln.msgs[1:]
	if ln.singles > 0 {
		ln.singles--
	}
}

// release accounts a message as done.
func (e *engine) release(m *msgRec) {
	if m.spilled {
		e.mem.spilledMsgs--
		e.mem.spilledBytes -= int64(m.size)
	} else {
		e.mem.heldMsgs--
		e.mem.heldBytes -= int64(m.size)
	}
	e.track.resolve(m.seq)
}

// ungroupedDestination picks the node for an ungrouped message.
func (e *engine) ungroupedDestination() string {
	e.view.rr++
	return proposals.UngroupedDestination(e.view.state, e.cfg.node, e.cfg.localFirst && e.view.hasConsumer, e.view.rr)
}

// inFlight returns ln's message at ingress sequence seq, whose publish is
// in flight (nil: there is none; ln may be nil), and, for the ungrouped
// lane, forgets that it is in flight. A group's lane has one publish in
// flight, of its head; or, while it dead-letters its messages, one of
// each, which it holds in ingress order (they are read so) until the
// dead-letter record comes. The ungrouped lane's are among its flights.
func (e *engine) inFlight(ln *lane, seq uint64) *msgRec {
	if ln == nil {
		return nil
	}
	if ln.group == "" {
		return e.ungrouped.take(seq)
	}
	if len(ln.msgs) > 0 && ln.msgs[0].seq == seq {
		return ln.msgs[0]
	}
	return ln.find(seq)
}

// find returns ln's held message at ingress sequence seq (nil: none);
// the lane holds its messages in ingress order.
func (ln *lane) find(seq uint64) *msgRec {
	if i, ok := slices.BinarySearchFunc(ln.msgs, seq, func(m *msgRec, seq uint64) int { return cmp.Compare(m.seq, seq) }); ok {
		return ln.msgs[i]
	}
	return nil
}

// held reports whether m is among ln's held messages (an ungrouped
// message leaves them when it is published).
func (ln *lane) held(m *msgRec) bool { return ln.find(m.seq) == m }

// acked takes the outcome of a publish the engine asked for.
func (e *engine) acked(ln *lane, m *msgRec, dlq bool, reason string, err error, qseq uint64, now time.Time) {
	if err != nil {
		e.stats.publishErrors++
		if e.closing {
			ln.inflight--
			e.inflight--
			return
		}
		if errors.Is(err, errRefused) && !m.stripped {
			// The servers will never store it as it is: retrying would
			// wedge its group. It goes to the dead-letter stream with the
			// reason, whole, or, if even that is refused, without its body
			// (its original stays in the ingress for its max age); the lane
			// goes on once that copy is stored.
			why := "refused by the servers: " + err.Error()
			if dlq {
				m.stripped = true
				why = reason + "; its dead-letter copy was " + why + "; stored without its body"
			}
			e.stats.refused++
			e.emit(action{kind: actDeadLettered, group: ln.group, count: 1, rev: m.seq, reason: why})
			e.publish(ln, m, action{dlq: true, reason: why})
			return
		}
		// Retried with the same message (same Nats-Msg-Id) after a pause;
		// the lane stays blocked meanwhile, so the group keeps its order.
		due := now.Add(backoffBase)
		e.pubRetry = append(e.pubRetry, retry{ln: ln, m: m, dlq: dlq, reason: reason, due: due})
		e.emit(action{kind: actRetry, at: due})
		return
	}
	ln.inflight--
	e.inflight--
	if ln.deadLettering && dlq && ln.held(m) {
		// One of the copies startDeadLetter published. The ungrouped
		// lane's earlier publishes, out of the lane when they were sent,
		// may still come back meanwhile: they end as any publish does.
		e.stats.deadLettered++
		ln.dlqPending--
		if ln.dlqPending == 0 {
			e.deadLettered(ln, now)
		}
		return
	}
	if dlq {
		e.stats.deadLettered++
	}
	if ln.group != "" {
		ln.popHead()
		e.touch(ln, now)
		if !dlq {
			e.fairStored(ln, m.target == targetHeld, qseq, 1, now)
			e.lost.routed(ln.ref, m.seq, qseq)
		}
	}
	e.release(m)
	if m.close && ln.group != "" {
		// The group's last message is on its queue: end the binding
		// (later messages of the group wait for it, then bind afresh).
		e.askRelease(ln, m.seq, proposals.EventClose, "closed by a "+HeaderGroupSeq+": -1 message", now)
		return
	}
	e.pump(ln, now)
}

// ackedBatch takes the outcome of a batch the engine asked for (the lane's
// first ln.batch messages). Stored, the messages are done. On a failure
// none of an atomic batch's messages was stored, or all were (an ack lost,
// or a batch refused because it holds a message stored before, by a
// publish whose outcome was lost or before a restart); of a fast-ingest
// batch, a prefix of them may be: either way each message then goes
// alone, in order, each deduplicated by its own Nats-Msg-Id, so that
// nothing is stored twice or out of order; the lane batches again after
// them.
func (e *engine) ackedBatch(ln *lane, err error, qseq uint64, now time.Time) {
	n := ln.batch
	ln.batch = 0
	e.batches--
	e.inflight -= n
	if err != nil {
		e.stats.publishErrors++
		e.stats.batchFailures++
		if e.closing {
			ln.inflight--
			return
		}
		ln.singles = n
		e.inflight++ // the head, retried alone (ln.inflight stays 1)
		due := now.Add(backoffBase)
		e.pubRetry = append(e.pubRetry, retry{ln: ln, m: ln.msgs[0], due: due})
		e.emit(action{kind: actRetry, at: due})
		return
	}
	ln.inflight--
	e.stats.batchedMsgs += uint64(n)
	last := ln.msgs[n-1]
	e.fairStored(ln, last.target == targetHeld, qseq, n, now)
	e.lost.routed(ln.ref, last.seq, qseq)
	for range n {
		m := ln.msgs[0]
		ln.popHead()
		e.release(m)
	}
	e.touch(ln, now)
	if last.close {
		e.askRelease(ln, last.seq, proposals.EventClose, "closed by a "+HeaderGroupSeq+": -1 message", now)
		return
	}
	e.pump(ln, now)
}

// retryPublish re-sends a failed publish, unless the group was taken from
// this node meanwhile (the handler fenced it from the checkpoint): its
// next owner routes the message (it was not stored, or it is on this
// node's queue and the move drains it).
func (e *engine) retryPublish(r retry, now time.Time) {
	if !r.dlq && r.ln.group != "" && !r.ln.deadLettering {
		if route, ok := e.recs.Lookup(r.ln.ref); ok {
			if owner, act := proposals.Owner(route, r.m.seq, e.cfg.node); act == proposals.RouteTo && owner != e.cfg.node {
				r.ln.inflight--
				e.inflight--
				e.popDone(r.ln)
				e.stats.skipped++
				e.pump(r.ln, now)
				return
			}
		}
	}
	node := e.cfg.node
	if r.ln.group == "" && !r.dlq {
		node = e.ungroupedDestination()
	}
	epoch := r.ln.epochHdr
	if route, ok := e.recs.Lookup(r.ln.ref); ok && !r.dlq {
		epoch = r.ln.epochHeader(route.Epoch)
	}
	e.publish(r.ln, r.m, action{node: node, dlq: r.dlq, reason: r.reason, epoch: epoch, held: !r.dlq && r.m.target == targetHeld})
}

// changed takes a change of a group's record, by the group's ref (as the
// cache notifies it).
func (e *engine) changed(ref string, now time.Time) {
	route, ok := e.recs.Lookup(ref)
	if ok && route.Ckpt != 0 && route.PrevNode == e.cfg.node && route.Node != "" && route.Node != e.cfg.node {
		// An evacuation from this node's checkpoint (the only take-over
		// whose catch-up reads Checkpoint.Lost).
		group := route.Group
		if ln := e.laneOf(ref); ln != nil {
			group = ln.group
		} else if !kvbinding.IsRef(ref) {
			group = ref
		}
		e.lost.taken(group, ref, route.Epoch, now)
	}
	if (!ok || !route.Settled() || route.Node != e.cfg.node) && !(ok && unbinding(route, e.cfg.node)) {
		// Not routed here (now): what this node held of it moves with the
		// group (the hand-over drains the held subject too). An unbind
		// drains nothing: this node releases what it held before it
		// fences (fence).
		e.fair.forget(ref)
	}
	if ln := e.laneOf(ref); ln != nil {
		if ln.changing && ln.ask != nil && ok && route.Revision > ln.ask.after {
			// The record moved past the one we asked a change of.
			e.dropAsk(ln)
			ln.changing = false
		}
		if a := ln.ask; a != nil && a.waitRev != 0 && ok && route.Revision >= a.waitRev {
			// The record the reply named is here: the ask is answered.
			e.answered(ln, now)
		} else {
			e.pump(ln, now)
		}
		if ok {
			// The lane may hold nothing that waits for this record (its
			// messages were the previous owner's, before FromSeq): the
			// takeover step is handed here, not by pump.
			e.duty(ref, ln.group, route)
		}
		return
	}
	if !ok {
		delete(e.duties, ref)
		return
	}
	// A record that asks something of this node is unsettled: the cache
	// names even a long id's group then.
	group := route.Group
	if !kvbinding.IsRef(ref) {
		group = ref
	}
	switch d := proposals.DutyOf(route, e.cfg.node); {
	case d == proposals.DutyNone:
		delete(e.duties, ref)
	case group == "" && ref != "":
		// Not named (cannot happen with the cache): nothing to act on.
	case d == proposals.DutyFence:
		e.fence(e.newLane(group, ref), route, now)
	default:
		e.duty(ref, group, route)
	}
}

// duty hands a takeover the record asks of this node to the shell, once
// per revision.
func (e *engine) duty(ref, group string, route kvbinding.Binding) {
	d := proposals.DutyOf(route, e.cfg.node)
	if d != proposals.DutyDrain && d != proposals.DutyCatchUp {
		delete(e.duties, ref)
		return
	}
	if e.duties[ref] >= route.Revision {
		return
	}
	e.duties[ref] = route.Revision
	e.emit(action{kind: actDuty, group: group, duty: d, rev: route.Revision})
}

// dutyDone forgets a takeover the shell gave up on, so that the record
// hands it again (the shell retries).
func (e *engine) dutyDone(group string, rev uint64) {
	ref := kvbinding.Ref(group)
	if e.duties[ref] == rev {
		delete(e.duties, ref)
	}
}

// takeoverFrom returns the first sequence of group that this node holds in
// its lane, or its position: a takeover's catch-up covers the group's
// messages from the fence up to there. It is at least the resume
// checkpoint's Next: below it, the messages the checkpoint marks done are
// not read again (ingest skips them), and some may be the group's, skipped
// before a restart while another node owned it. The catch-up covers them,
// and the lane's messages below it too (republished with their ingress
// ids, which the queue stream's duplicate window absorbs).
func (e *engine) takeoverFrom(group string) uint64 {
	from := e.position()
	if ln := e.lanes[group]; ln != nil && len(ln.msgs) > 0 {
		from = ln.msgs[0].seq
	}
	return max(from, e.resume.ckpt.Next)
}

// fence asks the handler to take the group from this node, once nothing of
// it is in flight: the fence is the first message not routed.
func (e *engine) fence(ln *lane, route kvbinding.Binding, now time.Time) {
	if ln.inflight > 0 || ln.changing || e.fair.releasing[ln.ref] {
		// A release in progress ends first (released pumps the lane):
		// nothing of the group reaches this node's queue after its fence.
		return
	}
	if unbinding(route, e.cfg.node) && e.fair.holding(ln.ref) {
		// A move that ends the binding (an unbind) drains nothing: the
		// group's messages on the held subject would reach the queue after
		// those of the binding that follows (this node's again, or
		// another's from its proposal), behind its catch-up. They go onto
		// the queue first: the fair shell releases them while the group
		// moves away (released pumps the lane). A move to another node
		// fences at once: its drain takes the held messages along.
		return
	}
	seq := e.position()
	if len(ln.msgs) > 0 {
		seq = ln.msgs[0].seq
	}
	e.stepAsk(ln, proposals.Proposal{Op: proposals.OpFence, Group: ln.group, Seq: max(seq, route.FromSeq), Rev: route.Revision}, route.Revision)
}

// unbinding reports whether route moves the group away from node to no
// node (an unbind: the release that follows drains nothing).
func unbinding(route kvbinding.Binding, node string) bool {
	return route.State == kvbinding.StateMoving && route.Node == "" && route.PrevNode == node && !route.Invalid
}

// askRelease asks the handler to end this node's binding of ln's group
// after through.
func (e *engine) askRelease(ln *lane, through uint64, kind, reason string, now time.Time) {
	route, ok := e.recs.Lookup(ln.ref)
	if !ok || !route.Settled() || route.Node != e.cfg.node {
		e.pump(ln, now)
		return
	}
	e.stepAsk(ln, proposals.Proposal{Op: proposals.OpRelease, Group: ln.group, Seq: through, Rev: route.Revision, Kind: kind, Reason: reason}, route.Revision)
}

// stepAsk queues a step ask for ln: the lane holds still until the record
// changes past rev or the ask fails.
func (e *engine) stepAsk(ln *lane, p proposals.Proposal, rev uint64) {
	e.dropAsk(ln)
	ln.changing = true
	a := &ask{p: p, lane: ln, index: -1, after: rev}
	ln.ask = a
	e.asks.askQ = append(e.asks.askQ, ln)
	e.emit(action{kind: actAsk})
}

// needBinding schedules a bind proposal for a waiting lane: at once if
// this node is the group's proposer, else after the timeout as a fallback
// in case the proposer is gone.
func (e *engine) needBinding(ln *lane, now time.Time) {
	if ln.ask != nil || ln.deadLettering {
		return
	}
	a := &ask{lane: ln, index: -1}
	ln.ask = a
	if e.isProposer(ln.group) {
		e.asks.askQ = append(e.asks.askQ, ln)
		e.emit(action{kind: actAsk})
		return
	}
	a.due = now.Add(e.cfg.timeout)
	heap.Push(&e.asks.retryQ, a)
	e.emit(action{kind: actRetry, at: a.due})
}

// dropAsk forgets a lane's pending ask once answered. An ask in flight is
// left to its reply, which then finds the lane moved on.
func (e *engine) dropAsk(ln *lane) {
	a := ln.ask
	if a == nil {
		return
	}
	if a.index >= 0 {
		heap.Remove(&e.asks.retryQ, a.index)
	}
	ln.ask = nil
}

// isProposer reports whether this node proposes for group.
func (e *engine) isProposer(group string) bool {
	return proposals.IsProposer(group, e.cfg.node, e.view.live)
}

// askBatch collects up to max due asks, as many as the window of
// proposals in flight has room for and as fit in
// proposals.RequestBudget bytes, and marks them in flight.
func (e *engine) askBatch(max int, now time.Time) []sentAsk {
	for e.asks.retryQ.Len() > 0 && !e.asks.retryQ[0].due.After(now) {
		a := heap.Pop(&e.asks.retryQ).(*ask)
		e.asks.askQ = append(e.asks.askQ, a.lane)
	}
	max = min(max, e.asks.pace.room())
	var batch []sentAsk
	size := 0
	pop := func() {
		e.asks.askQ[0] = nil
		e.asks.askQ = e.asks.askQ[1:]
	}
	for len(e.asks.askQ) > 0 && len(batch) < max {
		ln := e.asks.askQ[0]
		a := ln.ask
		if a == nil || a.inFlight || e.lanes[ln.group] != ln {
			pop()
			continue
		}
		p := a.p
		if p.Op == "" {
			// A binding: still needed, for the lane's current head.
			if !ln.waiting || ln.deadLettering || len(ln.msgs) == 0 {
				pop()
				e.dropAsk(ln)
				continue
			}
			p = proposals.Proposal{Group: ln.group, Node: e.chooseNode(ln.group), Seq: ln.msgs[0].seq}
		}
		n := p.EncodedLen()
		if len(batch) > 0 && size+n > proposals.RequestBudget {
			break // the next request takes it
		}
		pop()
		size += n
		if p.Op == "" {
			a.p = p
			e.asks.assigned[p.Node]++
			a.sent = now
		}
		a.inFlight = true
		e.asks.lastID++
		e.asks.sent[e.asks.lastID] = a
		batch = append(batch, sentAsk{id: e.asks.lastID, p: a.p})
	}
	e.asks.pace.sent(len(batch))
	e.stats.asked += uint64(len(batch))
	return batch
}

// retryNow makes every ask waiting for its next attempt due now: a LOCAL
// handler became active, so the asks that failed for want of one need not
// wait out their backoff.
func (e *engine) retryNow(now time.Time) {
	if e.asks.retryQ.Len() == 0 {
		return
	}
	for _, a := range e.asks.retryQ {
		if a.attempt > 0 {
			a.due = now
		}
	}
	heap.Init(&e.asks.retryQ)
	e.emit(action{kind: actAsk})
}

// nextDue returns when the next ask or publish retry is due (zero: none).
func (e *engine) nextDue() time.Time {
	var next time.Time
	if e.asks.retryQ.Len() > 0 {
		next = e.asks.retryQ[0].due
	}
	for _, r := range e.pubRetry {
		if next.IsZero() || r.due.Before(next) {
			next = r.due
		}
	}
	if e.asks.waitQ.Len() > 0 && (next.IsZero() || e.asks.waitQ[0].until.Before(next)) {
		next = e.asks.waitQ[0].until
	}
	return next
}

// begin sets where the node starts routing: its resume point and the
// routing floor (setup reads both before the reader starts).
func (e *engine) begin(resume resumePoint, floor uint64) {
	e.resume, e.floor = resume, floor
	e.lost.earlier = resume.ckpt.Lost
}

// consumerPresent records whether the node's queue has a consumer (the
// liveness loop reads it; the node chooses itself for new groups only
// while it does).
func (e *engine) consumerPresent(has bool) { e.view.hasConsumer = has }

// stripped records that m's dead-letter copy went without its body (the
// shell found the ingress no longer holding it).
func (e *engine) stripped(m *msgRec) { m.stripped = true }

// close stops the engine: publishes that fail from now on are dropped,
// not retried, and the retries not yet made are abandoned.
func (e *engine) close() {
	e.closing = true
	e.abandonRetries()
}

// abandonRetries drops the publish retries not yet made, as a closing
// engine drops a publish that fails: those messages are not routed, the
// checkpoint does not cover them, and they are read again after a
// restart. It is called when the node stops.
func (e *engine) abandonRetries() {
	for _, r := range e.pubRetry {
		r.ln.inflight--
		e.inflight--
	}
	clear(e.pubRetry)
	e.pubRetry = e.pubRetry[:0]
}

// due runs what is due at now: publish retries, asks whose reply named a
// revision that never came.
func (e *engine) due(now time.Time) {
	if len(e.pubRetry) > 0 && !e.fenced(now) {
		// A fenced node retries nothing either (alive runs them).
		rest := e.pubRetry[:0]
		for _, r := range e.pubRetry {
			if r.due.After(now) {
				rest = append(rest, r)
				continue
			}
			e.retryPublish(r, now)
		}
		clear(e.pubRetry[len(rest):])
		e.pubRetry = rest
	}
	for e.asks.waitQ.Len() > 0 && !e.asks.waitQ[0].until.After(now) {
		w := heap.Pop(&e.asks.waitQ).(waitEntry)
		if a := w.a; a.waitRev != 0 && a.waitUntil.Equal(w.until) && a.lane.ask == a {
			a.waitRev = 0
			e.failed(a, fmt.Errorf("the record revision the handler named did not arrive within %v", e.cfg.timeout), now)
		}
	}
	if e.asks.retryQ.Len() > 0 && !e.asks.retryQ[0].due.After(now) {
		e.emit(action{kind: actAsk})
	}
}

// chooseNode picks the node to propose for a new group: only nodes whose
// queue has a consumer (all live nodes if none has one); this node first
// with LocalFirst; else the fewest bound groups, counting proposals in
// flight, ties round-robin.
func (e *engine) chooseNode(group string) string {
	eligible := proposals.Eligible(e.view.state, group == "")
	if len(eligible) == 0 {
		return e.cfg.node
	}
	if e.cfg.localFirst {
		for _, n := range eligible {
			if n == e.cfg.node {
				return n
			}
		}
	}
	e.view.rr++
	return proposals.LeastLoaded(eligible, func(n string) int { return e.groupCount(n) + e.asks.assigned[n] }, e.view.rr)
}

// groupCount is the engine's view of how many groups node has (the
// shell's cache counts, when it gives them).
func (e *engine) groupCount(node string) int {
	if c, ok := e.recs.(interface{ Count(string) int }); ok {
		return c.Count(node)
	}
	return 0
}

// abandon returns asks that could not be sent (the node is stopping).
func (e *engine) abandon(batch []sentAsk) {
	e.asks.pace.unsent(len(batch))
	for _, s := range batch {
		a := e.sentAsk(s.id)
		if a == nil {
			continue
		}
		a.inFlight = false
		if a.p.Op == "" || a.p.Op == proposals.OpBind {
			e.asks.assigned[a.p.Node]--
		}
	}
}

// replied takes the answer to a batch of asks: err for the whole request,
// or a decision per ask.
func (e *engine) replied(batch []sentAsk, ds []proposals.Decision, err error, now time.Time) {
	timedOut := errors.Is(err, proposals.ErrDecisionTimeout)
	cuts := e.asks.pace.cuts
	e.asks.pace.answered(len(batch), timedOut, err != nil && !timedOut, e.cfg.timeout, now)
	if e.asks.pace.cuts != cuts {
		e.stats.windowCuts++
		e.emit(action{kind: actWindow, count: int(e.asks.pace.limit)})
	}
	if len(e.asks.askQ) > 0 || (e.asks.retryQ.Len() > 0 && !e.asks.retryQ[0].due.After(now)) {
		e.emit(action{kind: actAsk}) // the window has room again
	}
	for i, s := range batch {
		a := e.sentAsk(s.id)
		if a == nil {
			continue
		}
		if a.p.Op == "" || a.p.Op == proposals.OpBind {
			e.asks.assigned[a.p.Node]--
		}
		a.inFlight = false
		if err != nil {
			e.failed(a, err, now)
			continue
		}
		d := ds[i]
		switch d.Outcome {
		case proposals.Failed:
			e.failed(a, fmt.Errorf("%w: %s", proposals.ErrHandlerFailed, d.Error), now)
			continue
		case proposals.Refused:
			if d.Floor > 0 && (a.p.Op == "" || a.p.Op == proposals.OpBind) {
				// Below the routing floor: the group's messages below it
				// were routed; ask again for those after it, if any.
				ln := a.lane
				if ln.ask == a {
					e.dropAsk(ln)
				}
				e.raiseFloor(d.Floor, now)
				if e.lanes[ln.group] == ln {
					e.pump(ln, now)
				}
				continue
			}
			if d.Limit > 0 && (a.p.Op == "" || a.p.Op == proposals.OpBind) {
				e.atLimit(a, d, now)
				continue
			}
			// Not ours to ask (any more): the record stands. Look again
			// once the record changes, or after a pause.
			e.failed(a, fmt.Errorf("refused: %s", d.Error), now)
			continue
		}
		ln := a.lane
		if ln.ask != a {
			continue
		}
		// Accepted or rejected: the record that stands is at d.Revision;
		// the watch brings it. Until then the lane waits (at most the
		// timeout: then the ask counts as failed).
		if route, ok := e.recs.Lookup(ln.ref); ok && route.Revision >= d.Revision {
			e.answered(ln, now)
			continue
		}
		a.waitRev, a.waitUntil = d.Revision, now.Add(e.cfg.timeout)
		heap.Push(&e.asks.waitQ, waitEntry{until: a.waitUntil, a: a})
		e.emit(action{kind: actRetry, at: a.waitUntil})
	}
}

// answered re-evaluates a lane whose ask's record arrived. The ask is
// done: should the record still leave the lane's head without a binding (a
// bind rejected by a handler whose view of the record lagged this node's,
// a binding that ended before its reply came), pump asks afresh; a stale
// ask left on the lane would keep needBinding from ever asking again.
func (e *engine) answered(ln *lane, now time.Time) {
	if ln.ask == nil {
		return
	}
	if len(ln.msgs) > 0 {
		if route, ok := e.recs.Lookup(ln.ref); ok {
			if _, act := proposals.Owner(route, ln.msgs[0].seq, e.cfg.node); act != proposals.RoutePropose {
				e.decided(ln, now)
			}
		}
	}
	e.dropAsk(ln)
	ln.changing = false
	e.pump(ln, now)
}

// raiseFloor takes a routing floor learnt from the handler: the held
// messages below it that wait for a binding are dropped (routed already).
func (e *engine) raiseFloor(floor uint64, now time.Time) {
	if floor <= e.floor {
		return
	}
	e.floor = floor
	var below []*lane
	for _, ln := range e.lanes {
		if ln.waiting && len(ln.msgs) > 0 && ln.msgs[0].seq < floor {
			below = append(below, ln)
		}
	}
	sort.Slice(below, func(i, j int) bool { return below[i].group < below[j].group }) // a deterministic order
	for _, ln := range below {
		e.pump(ln, now)
	}
}

// failed records a failed attempt: retry after a backoff, or dead-letter
// the group's held messages after maxAttempts.
func (e *engine) failed(a *ask, err error, now time.Time) {
	ln := a.lane
	if ln.ask != a || e.lanes[ln.group] != ln {
		return // answered meanwhile
	}
	a.attempt++
	if a.p.Op == "" || a.p.Op == proposals.OpBind {
		if !ln.waiting {
			e.dropAsk(ln)
			return
		}
		e.stats.decisionErrors++
		switch {
		case errors.Is(err, proposals.ErrDecisionTimeout):
			e.stats.timeouts++
		case errors.Is(err, proposals.ErrNoHandler):
			e.stats.noHandler++
		}
		e.emit(action{kind: actFailure, fail: &failure{group: ln.group, attempt: a.attempt, count: len(ln.msgs), err: err}})
		if e.cfg.maxAttempts > 0 && a.attempt >= e.cfg.maxAttempts && e.isProposer(ln.group) && e.holdsFirst(ln) {
			e.startDeadLetter(ln, fmt.Sprintf("no routing decision after %d attempts: %v", a.attempt, err), now)
			return
		}
	}
	a.due = now.Add(e.backoff(a.attempt))
	heap.Push(&e.asks.retryQ, a)
	e.emit(action{kind: actRetry, at: a.due})
}

// atLimit takes a bind refused at the cluster's group limit: the node
// dead-letters the messages it holds (and records that, so that every
// node drops its copies) at once, without retrying, so that a flood of
// new groups leaves memory at the rate it is refused. Any node that holds
// the group's first message not covered by a record does so, not only
// the group's proposer: the proposer may not hold it (it skipped it while
// another node owned the group), and a fallback ask is then the only one.
// Two nodes that both do publish the same dead-letter ids (the
// dead-letter stream's duplicate window keeps one), and the second
// record ask finds the first record.
func (e *engine) atLimit(a *ask, d proposals.Decision, now time.Time) {
	ln := a.lane
	if ln.ask != a || e.lanes[ln.group] != ln || !ln.waiting {
		return // answered meanwhile
	}
	e.stats.limitRefused++
	if e.holdsFirst(ln) {
		e.startDeadLetter(ln, fmt.Sprintf("refused: the cluster's group limit is reached (%d groups bound, --max-groups)", d.Limit), now)
		return
	}
	e.failed(a, fmt.Errorf("%w: %s", proposals.ErrGroupLimit, d.Error), now)
}

// holdsFirst reports whether this node holds the group's first message
// that no record covers: the group has no record, or the lane starts right
// after the end of its ended record. Otherwise other nodes may hold earlier
// messages of the group (this node skipped them while another node owned
// it), which a dead-letter record through this lane's messages would make
// every node drop: the group then only waits, not dead-lettered.
func (e *engine) holdsFirst(ln *lane) bool {
	route, ok := e.recs.Lookup(ln.ref)
	if !ok || route.Invalid {
		return true
	}
	switch phase := route.Phase(); {
	case phase == kvbinding.PhaseDeadLettered && route.PrevNode == "":
		// Dead-lettered while no node owned it: no node routed or skipped
		// any of its messages since, so every node holds them all from
		// the record's end (a group refused at the group limit again).
		return len(ln.msgs) > 0 && ln.msgs[0].seq > route.ThroughSeq
	case phase.Ended():
		return len(ln.msgs) > 0 && ln.msgs[0].seq == route.ThroughSeq+1
	}
	return false
}

// startDeadLetter puts a waiting group's held messages on the dead-letter
// stream, then asks the handler to record that, so that every node drops
// them; later messages of the group get a new binding. The messages are
// written before the record: a crash in between leaves a duplicate in the
// dead-letter stream, never a loss.
func (e *engine) startDeadLetter(ln *lane, reason string, now time.Time) {
	e.dropAsk(ln)
	ln.deadLettering = true
	ln.waiting = false
	ln.dlqPending = len(ln.msgs)
	reasonFull := reason
	for _, m := range ln.msgs {
		ln.inflight++
		e.inflight++
		e.publish(ln, m, action{dlq: true, reason: reasonFull})
	}
	ln.ask = &ask{lane: ln, index: -1, p: proposals.Proposal{Op: proposals.OpDeadLetter, Group: ln.group,
		First: ln.msgs[0].seq, Seq: ln.msgs[len(ln.msgs)-1].seq, Reason: reason, Count: len(ln.msgs)}}
}

// deadLettered asks for the dead-letter record once every held message is
// on the dead-letter stream.
func (e *engine) deadLettered(ln *lane, now time.Time) {
	ln.deadLettering = false
	ln.changing = true
	a := ln.ask
	if a == nil {
		return
	}
	e.emit(action{kind: actDeadLettered, group: ln.group, count: a.p.Count, rev: a.p.Seq, reason: a.p.Reason})
	rev := uint64(0)
	if route, ok := e.recs.Lookup(ln.ref); ok {
		rev = route.Revision
	}
	a.after = rev
	e.asks.askQ = append(e.asks.askQ, ln)
	e.emit(action{kind: actAsk})
}

// failure is a failed bind attempt, for the shell to announce.
type failure struct {
	group   string
	attempt int
	count   int
	err     error
}

// touch records that a message of ln's group was routed now (idle
// expiry).
func (e *engine) touch(ln *lane, now time.Time) {
	if e.act.lastActive != nil {
		e.act.lastActive[ln.ref] = now.UnixNano()
	}
	if _, ok := e.act.recent[ln.group]; !ok && !e.act.recentMore {
		if len(e.act.recent) < kvbinding.MaxBusyListed {
			e.act.recent[ln.group] = struct{}{}
		} else {
			e.act.recentMore = true
		}
	}
}

// busyGroups returns the groups that had a message routed since the last
// call, or have messages held or in flight, at most kvbinding.MaxBusyListed
// (more: there were more), and starts the next period.
func (e *engine) busyGroups() (busy []string, more bool) {
	// The first MaxBusyListed in string order, whichever a map's order
	// offers them in: a heap of that many, not a sort of every lane (a
	// burst holds hundreds of thousands).
	top := newTopK(kvbinding.MaxBusyListed, func(a, b string) bool { return a < b })
	for g := range e.act.recent {
		top.offer(g)
	}
	for g, ln := range e.lanes {
		if _, listed := e.act.recent[g]; listed || g == "" || (len(ln.msgs) == 0 && ln.inflight == 0) {
			continue
		}
		top.offer(g)
	}
	more = e.act.recentMore || top.seen > kvbinding.MaxBusyListed
	clear(e.act.recent)
	e.act.recentMore = false
	return top.sorted(), more
}

// retryingGroups returns the groups with a publish waiting to be sent
// again, at most MaxBusyListed, in string order.
func (e *engine) retryingGroups() []string {
	if len(e.pubRetry) == 0 {
		return nil
	}
	top := newTopK(kvbinding.MaxBusyListed, func(a, b string) bool { return a < b })
	for _, r := range e.pubRetry {
		if g := r.ln.group; g != "" && !r.dlq {
			top.offer(g)
		}
	}
	return top.sorted()
}

// reap asks to release this node's groups idle for the group timeout.
// mine lists the refs of the groups bound here (Cache.RefsOf). It returns
// the refs of the long ids due, which it cannot name: the shell reads
// their ids and hands them to reapNamed.
func (e *engine) reap(mine []string, now time.Time) (unnamed []string) {
	for _, ref := range mine {
		if ref == "" {
			continue
		}
		if _, seen := e.act.lastActive[ref]; !seen {
			e.act.lastActive[ref] = now.UnixNano() // bound before this node started: idle from now
			continue
		}
		if !e.idle(ref, now) || e.fair.holding(ref) {
			// A group whose messages are held is not idle: they are yet
			// to reach its queue.
			continue
		}
		if kvbinding.IsRef(ref) {
			unnamed = append(unnamed, ref)
			continue
		}
		e.expire(ref, ref, now)
	}
	return unnamed
}

// reapNamed releases the long ids reap returned, by ref, if they are still
// idle.
func (e *engine) reapNamed(names map[string]string, now time.Time) {
	for ref, group := range names {
		if _, seen := e.act.lastActive[ref]; seen && e.idle(ref, now) {
			e.expire(group, ref, now)
		}
	}
}

// idle reports whether the group of ref, seen active, has been idle for
// the group timeout and is settled on this node.
func (e *engine) idle(ref string, now time.Time) bool {
	if now.UnixNano()-e.act.lastActive[ref] < e.cfg.groupTimeout.Nanoseconds() || e.laneOf(ref) != nil {
		return false
	}
	route, ok := e.recs.Lookup(ref)
	return ok && route.Settled() && route.Node == e.cfg.node
}

// expire asks to release an idle group.
func (e *engine) expire(group, ref string, now time.Time) {
	delete(e.act.lastActive, ref)
	ln := e.newLane(group, ref)
	e.askRelease(ln, e.position()-1, proposals.EventExpire, fmt.Sprintf("no message for %v (group-timeout)", e.cfg.groupTimeout), now)
}

// setLive takes the set of live nodes and their consumer presence. A group
// whose proposer left the set and is now this node is proposed at once,
// instead of after the fallback delay.
func (e *engine) setLive(state map[string]proposals.NodeState, now time.Time) {
	ids := make([]string, 0, len(state))
	for id := range state {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	e.view.live, e.view.state = ids, state
	moved := false
	for _, a := range e.asks.retryQ {
		if a.attempt == 0 && a.p.Op == "" && a.due.After(now) && e.isProposer(a.lane.group) {
			a.due, moved = now, true
		}
	}
	if moved {
		heap.Init(&e.asks.retryQ)
		e.emit(action{kind: actAsk})
	}
}

const (
	backoffBase = 100 * time.Millisecond
	backoffMax  = 5 * time.Second
)

// backoff is the pause before attempt+1: exponential, capped, jittered.
func (e *engine) backoff(attempt int) time.Duration {
	d := backoffBase << min(attempt-1, 10)
	if d > backoffMax || d <= 0 {
		d = backoffMax
	}
	return d/2 + time.Duration(e.rnd.Int64N(int64(d/2)+1))
}

// The shells' views of the engine and their pulls (input.go lists them).

// holds reports whether the node keeps held messages on its held subject
// (engineConfig.holds).
func (e *engine) holds() bool { return e.cfg.holds }

// stopping reports whether the engine was told to stop (inStop).
func (e *engine) stopping() bool { return e.closing }

// publishing reports how many publishes await their outcome.
func (e *engine) publishing() int { return e.inflight }

// fairBusy reports whether the fair shell has groups to release or
// watch: held groups, heavy ones, or lanes waiting for room.
func (e *engine) fairBusy() bool {
	return e.fair.heldGroups > 0 || e.fair.heavy > 0 || len(e.fairWait) > 0
}

// readFrom returns the ingress sequence the reader starts at and the
// resume checkpoint's next sequence (below it, gaps were seen before).
func (e *engine) readFrom() (start, next uint64) {
	return e.resume.start(), e.resume.ckpt.Next
}

// checkpoint pulls the node's checkpoint: its routing position and, when
// it has one, the groups taken from it lately (lostBook.snapshot, which
// prunes), with seen, the bindings revision the node applied.
func (e *engine) checkpoint(seen uint64, now time.Time) kvbinding.Checkpoint {
	c := e.track.checkpoint()
	if c.Next != 0 {
		c.Lost, c.Seen = e.lost.snapshot(now), seen
	}
	return c
}

// undecided offers every lane waiting for a decision, with how long its
// oldest message has waited: the time the lane was first offered with
// that oldest message (a pull: it marks the lanes it offers).
func (e *engine) undecided(now time.Time, offer func(kvbinding.HeldGroup)) {
	for g, ln := range e.lanes {
		if !ln.waiting || len(ln.msgs) == 0 {
			continue
		}
		if seq := ln.msgs[0].seq; ln.heldSeq != seq || ln.heldAt == 0 {
			ln.heldSeq, ln.heldAt = seq, now.UnixNano()
		}
		offer(kvbinding.HeldGroup{Group: g, Count: len(ln.msgs), OldestSeq: ln.heldSeq, Since: time.Unix(0, ln.heldAt).UTC()})
	}
}
