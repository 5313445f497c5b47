package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

var (
	errSimPublish = errors.New("sim: publish failed")
	errSimTimeout = errors.New("sim: timed out")
	// errSimDupBatch: JetStream refused an atomic batch holding a message
	// id it stored before.
	errSimDupBatch = errors.New("sim: atomic publish batch contains duplicate message id")
	// errSimShortBatch: the servers ended a fast-ingest batch at once, its
	// first message being a duplicate.
	errSimShortBatch = errors.New("sim: batch not stored whole")
	errSimOp         = errors.New("sim: operation failed")
	errSimCancel     = errors.New("sim: canceled")
	// errSimSuperseded: a takeover step's record moved past its revision
	// (errSuperseded).
	errSimSuperseded = errors.New("sim: the record moved past the step's revision")
	// errSimFenced: this node may not delete what it moves now
	// (errFencedNow).
	errSimFenced = errors.New("sim: fenced")
)

// simNode is one incarnation of a router node: the real lane engine
// (engine.go), called as the Router's shells call it, with simulated I/O.
// A crash ends the incarnation (everything in memory is lost); a restart
// is a new simNode that loads its checkpoint and the bindings afresh.
type simNode struct {
	w     *simWorld
	id    string
	local bool

	started  bool
	stopping bool // SIGTERM: draining
	dead     bool

	eng   *engine
	cache *kvbinding.Cache
	// strays: the engine's stray outcomes already reported.
	strays uint64
	// instance and startedAt: the process, as its announcements name it.
	instance  string
	startedAt time.Time
	// view: the real LiveView of the liveness records; viewSub its
	// watch.
	view    *kvbinding.LiveView
	viewSub *simSub[simRegEntry]
	// suspects: nodes a takeover event named, not counted on until
	// they announce again (Router.suspects).
	suspects suspectSet
	kvSub    *simSub[simKVEntry]
	term     *simHandler // the handler term this node runs, if any

	readPos     uint64
	readBusy    bool
	readIdle    bool // waits for the ingress to grow
	readBlocked bool // waits for the engine to have room

	askWake  chan struct{} // the real asker's wake (actAsk)
	fairWake chan struct{} // the real fair shell's wake (actFairWake)
	// expiryWake: the live view's expiry check's wake (every
	// simExpiryCheck); liveDirty: the view changed since the node last
	// took its live set (onLiveChange).
	expiryWake    chan struct{}
	expiryPending bool
	liveDirty     atomic.Bool
	timerWake     chan struct{} // the real timers' wake (actRetry)

	changes chan string   // the cache's notifications, to the real change loop
	applied atomic.Uint64 // the change loop's (the checkpoint's Seen; not simulated)

	// The real hand-over shell and publisher (sim_shell_test.go), its
	// context's end (nil once ended) and the calls it waits on.
	ho       *handOver
	pub      *publisher
	live     *liveness
	shellCtx context.Context
	shellEnd context.CancelFunc
	pending  map[*simPending]bool
	moving   map[uint64]bool // messages whose copy is published and original not yet deleted

	flights []*simFlight

	announceFailUntil time.Duration
	// liveUntil: until when the last stored announcement keeps the
	// liveness record sure to exist (liveness.until).
	liveUntil time.Time
	// renewedAt: when the announcement that renewed the node's liveness
	// after its last lapse was stored (-1: none yet); lastAnnounced: when
	// its last announcement was.
	renewedAt, lastAnnounced time.Duration
}

// simFlight is a publish on its way to the server.
type simFlight struct {
	p       simPub
	sent    time.Duration
	landed  bool
	dropped bool
	batch   *simBatch // the atomic batch it is a part of, if any
}

// simBatch is a batch on its way. An atomic one's flights land together,
// or none does. A fast-ingest one's (fast, R1) land one by one, in order:
// the servers end it at its first message that does not reach them (cut:
// a publish failure, a crash), or at once when its first message is a
// duplicate; a later duplicate is skipped.
type simBatch struct {
	flights []*simFlight
	fast    bool
	last    uint64 // the stream sequence of the last message it stored
}

// doomed reports whether the batch, should it land now, would store
// nothing: an atomic batch holding a message id stored within the
// duplicate window (refused whole), a fast-ingest batch whose first one
// is (ended at once). False for no batch.
func (b *simBatch) doomed(q *simQueues) bool {
	if b == nil {
		return false
	}
	stored := func(f *simFlight) bool {
		r, ok := q.ids[f.p.id]
		return ok && q.w.clock-r.at < queueDuplicates
	}
	if b.fast {
		return stored(b.flights[0])
	}
	return slices.ContainsFunc(b.flights, stored)
}

// landFast has a fast-ingest batch's first cut messages reach the server
// (the rest never do): each is stored in order, a duplicate skipped,
// unless the first is a duplicate, which ends the batch there. It reports
// whether the batch was taken whole.
func (b *simBatch) landFast(n *simNode, cut int) bool {
	doomed := b.doomed(n.w.q)
	for i, f := range b.flights {
		if f.landed || f.dropped {
			continue
		}
		if i >= cut || (doomed && i > 0) {
			f.dropped = true
			continue
		}
		f.landed = true
		if sseq, dup := n.w.q.store(n.id, f.p); !dup {
			b.last = sseq
		}
	}
	if doomed {
		n.w.logf("queue", "ended a fast batch of %d from %s at once: its first message was stored before", len(b.flights), n.id)
	}
	return cut == len(b.flights) && !doomed
}

// land has the batch reach the server: every message is stored, or, when
// one's id is stored already within the duplicate window, none (JetStream
// refuses such an atomic batch whole, err_code 10201). It reports which.
func (b *simBatch) land(n *simNode) bool {
	if b.fast {
		return b.landFast(n, len(b.flights))
	}
	q := n.w.q
	stored := !b.doomed(q)
	for _, f := range b.flights {
		if stored {
			f.landed = true
			b.last, _ = q.store(n.id, f.p)
		} else {
			f.dropped = true
		}
	}
	if !stored {
		n.w.logf("queue", "refused a batch of %d from %s: it holds a message stored before", len(b.flights), n.id)
	}
	return stored
}

func newSimNode(w *simWorld, id string, local bool) *simNode {
	return &simNode{w: w, id: id, local: local, moving: map[uint64]bool{}, renewedAt: -1}
}

// up: running (not stopping, not dead). alive: the process exists.
func (n *simNode) up() bool    { return n.started && !n.dead && !n.stopping }
func (n *simNode) alive() bool { return n.started && !n.dead }

func (n *simNode) logf(format string, args ...any) { n.w.logf(n.id, format, args...) }

// start is Router.Run: load the bindings, the registry and the checkpoint,
// announce, pick up changes in progress, then route.
func (n *simNode) start() {
	w := n.w
	p := w.p
	n.started = true
	n.suspects = suspectSet{} // a new process suspects nobody
	n.strays = 0
	n.instance, n.startedAt = fmt.Sprintf("%s@%s", n.id, w.clock), w.now()
	n.cache = w.kv.cache()
	n.changes = make(chan string, 4096) // Router's
	n.kvSub = w.kv.log.subscribe(n.id, n.onRecord)
	n.view, n.viewSub = w.reg.view(n.id, func() { n.liveDirty.Store(true) }, n.liveChanged)
	n.liveDirty.Store(false) // the start takes the live set below
	n.eng = newEngine(engineConfig{
		node: n.id, maxHeldMessages: p.maxHeld, maxHeldBytes: DefaultMaxHeldBytes, maxInFlight: p.maxInFlight,
		maxAttempts: p.maxAttempts, timeout: p.timeout, localFirst: p.localFirst, groupTimeout: p.groupTimeout,
		maxBatch: p.maxBatch, maxBatches: p.maxBatches, maxBatchBytes: maxBatchBytes,
		spillFrom: p.spillFrom, maxSpilledBytes: p.maxSpilled,
		groupShare: p.groupShare, holds: p.groupShare > 0,
	}, n.cache, rand.New(rand.NewPCG(w.rng.Uint64(), w.rng.Uint64())))
	ckpt := w.reg.ckpt[n.id]
	n.step(inBegin{resume: resumePoint{ckpt: ckpt}})
	n.onLiveChange()
	if n.eng.holds() {
		// Router.restoreHeld, on the queue stream's state (this node's
		// held subject), before anything is routed.
		found := heldFound(w.q.subjects(HeldFilter(n.id, "*.*")), n.id, n.cache.Lookup, slog.New(simLogHandler{w: w, node: n.id}))
		if len(found) > 0 {
			groups := make(map[string]string, len(found))
			for ref := range found {
				groups[ref] = ref // the simulation's group ids are short: their own refs
			}
			n.step(inHeldFound{counts: found, groups: groups})
		}
	}
	n.readPos = max(n.eng.resume.start(), 1)
	n.logf("starts (resume at %d, checkpoint %v)", n.readPos, ckpt)
	n.startShells()
	if n.local {
		n.every(simLeaseTick/2, n.standbyTick)
	}
	n.step(inChanged{refs: dutiesOf(n.cache, n.id)})
	if p.groupTimeout > 0 {
		n.every(p.reaperPeriod, n.reapTick)
	}
	n.scheduleRead()
}

// every runs fn every d while the node runs.
func (n *simNode) every(d time.Duration, fn func()) {
	var tick func()
	tick = func() {
		if !n.up() {
			return
		}
		fn()
		n.w.after(d, tick)
	}
	n.w.after(n.w.between(d/2, d), tick)
}

// step is Router.step: hand the engine one input through its door, then
// carry out its actions.
func (n *simNode) step(in input) {
	if !n.alive() {
		return
	}
	n.eng.step(in, n.w.now())
	if s := n.eng.stats.strayOutcomes; s > n.strays {
		// engine.outcome: an outcome always finds its lane and message.
		n.w.chk.violation("stray outcome", "%s: %d publish outcomes found no publish in flight", n.id, s-n.strays)
		n.strays = s
	}
	n.performTaken()
}

// performTaken carries out the actions the engine emitted, as
// Router.unlockAndPerform does.
func (n *simNode) performTaken() {
	for _, a := range n.eng.take() {
		n.perform(a)
	}
	if n.readBlocked && !n.eng.full() {
		n.readBlocked = false
		n.scheduleRead()
	}
}

func (n *simNode) perform(a action) {
	switch a.kind {
	case actPublish:
		n.pub.publish(a)
	case actBatch:
		n.pub.publishBatch(a)
	case actAsk:
		n.w.wake(func() { wake(n.askWake) })
	case actRetry:
		n.w.wake(func() { wake(n.timerWake) })
	case actDuty:
		n.logf("duty %v for %q at rev %d", a.duty, a.group, a.rev)
		ho := n.ho
		n.w.wake(func() { ho.duties.add(a.group, a.duty, a.rev) })
	case actDeadLettered:
		n.logf("dead-lettered %d messages of %q through %d: %s", a.count, a.group, a.rev, a.reason)
	case actFailure:
		n.logf("no decision for %q (attempt %d): %v", a.fail.group, a.fail.attempt, a.fail.err)
	case actFairWake:
		n.w.wake(func() { wake(n.fairWake) })
	case actHold:
		n.logf("hold %v for %q (%d messages)", a.on, a.group, a.count)
	}
}

// onRecord takes a bindings watch delivery, as kvbinding.Cache does, and
// sends the change to the node's real change loop (notify).
func (n *simNode) onRecord(e simKVEntry) {
	if !n.alive() {
		return
	}
	var changed bool
	if e.value == nil {
		changed = n.cache.Feed().Delete(e.key, e.rev)
	} else {
		changed = n.cache.Feed().Put(e.key, e.value, e.rev)
	}
	if changed {
		n.notify(e.group)
	}
}

// applyOwn is Cache.Apply of a record this node's handler wrote.
func (n *simNode) applyOwn(b kvbinding.Binding) {
	if n.alive() && n.cache.Apply(b) {
		n.notify(b.Group)
	}
}

// notify sends a change to the node's real change loop (runChanges), as
// the cache's notifications reach the router: over a channel, in order.
func (n *simNode) notify(group string) {
	if r, ok := n.cache.Lookup(group); ok {
		n.logf("sees %q: %s", group, simRoute(r))
	} else {
		n.logf("sees %q: no record", group)
	}
	ch := n.changes
	n.w.wake(func() {
		select {
		case ch <- group:
		default:
			panic("sim: a node's change channel is full")
		}
	})
}

func simRoute(r kvbinding.Binding) string {
	s := fmt.Sprintf("%s node=%s from=%d through=%d prev=%s rev=%d", r.State, r.Node, r.FromSeq, r.ThroughSeq, r.PrevNode, r.Revision)
	if r.Step != kvbinding.StepNone {
		s += fmt.Sprintf(" step=%s drain=%v", r.Step, r.Drain)
	}
	return s
}

// liveChanged runs onLiveChange if the live view changed (its OnChange
// only marks it: the view's expiry check runs in a shell's goroutine),
// and arranges the view's next expiry check.
func (n *simNode) liveChanged() {
	if n.liveDirty.Swap(false) {
		n.onLiveChange()
	}
	if n.expiryWake != nil {
		n.scheduleExpiry()
	}
}

// liveStored is the registry's lookup of node's liveness record
// (Registry.Run's expiry check), over n's link.
func (n *simNode) liveStored(ctx context.Context, node string) (has bool, err error) {
	w := n.w
	err = n.shellCall(ctx, simKey{"live record", node}, func(p *simPending) {
		var got bool
		n.roundTrip(p, w.p.pKVFail, func() { _, got = w.reg.live[node] }, func() { has = got })
	})
	return has, err
}

// onLiveChange is Router.onLiveChange: the real liveNodes, with the real
// suspectSet.
func (n *simNode) onLiveChange() {
	if !n.alive() || n.eng == nil {
		return
	}
	n.step(inLive{state: liveNodes(n.view.Live(), n.view.Seen, &n.suspects)})
}

// The ingress reader (Router.read and Router.ingest, with the real
// decoder).

func (n *simNode) scheduleRead() {
	w := n.w
	if n.readBusy || !n.up() {
		return
	}
	n.readBusy = true
	d := w.between(20*time.Microsecond, 500*time.Microsecond)
	if w.chance(w.p.pSlow) {
		d = w.between(200*time.Millisecond, 3*time.Second) // the ordered consumer is reset
	}
	w.hop(n.id, d, n.read)
}

func (n *simNode) read() {
	w := n.w
	n.readBusy = false
	if !n.up() {
		return
	}
	if n.readPos > uint64(len(w.ingress)) {
		n.readIdle = true
		return
	}
	if n.eng.full() {
		n.readBlocked = true
		return
	}
	m := w.ingress[n.readPos-1]
	n.readPos++
	in := decoder{DefaultGroupHeader}.decode(ingressMsg{seq: m.seq, msg: w.ingressMsg(m.seq)})
	n.step(inMsg{group: in.group, m: in.m})
	n.scheduleRead()
}

func (n *simNode) ingressGrew() {
	if n.readIdle {
		n.readIdle = false
		n.scheduleRead()
	}
}

func simProposals(ps []proposals.Proposal) string {
	s := ""
	for i, p := range ps {
		if i > 0 {
			s += ", "
		}
		op := p.Op
		if op == "" {
			op = proposals.OpBind
		}
		s += fmt.Sprintf("%s %q", op, p.Group)
		if p.Node != "" {
			s += " node=" + p.Node
		}
		if p.Seq != 0 {
			s += fmt.Sprintf(" seq=%d", p.Seq)
		}
		if p.Rev != 0 {
			s += fmt.Sprintf(" rev=%d", p.Rev)
		}
		if p.Clean {
			s += " clean"
		}
	}
	return "[" + s + "]"
}

func simDecisions(ds []proposals.Decision, err error) string {
	if err != nil {
		return err.Error()
	}
	s := ""
	for i, d := range ds {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s rev=%d", d.Outcome, d.Revision)
		if d.Error != "" {
			s += " (" + d.Error + ")"
		}
	}
	return "[" + s + "]"
}

// propose is proposals.Client.Propose: one request to the active handler,
// answered within the timeout or failed.
func (n *simNode) propose(ps []proposals.Proposal, cb func([]proposals.Decision, error)) {
	w := n.w
	if _, err := proposals.EncodeRequest(proposals.Request{Proposer: n.id, Proposals: ps}); err != nil {
		w.chk.violation("protocol", "%s asks what the protocol refuses: %v", n.id, err)
		return
	}
	done := false
	finish := func(ds []proposals.Decision, err error) {
		if done || !n.alive() {
			return
		}
		done = true
		cb(ds, err)
	}
	w.after(w.p.timeout, func() {
		finish(nil, fmt.Errorf("%w after %v", proposals.ErrDecisionTimeout, w.p.timeout))
	})
	if w.chance(w.p.pDrop) {
		n.logf("request lost: %s", simProposals(ps))
		return
	}
	w.hop(n.id, w.lat(), func() {
		h := w.activeHandler()
		if h == nil {
			w.hop(n.id, w.lat(), func() { finish(nil, proposals.ErrNoHandler) })
			return
		}
		// The request crosses the handler's link, and the reply too.
		w.hop(h.host.id, 0, func() {
			h.serve(n.id, ps, func(ds []proposals.Decision) {
				if w.chance(w.p.pDrop) {
					w.logf(h.host.id, "reply to %s lost", n.id)
					return
				}
				w.hop(h.host.id, 0, func() {
					w.hop(n.id, w.lat(), func() { finish(ds, nil) })
				})
			})
		})
	})
}

// The servers' side of a publish (the real publisher's stand-in,
// simSender, sends through these).

// send publishes p; cb gets the stream sequence (the first copy's for a
// duplicate) or an error, unless the node died meanwhile.
func (n *simNode) send(p simPub, cb func(sseq uint64, dup bool, err error)) {
	w := n.w
	if r, ok := n.cache.Lookup(p.group); ok {
		p.view = r.Revision
	}
	f := &simFlight{p: p, sent: w.clock}
	n.track(f)
	// The answer is the PubAck, an error, or the client's timeout,
	// whichever comes first; a publish the link holds lands at its heal.
	replied := false
	reply := func(sseq uint64, dup bool, err error) {
		if replied || !n.alive() {
			return
		}
		replied = true
		cb(sseq, dup, err)
	}
	w.after(simPubTimeout, func() { reply(0, false, errSimTimeout) })
	if w.chance(w.p.pPubFail) {
		w.hop(n.id, w.lat(), func() {
			if f.landed || f.dropped {
				return
			}
			f.dropped = true
			reply(0, false, errSimPublish)
		})
		return
	}
	land := w.lat()
	if w.chance(w.p.pLate) {
		// The client's buffer is flushed after a reconnect.
		land = w.between(simPubTimeout, simPubTimeout+3*time.Second)
	}
	lost := w.chance(w.p.pAckLost)
	w.hop(n.id, land, func() {
		if f.landed || f.dropped {
			return
		}
		f.landed = true
		sseq, dup := w.q.store(n.id, p)
		if !lost {
			w.hop(n.id, w.lat(), func() { reply(sseq, dup, nil) })
		}
	})
}

// track adds f to the node's publishes on their way.
func (n *simNode) track(f *simFlight) {
	if len(n.flights) > 64 {
		live := n.flights[:0]
		for _, g := range n.flights {
			if !g.landed && !g.dropped {
				live = append(live, g)
			}
		}
		clear(n.flights[len(live):])
		n.flights = live
	}
	n.flights = append(n.flights, f)
	n.w.chk.publishing(n.id, f)
}

// sendBatch publishes ps as one batch, an atomic or a fast-ingest one: cb
// gets the stream sequence of the last message stored and nil once all
// are stored, or an error (of an atomic batch none stored, or all: an ack
// lost; of a fast-ingest one, a prefix may be), unless the node died
// meanwhile.
func (n *simNode) sendBatch(ps []simPub, fast bool, cb func(last uint64, err error)) {
	w := n.w
	b := &simBatch{fast: fast}
	for _, p := range ps {
		if r, ok := n.cache.Lookup(p.group); ok {
			p.view = r.Revision
		}
		f := &simFlight{p: p, sent: w.clock, batch: b}
		b.flights = append(b.flights, f)
		n.track(f)
	}
	w.chk.stats.batches++
	w.chk.stats.batchMsgs += uint64(len(ps))
	if b.fast {
		w.chk.stats.fastBatches++
	}
	settled := func() bool { return b.flights[0].landed || b.flights[0].dropped }
	// As send: the first of the answer and the client's timeout.
	replied := false
	reply := func(err error) {
		if replied || !n.alive() {
			return
		}
		replied = true
		if err != nil {
			w.chk.stats.batchFailures++
		}
		cb(b.last, err)
	}
	w.after(simPubTimeout, func() { reply(errSimTimeout) })
	if b.fast && w.chance(w.p.pPubFail) {
		// The servers take a prefix, then report the rest as a gap or
		// refused.
		cut := w.rng.IntN(len(ps))
		w.hop(n.id, w.lat(), func() {
			if !settled() {
				b.landFast(n, cut)
			}
			w.hop(n.id, w.lat(), func() { reply(errSimPublish) })
		})
		return
	}
	if w.chance(w.p.pPubFail) {
		w.hop(n.id, w.lat(), func() {
			if settled() {
				return
			}
			for _, f := range b.flights {
				f.dropped = true
			}
			reply(errSimPublish)
		})
		return
	}
	land := w.lat()
	if w.chance(w.p.pLate) {
		land = w.between(simPubTimeout, simPubTimeout+3*time.Second)
	}
	lost := w.chance(w.p.pAckLost)
	w.hop(n.id, land, func() {
		if settled() {
			return
		}
		stored := b.land(n)
		if lost {
			return
		}
		w.hop(n.id, w.lat(), func() {
			switch {
			case stored:
				reply(nil)
			case b.fast:
				reply(errSimShortBatch)
			default:
				reply(errSimDupBatch)
			}
		})
	})
}

// Liveness, checkpoints, the reaper.

func (n *simNode) reapTick() {
	mine := simRefsOf(n.cache, n.id)
	if !n.alive() {
		return
	}
	n.eng.reap(mine, n.w.now()) // a pull: the sim keeps no long ids to name
	n.performTaken()
}

// Crash and stop.

// crash ends the process at once: in-memory state is lost; a publish on
// its way lands now or never; its liveness record expires by its TTL.
func (n *simNode) crash() {
	n.logf("crashes")
	n.kill()
}

func (n *simNode) kill() {
	w := n.w
	if !n.started || n.dead {
		return
	}
	// Messages whose dead-letter record was not written yet: they are on
	// the dead-letter stream and will be routed again (the window
	// startDeadLetter's comment names).
	for _, g := range sortedKeys(n.eng.lanes) {
		ln := n.eng.lanes[g]
		if ln.deadLettering || (ln.ask != nil && ln.ask.p.Op == proposals.OpDeadLetter) {
			for _, m := range ln.msgs {
				w.chk.dlqCrash[m.seq] = true
			}
		}
	}
	n.dead, n.stopping = true, false
	n.endShells()
	n.kvSub.stopped = true
	n.viewSub.stopped = true
	if n.term != nil {
		n.term.die()
	}
	for _, f := range n.flights {
		if f.landed || f.dropped {
			continue
		}
		if f.batch != nil && f.batch.fast {
			// What was sent of a fast-ingest batch lands, in order: a
			// prefix of it.
			f.batch.landFast(n, w.rng.IntN(len(f.batch.flights)+1))
			continue
		}
		if f.batch != nil {
			// An atomic batch lands whole or not at all.
			if w.rng.IntN(2) == 0 {
				f.batch.land(n)
			} else {
				for _, g := range f.batch.flights {
					g.dropped = true
				}
			}
			continue
		}
		if w.rng.IntN(2) == 0 {
			f.landed = true
			w.q.store(n.id, f.p)
		} else {
			f.dropped = true
		}
	}
	n.flights = nil
	// What it routed past its saved checkpoint is routed again after a
	// restart, or by whoever takes its groups from the checkpoint.
	saved := resumePoint{ckpt: w.reg.ckpt[n.id]}
	for _, e := range w.q.all {
		if e.by == n.id && !saved.done(e.seq) {
			w.chk.pastCheckpoint[e.seq] = true
		}
	}
}

// stop is SIGTERM: Router.Run's end and drain (in-flight publishes
// finish, the checkpoint is saved, the liveness record withdrawn, the
// handler lease released).
func (n *simNode) stop(then func()) {
	w := n.w
	n.logf("stops (SIGTERM)")
	n.stopping = true
	n.step(inStop{}) // Router.drain
	n.endShells()
	if n.term != nil {
		n.term.standDown("stopped")
		n.term = nil
	}
	deadline := w.clock + 5*time.Second
	var wait func()
	wait = func() {
		if n.dead {
			return
		}
		if n.eng.inflight > 0 && w.clock < deadline {
			w.after(10*time.Millisecond, wait)
			return
		}
		c := n.checkpoint()
		w.hop(n.id, w.lat(), func() {
			if c.Next > 0 && !w.chance(w.p.pKVFail) {
				w.reg.saveCheckpoint(n.id, c)
			}
			w.hop(n.id, w.lat(), func() {
				if !w.chance(w.p.pKVFail) {
					w.reg.withdraw(n.id)
				}
				n.logf("stopped (checkpoint %v)", c)
				n.kill()
				then()
			})
		})
	}
	wait()
}
