package router

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"grouprouter/kvbinding"
)

// heldTracker remembers since when each group has been held undecided, from
// one announcement to the next.
type heldTracker struct {
	mu    sync.Mutex
	since map[string]heldSince
}

// heldSince is when a group was first seen held undecided from seq.
type heldSince struct {
	seq uint64
	at  time.Time
}

// heldUndecided returns the groups whose messages this node holds for want
// of a decision (kvbinding.NodeInfo.Waiting): at most
// kvbinding.MaxWaitingListed of them, those with the most messages first
// (then the oldest), and how many groups are held so. A group's Since is
// the first call that saw it held from the same first message: now, or
// an earlier call's now. It copies what it needs from the lanes under r.mu
// and sorts outside it.
func (r *Router) heldUndecided(now time.Time) ([]kvbinding.HeldGroup, int) {
	var all []kvbinding.HeldGroup
	r.mu.Lock()
	for g, ln := range r.eng.lanes {
		if ln.waiting && len(ln.msgs) > 0 {
			all = append(all, kvbinding.HeldGroup{Group: g, Count: len(ln.msgs), OldestSeq: ln.msgs[0].seq})
		}
	}
	r.mu.Unlock()

	t := &r.held
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(all) == 0 {
		t.since = nil
		return nil, 0
	}
	since := make(map[string]heldSince, len(all))
	for i := range all {
		h := &all[i]
		s, ok := t.since[h.Group]
		if !ok || s.seq != h.OldestSeq {
			s = heldSince{seq: h.OldestSeq, at: now}
		}
		since[h.Group] = s
		h.Since = s.at
	}
	t.since = since
	slices.SortFunc(all, func(a, b kvbinding.HeldGroup) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.OldestSeq, b.OldestSeq)
	})
	return all[:min(len(all), kvbinding.MaxWaitingListed):min(len(all), kvbinding.MaxWaitingListed)], len(all)
}
