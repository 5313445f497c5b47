package proposals

import (
	"context"
	"errors"
	"sync"
	"time"

	"grouprouter/kvbinding"
)

// pauseWindow is how long one pause of a queue consumer lasts; the active
// handler renews it while a record says the queue is being drained, so a
// pause outlives a handler crash by this much and no more.
const pauseWindow = 10 * time.Second

// monitor is the active handler's view over time: since when a node with
// groups has been gone or without a queue consumer, since when a move has
// waited for its fence, and which queue consumers it keeps paused.
type monitor struct {
	mu         sync.Mutex
	goneSince  map[string]time.Time
	noConsumer map[string]time.Time
	evacuating map[string]bool
	// moving: when this handler first saw each moving record (by group
	// and revision) that waits for its old node's fence.
	moving map[string]seenRev
	// paused: until when each queue consumer was last paused by us.
	paused map[string]time.Time
	// pausing: record writes in flight that paused each node's queue (the
	// record is not in the cache yet): its pause must not be lifted.
	pausing map[string]int
	// pauseMu serializes pausing and resuming queue consumers, so that a
	// resume never lands after a pause it did not see.
	pauseMu sync.Mutex
}

type seenRev struct {
	rev  uint64
	seen time.Time
}

func (m *monitor) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.goneSince, m.noConsumer, m.evacuating, m.moving, m.paused, m.pausing = nil, nil, nil, nil, nil, nil
}

func (m *monitor) init() {
	if m.goneSince == nil {
		m.goneSince, m.noConsumer, m.evacuating = map[string]time.Time{}, map[string]time.Time{}, map[string]bool{}
		m.moving, m.paused, m.pausing = map[string]seenRev{}, map[string]time.Time{}, map[string]int{}
	}
}

// watchNodes runs on every lease tick of the active handler: it moves the
// groups of nodes gone longer than NodeGrace, and of live nodes whose queue
// has had no consumer for RebindAfter while another node's queue has one;
// it fences from the checkpoint moves whose old node did not fence within
// FenceDeadline; and it keeps paused the queues that records say are being
// drained.
func (h *Handler) watchNodes(ctx context.Context, t *term) {
	now := time.Now()
	live := h.reg.Live()
	owners := h.cache.Owners()
	unsettled := h.cache.Unsettled()
	someConsumer := false
	for _, info := range live {
		if info.HasConsumer {
			someConsumer = true
		}
	}
	m := &h.mon
	m.mu.Lock()
	m.init()
	var dead, idle []string
	for node := range owners {
		info, alive := live[node]
		if !alive {
			delete(m.noConsumer, node)
			since, ok := m.goneSince[node]
			if !ok {
				// Gone since its last announcement, if this process saw
				// one: the grace counts from there, not from when its
				// liveness record expired.
				since = now
				if seen := h.reg.LastSeen(node); !seen.IsZero() && seen.Before(now) {
					since = seen
				}
				m.goneSince[node] = since
			}
			if now.Sub(since) >= h.cfg.NodeGrace && !m.evacuating[node] {
				dead = append(dead, node)
				m.evacuating[node] = true
			}
			continue
		}
		delete(m.goneSince, node)
		if info.HasConsumer || !someConsumer || h.cfg.RebindAfter < 0 {
			delete(m.noConsumer, node)
			continue
		}
		since, ok := m.noConsumer[node]
		if !ok {
			m.noConsumer[node] = now
			continue
		}
		if now.Sub(since) >= h.cfg.RebindAfter && !m.evacuating[node] {
			idle = append(idle, node)
			m.evacuating[node] = true
		}
	}
	// Moves waiting for a fence.
	overdue := map[string][]string{} // old node -> groups
	for g, r := range unsettled {
		if r.State != kvbinding.StateMoving {
			continue
		}
		s, ok := m.moving[g]
		if !ok || s.rev != r.Revision {
			m.moving[g] = seenRev{rev: r.Revision, seen: now}
			continue
		}
		if now.Sub(s.seen) >= h.cfg.FenceDeadline && !m.evacuating[r.PrevNode] {
			overdue[r.PrevNode] = append(overdue[r.PrevNode], g)
		}
	}
	for g := range m.moving {
		if r, ok := unsettled[g]; !ok || r.State != kvbinding.StateMoving {
			delete(m.moving, g)
		}
	}
	for node := range overdue {
		m.evacuating[node] = true
	}
	m.mu.Unlock()

	for _, node := range dead {
		t.goFn(func() {
			h.evacuate(t.ctx, node, nil, "node "+node+" gone for "+h.cfg.NodeGrace.String(), causeNodeGone)
		})
	}
	for _, node := range idle {
		t.goFn(func() { h.rebind(t.ctx, node) })
	}
	for node, groups := range overdue {
		t.goFn(func() {
			h.evacuate(t.ctx, node, groups, "node "+node+" did not fence within "+h.cfg.FenceDeadline.String(), causeFenceOverdue)
		})
	}
	h.metrics.prune(unsettled, now)
	h.keepPaused(ctx)
	h.restoreBad(ctx)
}

// restoreBad writes the last valid record of a group back over a value
// that is not a usable record (someone with write rights on the bucket
// wrote it): nodes kept routing by the valid record meanwhile.
func (h *Handler) restoreBad(ctx context.Context) {
	bad := h.cache.Bad()
	if len(bad) == 0 {
		return
	}
	groups := make([]string, 0, len(bad))
	for g := range bad {
		groups = append(groups, g)
	}
	defer h.locks.lock(groups)()
	var writes []kvbinding.Write
	for g, rev := range bad {
		r, ok := h.cache.Lookup(g)
		if !ok || r.Invalid {
			continue
		}
		b := kvbinding.Binding{Group: g, State: r.State, Node: r.Node, FromSeq: r.FromSeq, ThroughSeq: r.ThroughSeq,
			PrevNode: r.PrevNode, Step: r.Step, Drain: r.Drain, Routed: r.Routed, Epoch: r.Epoch,
			DecidedAt: time.Now().UTC(), DecidedBy: h.id, Reason: "restored over an invalid value"}
		w := kvbinding.Write{Binding: b, Rev: rev}
		if b.State == kvbinding.StateReleased || b.State == kvbinding.StateDeadLettered {
			w.TTL = h.cfg.RecordTTL
		}
		writes = append(writes, w)
	}
	for _, res := range h.store.WriteMany(ctx, writes) {
		if res.Err == nil {
			h.cache.Apply(res.Binding)
			h.log.Warn("restored a binding record over an invalid value", "group", res.Binding.Group, "revision", res.Binding.Revision)
		} else if ctx.Err() == nil {
			h.log.Warn("could not restore a binding record over an invalid value", "group", res.Binding.Group, "err", res.Err)
		}
	}
}

// done clears a node's evacuation in progress.
func (m *monitor) done(node string, clear map[string]time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.evacuating, node)
	if clear != nil {
		delete(clear, node)
	}
}

// evacuate takes groups off node (all of the node's groups when groups is
// nil), from the node's checkpoint: the node is gone, or did not fence in
// time. Whatever it routed after its checkpoint is routed again by the new
// owners, and the queue stream's duplicate window absorbs it. cause labels
// the moves (metrics).
func (h *Handler) evacuate(ctx context.Context, node string, groups []string, reason, cause string) {
	all := groups == nil
	defer func() {
		if all {
			h.mon.mu.Lock()
			clear := h.mon.goneSince
			h.mon.mu.Unlock()
			h.mon.done(node, clear)
		} else {
			h.mon.done(node, nil)
		}
	}()
	var (
		fence  uint64
		caught map[string]uint64
	)
	c, ok, err := h.reg.LoadCheckpoint(ctx, node)
	switch {
	case err != nil && !errors.Is(err, kvbinding.ErrInvalidCheckpoint):
		h.log.Warn("cannot read the checkpoint of a node to evacuate; will retry", "node", node, "err", err)
		return
	case err != nil:
		// A corrupt checkpoint: fence nowhere after the records' own
		// starts (the safe side: re-route, deduplicated).
		h.log.Error("checkpoint of a node to evacuate is invalid; its groups are taken over from their binding's start", "node", node, "err", err)
	case ok:
		fence, caught = c.Start(), c.Caught
	}
	if all {
		groups = h.cache.GroupsOf(node)
	}
	if len(groups) == 0 {
		return
	}
	live := h.liveState()
	delete(live, node)
	h.log.Warn("moving groups off node", "node", node, "groups", len(groups), "reason", reason, "fence", fence)
	inputs := make([]Input, 0, len(groups))
	for _, group := range groups {
		current := ""
		if cur, ok := h.cache.Lookup(group); ok && cur.State == kvbinding.StateMoving {
			current = cur.Node
		}
		inputs = append(inputs, Input{Op: OpEvacuate, By: h.id, From: node, Node: PickTarget(live, group, current), Seq: fence,
			Routed: caught[group], Reason: reason})
	}
	moved, failed := h.applyMany(ctx, groups, inputs, live, cause)
	h.log.Info("groups moved off node", "node", node, "moved", moved, "failed", failed)
}

// applyMany decides and writes the handler's own inputs for many groups
// at once (one pipelined round of writes), and counts the records written
// and the groups that could not be moved.
func (h *Handler) applyMany(ctx context.Context, groups []string, inputs []Input, live map[string]NodeState, cause string) (written, failed int) {
	defer h.locks.lock(groups)()
	env := Env{Now: time.Now(), Handler: h.id, Live: live}
	plans := make([]planned, 0, len(groups))
	ps := make([]Proposal, 0, len(groups))
	for i, group := range groups {
		var cur *kvbinding.Binding
		if r, ok := h.cache.Lookup(group); ok {
			cur = &r
		}
		res := Transition(group, cur, inputs[i], env)
		if res.Outcome == Failed {
			failed++
			h.log.Debug("group not moved", "group", group, "op", inputs[i].Op, "reason", res.Reason)
			continue
		}
		plans = append(plans, planned{i: i, cur: cur, res: res, cause: cause})
		ps = append(ps, Proposal{Op: inputs[i].Op, Group: group})
	}
	for k, d := range h.writeAll(ctx, plans, ps) {
		h.metrics.decided(inputs[plans[k].i].Op, d.Outcome)
		switch {
		case d.Outcome == Accepted:
			written++
		case d.Outcome == Failed:
			failed++
			h.log.Debug("group not moved", "group", ps[k].Group, "err", d.Error)
		}
	}
	return written, failed
}

// rebind asks a live node whose queue has no consumer to hand its groups
// over to nodes that have one (it fences them itself).
func (h *Handler) rebind(ctx context.Context, node string) {
	defer func() {
		h.mon.mu.Lock()
		clear := h.mon.noConsumer
		h.mon.mu.Unlock()
		h.mon.done(node, clear)
	}()
	live := h.liveState()
	delete(live, node)
	reason := "node " + node + " has had no queue consumer for " + h.cfg.RebindAfter.String()
	var groups []string
	var inputs []Input
	for _, group := range h.cache.GroupsOf(node) {
		if group == "" {
			continue // the ungrouped router needs no consumer of its own
		}
		cur, ok := h.cache.Lookup(group)
		if !ok || !cur.Settled() || cur.Node != node {
			continue
		}
		target := PickTarget(live, group, "")
		if target == "" {
			continue
		}
		groups = append(groups, group)
		inputs = append(inputs, Input{Op: OpMove, By: h.id, Node: target, Reason: reason})
	}
	h.log.Warn("moving groups off node", "node", node, "groups", len(groups), "reason", reason)
	moved, failed := h.applyMany(ctx, groups, inputs, live, causeNoConsumer)
	h.log.Info("groups asked to move off node", "node", node, "moved", moved, "failed", failed)
}

// pause pauses node's queue consumer for pauseWindow, unless this handler
// did so recently enough.
func (h *Handler) pause(ctx context.Context, node string) error {
	q := h.cfg.Queues
	if q == nil {
		return nil
	}
	m := &h.mon
	m.pauseMu.Lock()
	defer m.pauseMu.Unlock()
	now := time.Now()
	m.mu.Lock()
	m.init()
	until, ok := m.paused[node]
	m.mu.Unlock()
	if ok && until.Sub(now) > 2*pauseWindow/3 {
		return nil
	}
	until = now.Add(pauseWindow)
	if err := q.Pause(ctx, node, until); err != nil {
		return err
	}
	m.mu.Lock()
	m.init()
	m.paused[node] = until
	m.mu.Unlock()
	h.log.Debug("queue consumer paused for a drain", "node", node, "until", until)
	return nil
}

// keepPaused renews the pause of every queue a record says is being
// drained, and resumes the queues it paused that no record needs paused
// any more.
func (h *Handler) keepPaused(ctx context.Context) {
	q := h.cfg.Queues
	if q == nil {
		return
	}
	for node := range h.cache.Draining() {
		if err := h.pause(ctx, node); err != nil && ctx.Err() == nil {
			h.log.Warn("cannot renew the pause of a queue being drained", "node", node, "err", err)
		}
	}
	m := &h.mon
	m.pauseMu.Lock()
	defer m.pauseMu.Unlock()
	m.mu.Lock()
	var candidates []string
	for node := range m.paused {
		if m.pausing[node] == 0 {
			candidates = append(candidates, node)
		}
	}
	m.mu.Unlock()
	if len(candidates) == 0 {
		return
	}
	// Read after the writes in flight were counted: a write that paused a
	// queue and is done has its record in the cache by now.
	draining := h.cache.Draining()
	for _, node := range candidates {
		if draining[node] > 0 {
			continue
		}
		if err := q.Resume(ctx, node); err != nil && ctx.Err() == nil {
			h.log.Warn("cannot resume a drained queue; its pause lapses by itself", "node", node, "err", err)
			continue
		}
		m.mu.Lock()
		delete(m.paused, node)
		m.mu.Unlock()
		h.log.Debug("queue consumer resumed: no drain of it left", "node", node)
	}
}

// pausingFor counts a record write in flight that pauses nodes' queues
// (delta 1 before the pause, -1 once the record is in the cache).
func (h *Handler) pausingFor(nodes []string, delta int) {
	if len(nodes) == 0 {
		return
	}
	m := &h.mon
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	for _, n := range nodes {
		m.pausing[n] += delta
		if m.pausing[n] <= 0 {
			delete(m.pausing, n)
		}
	}
}
