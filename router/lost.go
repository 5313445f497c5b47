package router

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// How far a node routed the groups taken from it (kvbinding.Checkpoint.Lost).
//
// An evacuation takes a gone node's groups from its checkpoint, and pins
// that checkpoint in the record (Binding.Ckpt): the new owner's catch-up
// does not route again what it counts as finished (pinnedCheckpoints). A
// node whose checkpoint saves failed for a while (its bucket's leader on
// a frozen server) routed past it; when it comes back and saves again, the
// pin is void and the catch-up routes again from the pinned start, which
// only the queue stream's duplicate window makes harmless, and a rolling
// restart of the servers loses the window's ids of consumed messages
// (nats-server #3272). So the node keeps, for the groups it routed lately,
// the last message it stored on its queue, and, for those an evacuation
// from its checkpoint took from it, says so in the checkpoints it saves
// afterwards; the catch-up of a group whose pin is void skips what that
// says, once it has seen the message gone from the queue stream
// (consumed, or moved by the drain): a message still there landed after
// the drain looked, and is routed again so that the duplicate it meets is
// moved here (takeLateCopy).

// lostBook is the engine's record of the above.
type lostBook struct {
	// cur and prev: the last message each group stored on a queue, by
	// ref, in two generations rotated every routedKeep/2.
	cur, prev map[string]routedPos
	rotated   time.Time
	// lost: the groups taken from this node, by group id, with when this
	// node learned it (kept lostKeep).
	lost map[string]lostEntry
	// earlier: what the checkpoint this node resumed from named (its
	// earlier run's), taken into lost at the first snapshot.
	earlier map[string]kvbinding.LostPos
}

// routedPos is a group's last message stored on a queue: its ingress and
// queue stream sequences.
type routedPos struct{ seq, at uint64 }

type lostEntry struct {
	pos  kvbinding.LostPos
	when time.Time
}

const (
	// routedKeep: how long a group's last routed message is remembered
	// (between routedKeep/2 and routedKeep). Past the queue stream's
	// duplicate window, a catch-up routes copies of what was consumed in any
	// case.
	routedKeep = 2 * queueDuplicates
	// maxRoutedKept bounds each generation; the groups past it are not
	// remembered (their catch-up relies on the window, as before).
	maxRoutedKept = 1 << 16
	// lostKeep: how long the checkpoints name a group taken from the node.
	lostKeep = routedKeep
)

// routed records that group ref's message at ingress sequence seq was
// stored at queue sequence at (0: not known, nothing recorded).
func (b *lostBook) routed(ref string, seq, at uint64) {
	if at == 0 {
		return
	}
	if b.cur == nil {
		b.cur = make(map[string]routedPos)
	}
	p, ok := b.cur[ref]
	if !ok && len(b.cur) >= maxRoutedKept {
		return
	}
	if seq >= p.seq {
		b.cur[ref] = routedPos{seq, at}
	}
}

// last returns group ref's last message stored on a queue, if remembered.
func (b *lostBook) last(ref string) (routedPos, bool) {
	if p, ok := b.cur[ref]; ok {
		return p, true
	}
	p, ok := b.prev[ref]
	return p, ok
}

// taken records that group (ref) was taken from this node by a record of
// epoch.
func (b *lostBook) taken(group, ref string, epoch uint64, now time.Time) {
	p, ok := b.last(ref)
	if !ok || group == "" || epoch == 0 {
		return
	}
	if e, ok := b.lost[group]; ok && e.pos.Epoch() >= epoch {
		return
	}
	if b.lost == nil {
		b.lost = make(map[string]lostEntry)
	}
	b.lost[group] = lostEntry{pos: kvbinding.LostPos{p.seq, p.at, epoch}, when: now}
}

// snapshot rotates and prunes the book, and returns the groups taken from
// this node for a checkpoint, within the checkpoint's bounds.
func (b *lostBook) snapshot(now time.Time) map[string]kvbinding.LostPos {
	for g, p := range b.earlier {
		if _, ok := b.lost[g]; !ok {
			if b.lost == nil {
				b.lost = make(map[string]lostEntry)
			}
			b.lost[g] = lostEntry{pos: p, when: now}
		}
	}
	b.earlier = nil
	switch {
	case b.rotated.IsZero():
		b.rotated = now
	case now.Sub(b.rotated) >= routedKeep/2:
		b.prev, b.cur, b.rotated = b.cur, nil, now
	}
	if len(b.lost) == 0 {
		return nil
	}
	out := make(map[string]kvbinding.LostPos, min(len(b.lost), maxCaught))
	size := 0
	for g, e := range b.lost {
		if now.Sub(e.when) > lostKeep {
			delete(b.lost, g)
			continue
		}
		if len(out) < maxCaught && size+len(g) <= maxCaughtBytes {
			out[g] = e.pos
			size += len(g) + 72
		}
	}
	return out
}

// lostThrough returns, for the groups of routes an evacuation took from
// another node (their record pins a checkpoint of it) and whose pin that
// node saved over, the last ingress sequence it routed of each, where its
// checkpoint says so and that message is gone from the queue stream: a
// catch-up starts after it. A node that saved over the pin before it had
// seen the record taking the group (its checkpoint's Seen is older) is
// given a few checkpoint intervals to save again, while it is live.
func (r *Router) lostThrough(ctx context.Context, routes map[string]kvbinding.Binding) map[string]uint64 {
	if r.reg == nil {
		return nil
	}
	byNode := map[string][]string{}
	for g, route := range routes {
		if route.Ckpt != 0 && route.PrevNode != "" && route.PrevNode != r.cfg.Node && g != "" {
			byNode[route.PrevNode] = append(byNode[route.PrevNode], g)
		}
	}
	if len(byNode) == 0 {
		return nil
	}
	var stream jetstream.Stream
	out := map[string]uint64{}
	for node, groups := range byNode {
		c, ok := r.lostCheckpoint(ctx, node, groups, routes)
		if !ok {
			continue
		}
		for _, g := range groups {
			p, ok := c.Lost[g]
			if !ok || p.Epoch() != routes[g].Epoch || p.Seq() < routes[g].FromSeq {
				continue
			}
			if stream == nil {
				var err error
				if stream, err = r.js.Stream(ctx, QueueStream); err != nil {
					r.log.Info("hand-over: cannot read the queue stream to check what the old node routed; the take-over routes from its start",
						"node", node, "err", err)
					return out
				}
			}
			_, err := stream.GetMsg(ctx, p.At())
			switch {
			case isGone(err):
				out[g] = p.Seq()
				r.log.Debug("hand-over: the old node routed the group up to a message gone from its queue; the catch-up starts after it",
					"group", logagg.Short(g), "node", node, "ingress_seq", p.Seq(), "queue_seq", p.At())
			case err == nil:
				r.log.Debug("hand-over: the old node's last message of the group is still queued; the take-over routes from its start",
					"group", logagg.Short(g), "node", node, "ingress_seq", p.Seq(), "queue_seq", p.At())
			default:
				r.log.Info("hand-over: cannot check the old node's last message of the group; the take-over routes from its start",
					"group", logagg.Short(g), "node", node, "queue_seq", p.At(), "err", err)
			}
		}
	}
	return out
}

// lostCheckpoint reads node's checkpoint for lostThrough: false when it
// cannot be read, or it is the one every group's record pins (nothing was
// saved over it). While it was saved over before node had seen the record
// that took one of the groups, it is read again while node is live, for
// up to lostWaits checkpoint intervals.
func (r *Router) lostCheckpoint(ctx context.Context, node string, groups []string, routes map[string]kvbinding.Binding) (kvbinding.Checkpoint, bool) {
	wait := time.Duration(lostWaits) * r.cfg.CheckpointInterval
	deadline := time.Now().Add(wait)
	for {
		c, rev, ok, err := r.reg.LoadCheckpointRev(ctx, node)
		if err != nil || !ok {
			if err != nil && !errors.Is(err, context.Canceled) {
				r.log.Info("hand-over: the old node's checkpoint cannot be read; the take-over routes from its start",
					"node", node, "err", err)
			}
			return kvbinding.Checkpoint{}, false
		}
		behind, void := 0, false
		for _, g := range groups {
			if routes[g].Ckpt == rev {
				continue
			}
			void = true
			if _, ok := c.Lost[g]; !ok && c.Seen < routes[g].Epoch {
				behind++
			}
		}
		if !void {
			return kvbinding.Checkpoint{}, false
		}
		if _, live := r.reg.Live()[node]; behind == 0 || !live || time.Now().After(deadline) {
			r.log.Debug("hand-over: the old node saved over the pinned checkpoint; what it says of the groups taken from it",
				"node", node, "revision", rev, "lost", len(c.Lost), "seen", c.Seen, "not_seen", behind)
			return c, true
		}
		select {
		case <-ctx.Done():
			return kvbinding.Checkpoint{}, false
		case <-time.After(r.cfg.CheckpointInterval):
		}
	}
}

// lostWaits is how many checkpoint intervals lostCheckpoint waits for an
// old node to save a checkpoint that knows of the records taking its groups.
const lostWaits = 3
