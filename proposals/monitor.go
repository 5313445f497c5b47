package proposals

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/internal/retry"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// pauseWindow is how long one pause of a queue consumer lasts; the active
// handler renews it while a record says the queue is being drained, so a
// pause outlives a handler crash by this much and no more.
const pauseWindow = 10 * time.Second

// monitor is the active handler's view over time: the planner's state
// (MonitorState: since when nodes have been gone or without a consumer,
// moves waiting for a fence, the rebalancing cool-down) and which queue
// consumers it keeps paused. mu guards it and is never held across I/O:
// Pause and Resume calls are made by the pauser goroutine alone (pauser.go).
type monitor struct {
	mu    sync.Mutex
	state MonitorState
	// paused: until when each queue consumer was last paused by us.
	paused map[string]time.Time
	// pausing: record writes in flight that paused each node's queue (the
	// record is not in the cache yet): its pause must not be lifted.
	pausing map[string]int
	// catchUps: since when records catch up groups from each node that
	// no record drains (TrackCatchUps).
	catchUps map[string]time.Time
}

func (m *monitor) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.state, m.paused, m.pausing, m.catchUps = MonitorState{}, nil, nil, nil
}

func (m *monitor) init() {
	if m.paused == nil {
		m.paused, m.pausing, m.catchUps = map[string]time.Time{}, map[string]int{}, map[string]time.Time{}
	}
}

// monitorConfig is the planner's configuration.
func (h *Handler) monitorConfig() MonitorConfig {
	return MonitorConfig{NodeGrace: h.cfg.NodeGrace, RebindAfter: h.cfg.RebindAfter, FenceDeadline: h.cfg.FenceDeadline,
		Rebalance: *h.cfg.Rebalance}
}

// watchNodes runs on every lease tick of the active handler: it gathers
// what the planner needs (Plan), and carries out what it decides: moves
// the groups of nodes gone longer than NodeGrace, and of live nodes whose
// queue has had no consumer for RebindAfter while another node's queue
// has one; fences from the checkpoint moves whose old node did not fence
// within FenceDeadline; moves groups to spread them over the nodes with a
// consumer (rebalancing); and keeps paused the queues that records say are
// being drained.
func (h *Handler) watchNodes(ctx context.Context, t *term) {
	h.maybeHardenRegistry(t)
	in := h.monitorInput(time.Now())
	m := &h.mon
	m.mu.Lock()
	acts := m.state.Plan(h.monitorConfig(), in)
	m.mu.Unlock()

	for _, ev := range acts.Evacuate {
		if ev.Groups == nil {
			t.goFn(func() {
				h.evacuate(t.ctx, ev.Node, nil, "node "+ev.Node+" gone for "+h.cfg.NodeGrace.String(), causeNodeGone)
			})
			continue
		}
		t.goFn(func() {
			h.evacuate(t.ctx, ev.Node, ev.Groups, "node "+ev.Node+" did not fence within "+h.cfg.FenceDeadline.String(), causeFenceOverdue)
		})
	}
	for _, node := range acts.Departed {
		t.goFn(func() { h.evacuateNew(t.ctx, node) })
	}
	for _, node := range acts.Rebind {
		t.goFn(func() { h.rebind(t.ctx, node) })
	}
	if len(acts.Rebalance) > 0 {
		t.goFn(func() { h.rebalance(t.ctx, acts.Rebalance, in.Nodes) })
	}
	h.metrics.prune(in.Unsettled, in.Now)
	h.keepPaused()
	h.restoreBad(ctx)
}

// monitorInput gathers what the planner needs at now.
func (h *Handler) monitorInput(now time.Time) MonitorInput {
	return GatherMonitorInput(now, h.reg, h.cache, h.cfg.Rebalance, h.liveState)
}

// LiveReader is what the handler reads of the live nodes:
// kvbinding.LiveView, and the Registry that keeps one.
type LiveReader interface {
	Live() map[string]kvbinding.NodeInfo
	Seen(node string) time.Time
	LastSeen(node string) time.Time
	Returned(node string) time.Time
}

// GatherMonitorInput gathers what the monitor's planner needs at now from
// the live nodes, the bindings and the rebalancing settings (rb nil: off);
// nodes returns the live nodes the rules may choose from (the handler's
// liveState), read only when rebalancing is on.
func GatherMonitorInput(now time.Time, reg LiveReader, cache *kvbinding.Cache, rb *RebalanceConfig, nodes func() map[string]NodeState) MonitorInput {
	in := MonitorInput{Now: now, Live: map[string]bool{}, LastSeen: map[string]time.Time{},
		Owners: cache.Owners(), Unsettled: cache.Unsettled()}
	live := reg.Live()
	for id, info := range live {
		in.Live[id] = info.HasConsumer
	}
	for node := range in.Owners {
		if _, ok := live[node]; !ok {
			in.LastSeen[node] = reg.LastSeen(node)
		}
	}
	if rb == nil || !rb.Enabled {
		return in
	}
	in.Nodes = nodes()
	for id := range in.Nodes {
		if back := reg.Returned(id); !back.IsZero() && now.Sub(back) < rb.ReturnCoolDown {
			delete(in.Nodes, id) // neither gives nor takes yet (RebalanceConfig.ReturnCoolDown)
		}
	}
	over := Overloaded(*rb, in.Nodes, Incoming(in.Unsettled))
	if len(over) == 0 {
		return in
	}
	in.Candidates = make(map[string][]Candidate, len(over))
	for _, node := range over {
		busy := map[string]bool{}
		for _, g := range live[node].Busy {
			busy[kvbinding.Ref(g)] = true
		}
		retrying := map[string]bool{}
		for _, g := range live[node].Retrying {
			retrying[kvbinding.Ref(g)] = true
		}
		// Candidates are named by ref (the cache keeps no long id); the
		// moves chosen are named in rebalance. A long id's cool-down is
		// therefore counted from the move's start.
		for _, ref := range cache.RefsOf(node) {
			if r, ok := cache.Lookup(ref); ok && r.Settled() && r.Node == node && ref != "" && !retrying[ref] {
				in.Candidates[node] = append(in.Candidates[node], Candidate{Group: ref, Busy: busy[ref] || live[node].BusyMore})
			}
		}
	}
	return in
}

// rebalance moves groups as the planner decided, each with the same
// hand-over as an operator's move.
func (h *Handler) rebalance(ctx context.Context, moves []RebalanceMove, nodes map[string]NodeState) {
	defer func() {
		h.mon.mu.Lock()
		h.mon.state.RebalanceDone()
		h.mon.mu.Unlock()
	}()
	refs := make([]string, 0, len(moves))
	for _, mv := range moves {
		refs = append(refs, mv.Group)
	}
	names, err := h.store.Names(ctx, refs)
	if err != nil {
		h.log.Warn("cannot read the ids of long groups to rebalance; moving the others", "err", err)
	}
	groups := make([]string, 0, len(moves))
	inputs := make([]Input, 0, len(moves))
	for _, mv := range moves {
		name, ok := names[mv.Group]
		if !ok {
			continue // gone meanwhile, or unreadable
		}
		reason := fmt.Sprintf("rebalance: %s holds %d of %d groups over %d nodes with a consumer", mv.From,
			nodes[mv.From].Groups, totalGroups(nodes), len(Eligible(nodes, false)))
		groups = append(groups, name)
		inputs = append(inputs, Input{Op: OpMove, By: h.id, Node: mv.To, Reason: reason})
		h.log.Debug("rebalancing a group", "group", logagg.Short(name), "from", mv.From, "to", mv.To)
	}
	moved, failed := h.applyMany(ctx, groups, inputs, h.liveState(), causeRebalance, nil)
	h.log.Info("groups moved to rebalance", "moved", moved, "failed", failed)
}

func totalGroups(nodes map[string]NodeState) int {
	total := 0
	for _, id := range Eligible(nodes, false) {
		total += nodes[id].Groups
	}
	return total
}

// restoreBad writes the last valid record of a group back over a value
// that is not a usable record (someone with write rights on the bucket
// wrote it): nodes kept routing by the valid record meanwhile.
func (h *Handler) restoreBad(ctx context.Context) {
	bad := h.cache.Bad()
	if len(bad) == 0 {
		return
	}
	// By ref: the cache names a long id only while its record is
	// unsettled; the others cannot be written back (nodes keep routing by
	// the valid record).
	groups := make([]string, 0, len(bad))
	for ref := range bad {
		if r, ok := h.cache.Lookup(ref); ok && (r.Group != "" || ref == "") {
			groups = append(groups, r.Group)
		}
	}
	defer h.locks.lock(groups)()
	var writes []kvbinding.Write
	for _, g := range groups {
		rev := bad[kvbinding.Ref(g)]
		r, ok := h.cache.Lookup(g)
		if !ok || r.Invalid {
			continue
		}
		b := kvbinding.Binding{Group: g, State: r.State, Node: r.Node, FromSeq: r.FromSeq, ThroughSeq: r.ThroughSeq,
			PrevNode: r.PrevNode, Step: r.Step, Drain: r.Drain, Routed: r.Routed, Ckpt: r.Ckpt, Epoch: r.Epoch,
			DecidedAt: time.Now().UTC(), DecidedBy: h.id, Reason: "restored over an invalid value"}
		w := kvbinding.Write{Binding: b, Rev: rev}
		if b.State == kvbinding.StateReleased || b.State == kvbinding.StateDeadLettered {
			w.TTL = h.cfg.RecordTTL
		}
		writes = append(writes, w)
	}
	if len(writes) == 0 {
		return
	}
	if err := h.pastRewind(ctx); err != nil {
		h.log.Debug("invalid values not restored yet", "err", err)
		return
	}
	for _, res := range h.store.WriteMany(ctx, writes) {
		if res.Err == nil {
			h.cache.Apply(res.Binding)
			h.log.Warn("restored a binding record over an invalid value", "group", logagg.Short(res.Binding.Group), "revision", res.Binding.Revision)
		} else if ctx.Err() == nil {
			h.log.Warn("could not restore a binding record over an invalid value", "group", logagg.Short(res.Binding.Group), "err", res.Err)
		}
	}
}

// done clears a node's evacuation in progress (gone, noConsumer: and the
// node's clock, see MonitorState.Done).
func (m *monitor) done(node string, gone, noConsumer bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.state.Done(node, gone, noConsumer)
}

// evacuate takes groups off node (all of the node's groups when groups is
// nil), from the node's checkpoint: the node is gone, or did not fence in
// time. Whatever it routed after its checkpoint is routed again by the new
// owners, and the queue stream's duplicate window absorbs it. cause labels
// the moves (metrics).
func (h *Handler) evacuate(ctx context.Context, node string, groups []string, reason, cause string) {
	all := groups == nil
	defer h.mon.done(node, all, false)
	var guard func(context.Context) error
	if cause == causeNodeGone {
		// The announcement the decision was taken after: the revision
		// first, then the live set, so that an announcement delivered in
		// between is caught by one or the other.
		seen := h.reg.SeenRevision(node)
		if _, back := h.liveState()[node]; back {
			h.log.Info("a node found gone announced itself again: its groups stay", "node", node, "seen_revision", seen)
			return
		}
		guard = func(ctx context.Context) error { return h.stillGone(ctx, node, seen) }
	}
	var (
		fence, ckpt uint64
		caught      map[string]uint64
	)
	c, rev, ok, err := h.reg.LoadCheckpointRev(ctx, node)
	switch {
	case err != nil && !errors.Is(err, kvbinding.ErrInvalidCheckpoint):
		h.log.Warn("cannot read the checkpoint of a node to evacuate; will retry", "node", node, "err", err)
		return
	case err != nil:
		// A corrupt checkpoint: fence nowhere after the records' own
		// starts (the safe side: re-route, deduplicated).
		h.log.Error("checkpoint of a node to evacuate is invalid; its groups are taken over from their binding's start", "node", node, "err", err)
	case ok:
		fence, caught, ckpt = c.Start(), c.Caught, rev
	}
	if all {
		var err error
		if groups, err = h.groupsOf(ctx, node); err != nil {
			h.log.Warn("cannot read the ids of the long groups of a node to evacuate; will retry", "node", node, "err", err)
			return
		}
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
			Routed: caught[group], Ckpt: ckpt, Reason: reason})
	}
	moved, failed := h.applyMany(ctx, groups, inputs, live, cause, guard)
	h.log.Info("groups moved off node", "node", node, "moved", moved, "failed", failed)
}

// errAnnouncedAgain: a node found gone has announced itself since.
var errAnnouncedAgain = errors.New("proposals: the node announced itself again since this handler found it gone; its groups stay")

// stillGone reads a gone node's liveness record again just before its
// groups' evacuation is written (after the pauses), and fails it when the
// node announced itself since seen, the revision of the last announcement
// this handler had received when it took the decision (a link that
// healed, a pause that ended, or this handler's watch behind a node that
// never stopped): such a node routes again as soon as it has caught up
// with the records stored before its announcement, and an evacuation
// written after that would move its groups under it (docs/protocol.md,
// "Who may decide, and until when"). A record at revision seen is the one
// that lapsed (a replica that has not expired it yet): the node is still
// gone. An unreadable record fails the evacuation too: it is tried again.
func (h *Handler) stillGone(ctx context.Context, node string, seen uint64) error {
	_, rev, found, err := h.reg.LiveRecord(ctx, node)
	if err != nil && !errors.Is(err, kvbinding.ErrInvalidNodeInfo) {
		return fmt.Errorf("proposals: cannot read the liveness record of %s again before evacuating it: %w", node, err)
	}
	if found && rev > seen {
		h.log.Info("a node found gone announced itself again: its groups stay", "node", node, "revision", rev, "seen_revision", seen)
		return errAnnouncedAgain
	}
	return nil
}

// evacuateNew takes off a node that just left the live set the groups
// whose binding starts at or after its checkpoint's start: groups bound in
// its last seconds, whose messages it routed, if it routed any, after the
// checkpoint. An evacuation re-routes those from the binding's start
// whenever it comes, so there is no reason to make them wait out the
// node's grace (their first messages did, 15 s by default). The node has
// stopped publishing by then: its liveness record is gone, and it stops
// by its own clock before the record can expire (router: aliveUntil).
//
// A read that fails is tried again, for half the grace at most and while
// the node stays gone: one timeout under load would otherwise leave those
// groups to wait out the whole grace.
func (h *Handler) evacuateNew(ctx context.Context, node string) {
	until := time.Now().Add(h.cfg.NodeGrace / 2)
	backoff := retry.Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for {
		readCtx, cancel := context.WithTimeout(ctx, evacuateReadTimeout)
		groups, start, err := h.boundAfterCheckpoint(readCtx, node)
		cancel()
		if err == nil {
			if len(groups) == 0 {
				h.mon.done(node, false, false)
				return
			}
			h.log.Debug("node gone: taking off at once its groups bound after its checkpoint", "node", node, "groups", len(groups), "checkpoint_start", start)
			h.evacuate(ctx, node, groups, "node "+node+" gone; its group was bound after its last checkpoint", causeNodeGone)
			return
		}
		_, back := h.liveState()[node]
		if back || retry.Permanent(err) || errors.Is(err, kvbinding.ErrInvalidCheckpoint) || time.Now().After(until) || retry.Sleep(ctx, backoff.Next()) != nil {
			h.mon.done(node, false, false)
			h.log.Info("no early take-over of a gone node's new groups: they wait for the grace", "node", node, "back", back, "err", err)
			return
		}
		h.log.Debug("early take-over of a gone node's new groups: reading again", "node", node, "err", err)
	}
}

// evacuateReadTimeout bounds each of evacuateNew's attempts to read: a
// read whose request or answer is lost is tried again, not waited out.
const evacuateReadTimeout = 2 * time.Second

// boundAfterCheckpoint returns the groups evacuateNew takes off node, with
// its checkpoint's start: none when the node left no checkpoint.
func (h *Handler) boundAfterCheckpoint(ctx context.Context, node string) ([]string, uint64, error) {
	c, ok, err := h.reg.LoadCheckpoint(ctx, node)
	if err != nil {
		return nil, 0, fmt.Errorf("read its checkpoint: %w", err)
	}
	if !ok {
		return nil, 0, nil
	}
	start := c.Start()
	refs := BoundSince(h.cache.RefsOf(node), h.cache.Lookup, node, start)
	if len(refs) == 0 {
		return nil, start, nil
	}
	names, err := h.store.Names(ctx, refs)
	if err != nil {
		return nil, start, fmt.Errorf("read their ids: %w", err)
	}
	groups := make([]string, 0, len(names))
	for _, ref := range refs {
		if g, ok := names[ref]; ok {
			groups = append(groups, g)
		}
	}
	sort.Strings(groups)
	return groups, start, nil
}

// BoundSince returns those of refs whose record binds the group to node,
// settled, from start on: the groups a node gone with its checkpoint at
// start got after that checkpoint (evacuateNew takes them at once).
func BoundSince(refs []string, lookup func(string) (kvbinding.Binding, bool), node string, start uint64) []string {
	var out []string
	for _, ref := range refs {
		if r, ok := lookup(ref); ok && r.Settled() && r.Node == node && r.FromSeq >= start {
			out = append(out, ref)
		}
	}
	return out
}

// applyMany decides and writes the handler's own inputs for many groups
// at once (one pipelined round of writes), and counts the records written
// and the groups that could not be moved.
func (h *Handler) applyMany(ctx context.Context, groups []string, inputs []Input, live map[string]NodeState, cause string, guard func(context.Context) error) (written, failed int) {
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
			h.log.Debug("group not moved", "group", logagg.Short(group), "op", inputs[i].Op, "reason", res.Reason)
			continue
		}
		plans = append(plans, planned{i: i, cur: cur, res: res, cause: cause})
		ps = append(ps, Proposal{Op: inputs[i].Op, Group: group})
	}
	for k, d := range h.writeAll(ctx, plans, ps, guard) {
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
	defer h.mon.done(node, false, true)
	live := h.liveState()
	delete(live, node)
	reason := "node " + node + " has had no queue consumer for " + h.cfg.RebindAfter.String()
	var refs []string
	for _, ref := range h.cache.RefsOf(node) {
		if ref == "" {
			continue // the ungrouped router needs no consumer of its own
		}
		if cur, ok := h.cache.Lookup(ref); ok && cur.Settled() && cur.Node == node {
			refs = append(refs, ref)
		}
	}
	names, err := h.store.Names(ctx, refs)
	if err != nil {
		h.log.Warn("cannot read the ids of the long groups of a node without a consumer; will retry", "node", node, "err", err)
		return
	}
	var groups []string
	var inputs []Input
	for _, ref := range refs {
		group, ok := names[ref]
		if !ok {
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
	moved, failed := h.applyMany(ctx, groups, inputs, live, causeNoConsumer, nil)
	h.log.Info("groups asked to move off node", "node", node, "moved", moved, "failed", failed)
}

// groupsOf returns the groups whose record involves node (Cache.RefsOf),
// the long ids read back from the bucket.
func (h *Handler) groupsOf(ctx context.Context, node string) ([]string, error) {
	refs := h.cache.RefsOf(node)
	names, err := h.store.Names(ctx, refs)
	if err != nil {
		return nil, err
	}
	groups := make([]string, 0, len(names))
	for _, ref := range refs {
		if g, ok := names[ref]; ok {
			groups = append(groups, g)
		}
	}
	return groups, nil
}
