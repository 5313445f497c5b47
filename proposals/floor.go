package proposals

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// The routing floor F (docs/protocol.md, "The routing floor"): every
// ingress message below F was resolved — routed, skipped as another
// node's, or dead-lettered — by every node that was live when F was
// raised. No binding starts below F (Transition refuses the bind, and the
// asking node drops its messages below F: they were routed), and a node
// without a checkpoint starts reading the ingress at F. So a node that
// joins, is renamed or lost its checkpoint does not bind again, from old
// sequences, the groups whose ended records have expired.

// floorEvery is how often the active handler recomputes the floor.
const floorEvery = time.Second

// NextFloor returns the routing floor after prev. starts holds, for each
// live node, its checkpoint's Start (every sequence below it is done at
// that node), or 0 for a live node without a usable checkpoint: such a
// node started reading at the floor of its start and may hold messages
// from there, so it holds the floor where it is until it saves one.
// ingressNext is the ingress stream's last sequence plus one (0: unknown).
//
// The floor is the least of starts, never below prev (monotonic: a node
// that restarted from an older checkpoint does not lower it), never past
// ingressNext, and prev when no live node has a checkpoint (a stopped
// cluster keeps its floor). A prev past ingressNext means the ingress
// stream was recreated: its sequences start again, and so does the floor,
// from 0. reset reports that case.
func NextFloor(prev uint64, starts map[string]uint64, ingressNext uint64) (floor uint64, reset bool) {
	if ingressNext > 0 && prev > ingressNext {
		return 0, true
	}
	floor = prev
	first := true
	var least uint64
	for _, s := range starts {
		if first || s < least {
			least, first = s, false
		}
	}
	if !first && least > floor {
		floor = least
	}
	if ingressNext > 0 && floor > ingressNext {
		floor = ingressNext
	}
	return floor, false
}

// Floor returns the routing floor this handler refuses binds below (0
// before it first read or raised it).
func (h *Handler) Floor() uint64 { return h.floor.Load() }

// keepFloor raises the routing floor every floorEvery while this handler
// is active (ctx is its term's), in its own goroutine: reading the nodes'
// checkpoints must never delay the lease renewals.
func (h *Handler) keepFloor(ctx context.Context) {
	t := time.NewTicker(floorEvery)
	defer t.Stop()
	for {
		h.advanceFloor(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// advanceFloor is one round of keepFloor: it reads the stored floor and
// the live nodes' checkpoints, and stores the next floor (compare-and-set:
// two overlapping handlers cannot lower it) before it refuses binds below
// it. A failed read skips the round: the floor stays where it was.
func (h *Handler) advanceFloor(ctx context.Context) {
	now := time.Now()
	ctx, cancel := context.WithTimeout(ctx, floorEvery)
	defer cancel()
	stored, rev, err := h.reg.LoadFloor(ctx)
	switch {
	case errors.Is(err, kvbinding.ErrInvalidFloor):
		h.log.Error("the stored routing floor is invalid; it is written over", "err", err)
	case err != nil:
		h.floorWarn(now, "cannot read the routing floor; keeping it", err)
		return
	}
	starts := map[string]uint64{}
	for node := range h.reg.Live() {
		c, ok, err := h.reg.LoadCheckpoint(ctx, node)
		switch {
		case errors.Is(err, kvbinding.ErrInvalidCheckpoint):
			// That node re-reads from the floor: it holds the floor, as a
			// node without a checkpoint does.
			starts[node] = 0
		case err != nil:
			h.floorWarn(now, "cannot read a live node's checkpoint; keeping the routing floor", err)
			return
		case ok:
			starts[node] = c.Start()
		default:
			// Live without a checkpoint yet: it started reading at the
			// floor of its start, and its groups' messages above that are
			// routed by it alone. Raising the floor past them would have
			// it skip them after a crash (it restarts at the floor).
			starts[node] = 0
		}
	}
	var ingressNext uint64
	if q := h.cfg.Queues; q != nil {
		last, err := q.IngressLast(ctx)
		if err != nil {
			h.floorWarn(now, "cannot read the ingress stream's last sequence; keeping the routing floor", err)
			return
		}
		ingressNext = last + 1
	}
	prev := max(stored.Seq, h.floor.Load())
	next, reset := NextFloor(prev, starts, ingressNext)
	if !h.auth.holds(time.Now()) {
		// What was read may be the view of a side that lost the servers'
		// quorum (authority.go): decide nothing from it.
		return
	}
	if reset {
		// A stream leader cut off from its quorum answers its stream info
		// from its own state until it steps down, and a replica that
		// lagged answers an older end: a floor past the end read is not
		// enough. Only a stream created after the floor was last stored
		// starts the floor again.
		created, cerr := h.ingressCreated(ctx)
		if cerr != nil || !created.After(stored.At) || !h.auth.holds(time.Now()) {
			h.floorWarn(now, "the ingress stream's end read is below the routing floor, but the stream was not recreated since the floor was stored (a stale read?); keeping the floor",
				fmt.Errorf("floor %d, ingress next %d, stream created %v, floor stored %v (%v)", prev, ingressNext, created, stored.At, cerr))
			return
		}
		h.log.Error("the ingress stream was recreated after the routing floor was stored (its end is below the floor); the floor starts again from 0",
			"floor", prev, "ingress_next", ingressNext, "created", created, "floor_stored", stored.At)
	}
	if next != stored.Seq || err != nil {
		if _, err := h.reg.StoreFloor(ctx, kvbinding.Floor{Seq: next, At: now.UTC(), By: h.id}, rev); err != nil {
			// Another handler wrote it meanwhile (an overlap during a
			// lease change), or the write failed: read it again next time.
			h.floorWarn(now, "routing floor not stored; keeping it", err)
			return
		}
		h.log.Debug("routing floor raised", "from", prev, "to", next, "live_checkpoints", len(starts))
	}
	h.floor.Store(next)
}

// loadFloor reads the stored floor into the handler's before it answers
// as the active handler (keepFloor follows).
func (h *Handler) loadFloor(ctx context.Context) {
	f, _, err := h.reg.LoadFloor(ctx)
	if err != nil {
		h.log.Warn("cannot read the routing floor before answering; it is read again on the first tick", "err", err)
		return
	}
	if f.Seq > h.floor.Load() {
		h.floor.Store(f.Seq)
	}
}

// floorWarn logs a failure of the floor keeping at most once a minute.
func (h *Handler) floorWarn(now time.Time, msg string, err error) {
	if now.Sub(h.floorWarned) < time.Minute {
		h.log.Debug(msg, "err", err)
		return
	}
	h.floorWarned = now
	h.log.Warn(msg, "err", err, "floor", h.floor.Load())
}

// ingressCreated returns when the ingress stream was created, if the
// Queues given can tell (the zero time otherwise: no reset).
func (h *Handler) ingressCreated(ctx context.Context) (time.Time, error) {
	c, ok := h.cfg.Queues.(interface {
		IngressCreated(ctx context.Context) (time.Time, error)
	})
	if !ok {
		return time.Time{}, errors.New("the ingress stream's creation time is unknown")
	}
	return c.IngressCreated(ctx)
}
