package router

import (
	"errors"
	"maps"
	"strings"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// simHandler is one term of a LOCAL handler (proposals.Handler while it
// holds the lease), on its host node: it decides with the real Transition
// on the host's cache, writes with create or compare-and-set, pauses
// queues before drains, and runs the monitor (evacuations, rebinds,
// overdue fences, pause renewals) on every lease tick.
type simHandler struct {
	w      *simWorld
	host   *simNode
	id     string
	dead   bool
	died   bool // with its process: the lease was not released
	diedAt time.Duration
	// authUntil: until when this term may decide, by its own clock
	// (proposals.AuthorityEnd of its last successful renewal's send);
	// lapsed: it stopped deciding at that time, the lease not released.
	authUntil time.Duration
	lapsed    bool

	suspect      string
	suspectSince time.Duration

	// mon is the real monitor planner's state (proposals.MonitorState).
	mon    proposals.MonitorState
	paused map[string]time.Duration
	// pausing: per node, the writes in flight that paused it (from
	// their pause until they settle), for the checker.
	pausing map[string]int
	// apiTail: per node, when this term's last pause or resume call
	// reaches the server: calls on one connection are applied in order.
	apiTail map[string]time.Duration
	// catchUps: since when records catch up groups from each node no
	// record drains (proposals.TrackCatchUps).
	catchUps map[string]time.Time
}

// simProbeGone is how long a standby takes to find, by probing, that the
// active handler's process is gone (two probes 250 ms apart).
const simProbeGone = 500 * time.Millisecond

// handlerless reports whether no handler was active at some moment of
// [from, to].
func (w *simWorld) handlerless(from, to time.Duration) bool {
	for _, g := range w.gaps {
		if g.from <= to && (g.to < 0 || from < g.to) {
			return true
		}
	}
	return false
}

// gapOpens and gapCloses record when no handler is active.
func (w *simWorld) gapOpens() {
	if n := len(w.gaps); n == 0 || w.gaps[n-1].to >= 0 {
		w.gaps = append(w.gaps, simGap{from: w.clock, to: -1})
	}
}

func (w *simWorld) gapCloses() {
	if n := len(w.gaps); n > 0 && w.gaps[n-1].to < 0 {
		w.gaps[n-1].to = w.clock
	}
}

// simGap is a stretch of time without an active handler (to < 0: open).
type simGap struct{ from, to time.Duration }

func (w *simWorld) activeHandler() *simHandler {
	if t := w.lease.term; t != nil && !t.dead {
		return t
	}
	return nil
}

// standbyTick is a LOCAL node's lease loop while it is not active: it
// acquires the lease when it is free, expired, or held by a handler whose
// process the probes found gone.
func (n *simNode) standbyTick() {
	w := n.w
	if n.term != nil && !n.term.dead {
		return
	}
	n.term = nil
	if w.cutOff(n.id) {
		return // its acquire cannot reach the servers
	}
	l := &w.lease
	if t := l.term; t != nil {
		expired := w.clock-l.renewed > simLeaseTTL
		if !t.dead && !expired {
			return
		}
		// Probes find a handler's process gone only when its ping
		// subject has no responders; behind a black-holed link they time
		// out, and the standby waits for the lease to expire.
		if t.dead && !expired && (w.clock-t.diedAt < simProbeGone || w.cutOff(t.host.id)) {
			return
		}
		if !t.dead {
			if t.holds() {
				w.chk.violation("authority", "%s's lease expired at the servers while it may still decide by its own clock (until %.3fs)", t.host.id, t.authUntil.Seconds())
			}
			t.standDown("its lease expired")
		}
	}
	if w.chance(w.p.pKVFail) {
		return // acquire failed; next tick
	}
	t := &simHandler{w: w, host: n, id: "grouping-handler/" + n.id, paused: map[string]time.Duration{},
		apiTail: map[string]time.Duration{}, pausing: map[string]int{}, catchUps: map[string]time.Time{}}
	if prev := w.lease.last; prev != "" && prev != n.id {
		// suspectPrevious: the previous holder's node is ineligible until it
		// announces again.
		t.suspect, t.suspectSince = prev, w.clock
	}
	l.term, l.renewed, l.last = t, w.clock, n.id
	n.term = t
	t.grant(w.clock)
	w.gapCloses()
	n.logf("handler active")
	// The takeover event (Router.subscribeTakeovers): every node that hears
	// it retries its failed asks at once, and stops counting on the previous
	// holder's node, when the lease was not released, until it announces
	// again (the real suspectSet).
	for _, m := range w.nodes {
		suspect := t.suspect
		w.hop(m.id, w.lat(), func() {
			if !m.up() || m.eng == nil {
				return
			}
			if suspect != "" && suspect != m.id {
				m.suspects.add(suspect, w.now())
				m.onLiveChange()
			}
			m.step(inRetry{})
		})
	}
	var tick func()
	tick = func() {
		if t.dead || !n.up() {
			return
		}
		t.tick()
		w.after(simLeaseTick, tick)
	}
	w.after(simLeaseTick, tick)
}

// die ends the term with its process.
func (h *simHandler) die() {
	if h.dead {
		return
	}
	h.dead, h.died, h.diedAt = true, true, h.w.clock
	h.w.gapOpens()
	h.w.logf(h.host.id, "handler dies with its node")
}

// standDown ends the term and gives the lease up.
func (h *simHandler) standDown(why string) {
	if h.dead {
		return
	}
	h.dead, h.diedAt = true, h.w.clock
	// The release is a delete over the host's link: a cut one loses it.
	if h.w.lease.term == h && !h.w.cutOff(h.host.id) {
		h.w.lease.term = nil
	}
	h.w.gapOpens()
	h.w.logf(h.host.id, "handler stands down: %s", why)
}

// holds reports whether the term may decide now, by its own clock.
func (h *simHandler) holds() bool { return !h.dead && h.w.clock < h.authUntil }

// grant records a renewal (or the acquisition) sent at sent that
// succeeded, and arms the end of the authority it gives (Handler.Run's
// authEnd timer).
func (h *simHandler) grant(sent time.Duration) {
	w := h.w
	until := proposals.AuthorityEnd(simEpoch().Add(sent), simLeaseTTL).Sub(simEpoch())
	if until <= h.authUntil {
		return
	}
	h.authUntil = until
	w.after(until-w.clock, func() {
		if !h.dead && !h.holds() {
			h.lapse("no renewal succeeded in time")
		}
	})
}

// lapse is Handler.Run's lapsed: the term stops deciding by its own
// clock. It cannot release the lease (it may be cut off from the
// servers): the lease expires there, or a standby that finds the process
// without an active handler breaks it.
func (h *simHandler) lapse(why string) {
	if h.dead {
		return
	}
	h.dead, h.lapsed, h.diedAt = true, true, h.w.clock
	h.w.chk.stats.lapses++
	if h.host.term == h {
		h.host.term = nil
	}
	h.w.gapOpens()
	h.w.logf(h.host.id, "handler: lease not renewed within its TTL by its own clock: stops deciding (%s)", why)
}

// tick is the active handler's lease loop: renew (a compare-and-set
// over the host's link), then watchNodes.
func (h *simHandler) tick() {
	w := h.w
	if !h.holds() {
		h.lapse("no renewal succeeded in time")
		return
	}
	sent := w.clock
	fail := w.chance(w.p.pKVFail)
	w.hop(h.host.id, w.lat(), func() {
		if fail || w.lease.term != h {
			return
		}
		w.lease.renewed = w.clock
		w.hop(h.host.id, w.lat(), func() {
			if !h.dead {
				h.grant(sent)
			}
		})
	})
	h.watchNodes()
}

// liveState is Handler.liveState: the real proposals.LiveState, on the
// host's live view.
func (h *simHandler) liveState() map[string]proposals.NodeState {
	return proposals.LiveState(h.w.now(), h.host.view, h.host.cache.Counts(), h.suspect, simEpoch().Add(h.suspectSince))
}

// serve is Handler.serve / DecideAll: decide every proposal on the cached
// record, write, then reply once every write is done.
func (h *simHandler) serve(proposer string, ps []proposals.Proposal, reply func([]proposals.Decision)) {
	w := h.w
	if !h.holds() {
		return
	}
	env := proposals.Env{Now: w.now(), Handler: h.id, Live: h.liveState(), MaxGroups: w.p.maxGroups, Bound: h.host.cache.Bound()}
	out := make([]proposals.Decision, len(ps))
	pending := 1
	finish := func() {
		pending--
		if pending == 0 && !h.dead {
			reply(out)
		}
	}
	for i, p := range ps {
		out[i] = proposals.Decision{Group: p.Group, Outcome: proposals.Failed}
		if err := p.Validate(); err != nil {
			out[i].Error = "invalid proposal: " + err.Error()
			continue
		}
		in := p.Input(proposer)
		if in.Op == proposals.OpDeadLetter {
			env.IngressLast = uint64(len(w.ingress))
		}
		var cur *kvbinding.Binding
		if r, ok := h.host.cache.Lookup(p.Group); ok {
			cur = &r
		}
		res := proposals.Transition(p.Group, cur, in, env)
		if res.Write != nil && res.Write.State == kvbinding.StateBound && p.Group != "" {
			if cur == nil || cur.Invalid || (cur.State != kvbinding.StateBound && cur.State != kvbinding.StateMoving) {
				env.Bound++
			}
			if st, ok := env.Live[res.Write.Node]; ok {
				st.Groups++
				env.Live[res.Write.Node] = st
			}
		}
		pending++
		i, p := i, p
		h.carryOut(cur, res, p, nil, nil, func(d proposals.Decision) {
			out[i] = d
			finish()
		})
	}
	finish()
}

// carryOut is Handler.carryOut: pause, then write, then settle. stored,
// if not nil, is called when the write is stored.
func (h *simHandler) carryOut(cur *kvbinding.Binding, res proposals.Result, p proposals.Proposal, stored func(), guard func() error, done func(proposals.Decision)) {
	if res.Write == nil {
		done(h.unwritten(cur, res, p))
		return
	}
	if !h.holds() {
		done(proposals.Decision{Group: p.Group, Outcome: proposals.Failed, Error: "no authority"})
		return
	}
	for _, node := range res.Pause {
		h.pausing[node]++
	}
	settled := false
	settle := func(d proposals.Decision) {
		if !settled {
			settled = true
			for _, node := range res.Pause {
				h.pausing[node]--
			}
		}
		done(d)
	}
	var pauseNext func(i int)
	pauseNext = func(i int) {
		if i < len(res.Pause) {
			h.pause(res.Pause[i], func(err error) {
				if err != nil {
					settle(proposals.Decision{Group: p.Group, Outcome: proposals.Failed, Error: "cannot pause the queue of " + res.Pause[i]})
					return
				}
				pauseNext(i + 1)
			})
			return
		}
		var rev uint64
		if cur != nil {
			rev = cur.Revision
		}
		if !h.holds() {
			settle(proposals.Decision{Group: p.Group, Outcome: proposals.Failed, Error: "no authority"})
			return
		}
		if guard != nil {
			if err := guard(); err != nil {
				settle(proposals.Decision{Group: p.Group, Outcome: proposals.Failed, Error: err.Error()})
				return
			}
		}
		h.kvWrite(*res.Write, res.Create, rev, res.Ended, stored, func(b kvbinding.Binding, err error) {
			d := h.settle(res, p, b, err)
			settle(d)
			if d.Outcome == proposals.Accepted && proposals.EndsPause(cur, b) {
				// Handler.writeAll: a pause no record needs is lifted now,
				// not at the next tick.
				h.keepPaused()
			}
		})
	}
	pauseNext(0)
}

func (h *simHandler) unwritten(cur *kvbinding.Binding, res proposals.Result, p proposals.Proposal) proposals.Decision {
	d := proposals.Decision{Group: p.Group, Outcome: res.Outcome}
	if cur != nil {
		d.Revision = cur.Revision
	}
	switch res.Outcome {
	case proposals.Rejected:
		if d.Revision == 0 {
			d.Outcome, d.Error = proposals.Failed, res.Reason
		}
	case proposals.Refused, proposals.Failed:
		d.Error, d.Floor, d.Limit = res.Reason, res.Floor, res.Limit
	}
	return d
}

func (h *simHandler) settle(res proposals.Result, p proposals.Proposal, b kvbinding.Binding, err error) proposals.Decision {
	d := proposals.Decision{Group: p.Group, Outcome: proposals.Failed}
	switch {
	case err == nil:
	case errors.Is(err, kvbinding.ErrExists), errors.Is(err, kvbinding.ErrConflict):
		if b.Revision == 0 {
			d.Error = err.Error()
			return d
		}
		h.host.applyOwn(b)
		d.Outcome, d.Revision = proposals.Rejected, b.Revision
		return d
	default:
		d.Error = err.Error()
		return d
	}
	h.host.applyOwn(b)
	d.Outcome, d.Revision = proposals.Accepted, b.Revision
	if h.w.tracing {
		h.w.logf(h.host.id, "handler wrote %q: %s", b.Group, simRoute(b.Cached()))
	}
	return d
}

// kvWrite writes a record: the write may fail, or be stored with its ack
// lost (the handler then sees an error although the record changed).
func (h *simHandler) kvWrite(b kvbinding.Binding, create bool, rev uint64, ended bool, stored func(), cb func(kvbinding.Binding, error)) {
	w := h.w
	w.hop(h.host.id, w.lat(), func() {
		var (
			res kvbinding.Binding
			err error
		)
		if w.chance(w.p.pKVFail) {
			err = errSimOp
		} else {
			res, err = w.kv.write(b, create, rev, ended)
		}
		if err == nil && stored != nil {
			stored()
		}
		lost := err == nil && w.chance(w.p.pKVFail)
		w.hop(h.host.id, w.lat(), func() {
			if h.dead {
				return
			}
			if lost {
				cb(kvbinding.Binding{}, errSimTimeout)
				return
			}
			cb(res, err)
		})
	})
}

// pause is Handler.pause: pause node's queue consumer for the pause
// window, unless this term did so recently enough.
func (h *simHandler) pause(node string, cb func(error)) {
	w := h.w
	paused := map[string]time.Time{}
	if until, ok := h.paused[node]; ok {
		paused[node] = simEpoch().Add(until)
	}
	if !proposals.NeedsPause(paused, node, w.now(), simPauseWindow) {
		cb(nil)
		return
	}
	if !h.holds() {
		cb(errors.New("no authority"))
		return
	}
	until := w.clock + simPauseWindow
	fail := w.chance(w.p.pOpFail)
	w.hop(h.host.id, h.api(node), func() {
		if !fail {
			c := w.q.consumer(node)
			c.pausedUntil = until
			w.logf(h.host.id, "handler paused %s's consumer until %.3fs", node, until.Seconds())
		}
		w.hop(h.host.id, w.lat(), func() {
			if h.dead {
				return
			}
			if fail {
				cb(errSimOp)
				return
			}
			h.paused[node] = until
			cb(nil)
		})
	})
}

// api returns the delay after which a pause or resume call for node made
// now reaches the server: a hop, and not before the term's previous call
// for the node.
func (h *simHandler) api(node string) time.Duration {
	at := max(h.w.clock+h.w.lat(), h.apiTail[node])
	h.apiTail[node] = at
	return at - h.w.clock
}

// watchNodes is Handler.watchNodes: the real monitor input
// (GatherMonitorInput) and planner decide.
func (h *simHandler) watchNodes() {
	w := h.w
	rb := w.p.rebalance
	in := proposals.GatherMonitorInput(w.now(), h.host.view, h.host.cache, &rb, h.liveState)
	acts := h.mon.Plan(proposals.MonitorConfig{NodeGrace: w.p.nodeGrace, RebindAfter: w.p.rebindAfter, FenceDeadline: w.p.fence,
		Rebalance: rb}, in)
	for _, ev := range acts.Evacuate {
		if ev.Groups == nil {
			h.evacuate(ev.Node, nil, "node "+ev.Node+" gone")
		}
	}
	for _, node := range acts.Departed {
		h.evacuateNew(node)
	}
	for _, node := range acts.Rebind {
		h.rebind(node)
	}
	for _, ev := range acts.Evacuate {
		if ev.Groups != nil {
			h.evacuate(ev.Node, ev.Groups, "node "+ev.Node+" did not fence in time")
		}
	}
	if len(acts.Rebalance) > 0 {
		h.rebalance(acts.Rebalance)
	}
	h.keepPaused()
}

// rebalance is Handler.rebalance: move each group as an operator would.
func (h *simHandler) rebalance(moves []proposals.RebalanceMove) {
	w := h.w
	live := h.liveState()
	left := 1
	one := func() {
		left--
		if left == 0 && !h.dead {
			h.mon.RebalanceDone()
		}
	}
	for _, mv := range moves {
		w.logf(h.host.id, "handler rebalances %q from %s to %s", mv.Group, mv.From, mv.To)
		left++
		in := proposals.Input{Op: proposals.OpMove, By: h.id, Node: mv.To, Reason: "rebalance: " + mv.From + " holds more than its share"}
		snapshot := maps.Clone(live)
		g := mv.Group
		w.after(w.between(0, time.Millisecond), func() { h.apply(g, in, snapshot, nil, one) })
	}
	one()
}

// evacuate is Handler.evacuate: take groups off node from its checkpoint.
func (h *simHandler) evacuate(node string, groups []string, reason string) {
	w := h.w
	all := groups == nil
	finish := func() {
		if h.dead {
			return
		}
		h.mon.Done(node, all, false)
	}
	var guard func() error
	if strings.HasPrefix(reason, "node "+node+" gone") {
		seen := h.host.view.SeenRevision(node)
		if _, back := h.liveState()[node]; back {
			w.logf(h.host.id, "handler: %s announced itself again; its groups stay", node)
			finish()
			return
		}
		guard = func() error { return h.stillGone(node, seen) }
	}
	w.hop(h.host.id, w.lat(), func() {
		if h.dead {
			return
		}
		if w.chance(w.p.pKVFail) {
			finish() // cannot read the checkpoint; will retry
			return
		}
		var fence, ckpt uint64
		var caught map[string]uint64
		if c, ok := w.reg.ckpt[node]; ok {
			fence, caught, ckpt = c.Start(), c.Caught, w.reg.ckptRev[node]
		}
		if all {
			groups = simRefsOf(h.host.cache, node)
		}
		if len(groups) == 0 {
			finish()
			return
		}
		live := h.liveState()
		delete(live, node)
		w.logf(h.host.id, "handler evacuates %v from %s (fence %d): %s", groups, node, fence, reason)
		left := 1
		one := func() {
			left--
			if left == 0 {
				finish()
			}
		}
		for _, g := range groups {
			cur, ok := h.host.cache.Lookup(g)
			if !ok {
				continue
			}
			current := ""
			if cur.State == kvbinding.StateMoving {
				current = cur.Node
			}
			target := proposals.PickTarget(live, g, current)
			snapshot := maps.Clone(live)
			in := proposals.Input{Op: proposals.OpEvacuate, By: h.id, From: node, Node: target, Seq: fence, Routed: caught[g],
				Ckpt: ckpt, Reason: reason}
			left++
			g := g
			w.after(w.between(0, time.Millisecond), func() { h.apply(g, in, snapshot, guard, one) })
		}
		one()
	})
}

// evacuateNew is Handler.evacuateNew: take off a node just gone its
// groups bound at or after its checkpoint's start (the real BoundSince).
func (h *simHandler) evacuateNew(node string) {
	c, ok := h.w.reg.ckpt[node]
	if !ok {
		h.mon.Done(node, false, false)
		return
	}
	groups := proposals.BoundSince(simRefsOf(h.host.cache, node), h.host.cache.Lookup, node, c.Start())
	if len(groups) == 0 {
		h.mon.Done(node, false, false)
		return
	}
	h.evacuate(node, groups, "node "+node+" gone; bound after its last checkpoint")
}

// rebind is Handler.rebind: ask a node without a consumer to move its
// settled groups.
func (h *simHandler) rebind(node string) {
	w := h.w
	groups := simRefsOf(h.host.cache, node)
	live := h.liveState()
	delete(live, node)
	w.logf(h.host.id, "handler moves the groups of %s (no consumer)", node)
	left := 1
	one := func() {
		left--
		if left == 0 && !h.dead {
			h.mon.Done(node, false, true)
		}
	}
	for _, g := range groups {
		if g == "" {
			continue
		}
		cur, ok := h.host.cache.Lookup(g)
		if !ok || !cur.Settled() || cur.Node != node {
			continue
		}
		target := proposals.PickTarget(live, g, "")
		if target == "" {
			continue
		}
		snapshot := maps.Clone(live)
		left++
		g := g
		in := proposals.Input{Op: proposals.OpMove, By: h.id, Node: target, Reason: "node " + node + " has no queue consumer"}
		w.after(w.between(0, time.Millisecond), func() { h.apply(g, in, snapshot, nil, one) })
	}
	one()
}

// operator is an operator's move (target "": unbind), Handler.admin.
func (h *simHandler) operator(group, target string) {
	op := proposals.OpMove
	if target == "" {
		op = proposals.OpUnbind
	}
	h.apply(group, proposals.Input{Op: op, By: "operator", Node: target, Reason: "operator " + string(op)}, h.liveState(), nil, func() {})
}

// apply is Handler.apply: decide on the cached record and carry it out.
func (h *simHandler) apply(group string, in proposals.Input, live map[string]proposals.NodeState, guard func() error, done func()) {
	w := h.w
	if h.dead {
		return
	}
	var cur *kvbinding.Binding
	if r, ok := h.host.cache.Lookup(group); ok {
		cur = &r
	}
	res := proposals.Transition(group, cur, in, proposals.Env{Now: w.now(), Handler: h.id, Live: live})
	if res.Write == nil {
		w.logf(h.host.id, "handler: %s %q: %s %s", in.Op, group, res.Outcome, res.Reason)
		done()
		return
	}
	var stored func()
	if in.Op == proposals.OpEvacuate {
		stored = func() { w.chk.evacuation(group, in.From, w.kv.recs[group].Revision) }
	}
	h.carryOut(cur, res, proposals.Proposal{Op: in.Op, Group: group}, stored, guard, func(proposals.Decision) { done() })
}

// stillGone is Handler.stillGone: a gone node's liveness record, read
// again just before its evacuation is written, is not newer than seen,
// the announcement this handler had received when it decided.
func (h *simHandler) stillGone(node string, seen uint64) error {
	if rec, ok := h.w.reg.live[node]; ok && rec.gen > seen {
		h.w.logf(h.host.id, "handler: %s announced itself again (generation %d, seen %d); its groups stay", node, rec.gen, seen)
		return errors.New("the node announced itself again")
	}
	return nil
}

// keepPaused is Handler.keepPausedNow: the real PlanPauses decides.
func (h *simHandler) keepPaused() {
	w := h.w
	in := proposals.PauseInput{Now: w.now(), Paused: map[string]time.Time{}, Pausing: h.pausing,
		Draining: h.host.cache.Draining(), CatchingUp: h.host.cache.CatchingUp(), CatchUpSince: h.catchUps, Window: simPauseWindow}
	proposals.TrackCatchUps(h.catchUps, in.CatchingUp, in.Draining, in.Now)
	for node, until := range h.paused {
		in.Paused[node] = simEpoch().Add(until)
	}
	renew, resume := proposals.PlanPauses(in)
	for _, node := range renew {
		h.pause(node, func(error) {})
	}
	for _, node := range resume {
		if !h.holds() {
			return // the pause lapses by itself (keepPausedNow)
		}
		delete(h.paused, node)
		if w.chance(w.p.pOpFail) {
			continue // the pause lapses by itself
		}
		w.hop(h.host.id, h.api(node), func() {
			w.q.consumer(node).pausedUntil = 0
			w.q.consumer(node).kick()
			w.logf(h.host.id, "handler resumed %s's consumer", node)
		})
	}
}
