package proposals

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"grouprouter/kvbinding"
)

// monitor is the active handler's view of node health over time: since
// when a node with groups has been gone, or without a queue consumer.
type monitor struct {
	mu         sync.Mutex
	goneSince  map[string]time.Time
	noConsumer map[string]time.Time
	evacuating map[string]bool
}

func (m *monitor) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.goneSince, m.noConsumer, m.evacuating = nil, nil, nil
}

// watchNodes runs on every lease tick of the active handler: it moves the
// groups of nodes gone longer than NodeGrace, and of live nodes whose queue
// has had no consumer for RebindAfter while another node's queue has one.
func (h *Handler) watchNodes(ctx context.Context) {
	now := time.Now()
	live := h.reg.Live()
	owners := h.cache.Owners()
	someConsumer := false
	for _, info := range live {
		if info.HasConsumer {
			someConsumer = true
		}
	}
	m := &h.mon
	m.mu.Lock()
	if m.goneSince == nil {
		m.goneSince, m.noConsumer, m.evacuating = map[string]time.Time{}, map[string]time.Time{}, map[string]bool{}
	}
	var dead, idle []string
	for node := range owners {
		info, alive := live[node]
		if !alive {
			delete(m.noConsumer, node)
			since, ok := m.goneSince[node]
			if !ok {
				m.goneSince[node] = now
				continue
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
	m.mu.Unlock()
	for _, node := range dead {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.evacuate(ctx, node, true)
		}()
	}
	for _, node := range idle {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.evacuate(ctx, node, false)
		}()
	}
}

// evacuate moves every group of node elsewhere. A dead node cannot hand its
// groups over: the new owners take them from its checkpoint on (whatever it
// routed after that is absorbed by the queue stream's duplicate window) and
// drain its queue. A live node without consumer is asked to hand them over
// (StateMoving); it writes the exact fence itself.
func (h *Handler) evacuate(ctx context.Context, node string, dead bool) {
	defer func() {
		h.mon.mu.Lock()
		delete(h.mon.evacuating, node)
		if dead {
			delete(h.mon.goneSince, node)
		} else {
			delete(h.mon.noConsumer, node)
		}
		h.mon.mu.Unlock()
	}()
	reason := "node " + node + " has had no queue consumer for " + h.cfg.RebindAfter.String()
	var fence uint64
	if dead {
		reason = "node " + node + " gone for " + h.cfg.NodeGrace.String()
		if c, ok, err := h.reg.LoadCheckpoint(ctx, node); err == nil && ok {
			fence = c.Next
			if len(c.Pending) > 0 {
				fence = c.Pending[0][0]
			}
		} else if err != nil {
			h.log.Warn("cannot read checkpoint of gone node; will retry", "node", node, "err", err)
			return
		}
	}
	groups := h.cache.GroupsOf(node)
	if len(groups) == 0 {
		return
	}
	live := h.liveState()
	delete(live, node)
	h.log.Warn("moving groups off node", "node", node, "groups", len(groups), "reason", reason)
	var mu sync.Mutex
	moved, failed := 0, 0
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for _, group := range groups {
		if !dead && group == "" {
			continue // the ungrouped router needs no consumer of its own
		}
		cur, ok := h.cache.Lookup(group)
		if !ok {
			continue
		}
		mu.Lock()
		target := h.pickTarget(live, group, cur)
		mu.Unlock()
		g.Go(func() error {
			err := h.moveGroup(gctx, group, cur, node, target, dead, fence, reason)
			mu.Lock()
			if err != nil {
				failed++
			} else {
				moved++
			}
			mu.Unlock()
			return nil
		})
	}
	_ = g.Wait()
	h.log.Info("groups moved off node", "node", node, "moved", moved, "failed", failed)
}

// pickTarget chooses the node a group goes to: the target of a move in
// progress if still eligible, else the eligible node with the fewest groups
// (counting the ones just assigned). live's counts are updated.
func (h *Handler) pickTarget(live map[string]NodeState, group string, cur kvbinding.Route) string {
	eligible := Eligible(live, group == "")
	if len(eligible) == 0 {
		return ""
	}
	if cur.State == kvbinding.StateMoving && cur.Node != "" {
		for _, n := range eligible {
			if n == cur.Node {
				return n
			}
		}
	}
	sort.SliceStable(eligible, func(i, j int) bool { return live[eligible[i]].Groups < live[eligible[j]].Groups })
	best := eligible[0]
	if group != "" {
		s := live[best]
		s.Groups++
		live[best] = s
	}
	return best
}

func (h *Handler) moveGroup(ctx context.Context, group string, cur kvbinding.Route, node, target string, dead bool, fence uint64, reason string) error {
	if target == "" && !(cur.State == kvbinding.StateMoving && cur.Node == "") {
		return errors.New("no eligible node")
	}
	full, err := h.store.Get(ctx, group)
	if err != nil {
		return err
	}
	if full.Revision != cur.Revision {
		return kvbinding.ErrConflict // changed meanwhile: the next pass sees the new state
	}
	now := time.Now().UTC()
	var next kvbinding.Binding
	switch {
	case !dead:
		if full.State != kvbinding.StateBound || full.Handoff {
			return nil // already changing hands
		}
		next = kvbinding.Binding{Group: group, State: kvbinding.StateMoving, Node: target, PrevNode: node,
			FromSeq: full.FromSeq, DecidedAt: now, DecidedBy: h.id, Reason: reason}
	case full.State == kvbinding.StateMoving && full.Node == "":
		// An unbind the gone node never completed.
		next = kvbinding.Binding{Group: group, State: kvbinding.StateReleased, ThroughSeq: max(fence, full.FromSeq, 2) - 1,
			PrevNode: node, DecidedAt: now, DecidedBy: h.id, Reason: full.Reason + "; completed: " + reason}
		b, err := h.store.ReplaceTTL(ctx, next, full.Revision, h.cfg.RecordTTL)
		if err == nil {
			h.cache.Apply(b)
			Event{Kind: EventUnbind, Group: group, PrevNode: node, By: h.id, Reason: next.Reason}.Publish(h.nc)
		}
		return err
	default:
		from := full.FromSeq
		if full.State == kvbinding.StateBound && !full.Handoff && fence > from {
			from = fence
		}
		if full.State == kvbinding.StateMoving {
			from = max(fence, full.FromSeq, 1)
		}
		drain := kvbinding.WithDrain(full.Drain, node)
		next = kvbinding.Binding{Group: group, State: kvbinding.StateBound, Node: target, FromSeq: from,
			PrevNode: node, Handoff: true, Drain: drain, DecidedAt: now, DecidedBy: h.id, Reason: reason}
	}
	b, err := h.store.Replace(ctx, next, full.Revision)
	if err != nil {
		return err
	}
	h.cache.Apply(b)
	Event{Kind: EventMove, Group: group, Node: b.Node, PrevNode: node, FromSeq: b.FromSeq, By: h.id, Reason: reason}.Publish(h.nc)
	return nil
}
