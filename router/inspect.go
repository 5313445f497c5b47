package router

import (
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// heldUndecided returns the groups whose messages this node holds for want
// of a decision (kvbinding.NodeInfo.Waiting): at most
// kvbinding.MaxWaitingListed of them, those with the most messages first
// (then the oldest), and how many groups are held so. A group's Since is
// the first call that saw it held from the same first message: now, or
// an earlier call's now, kept on its lane. It keeps the first
// MaxWaitingListed in a heap as it goes over the lanes, so a burst of
// hundreds of thousands of held groups costs no sort and no copy of them.
func (r *Router) heldUndecided(now time.Time) ([]kvbinding.HeldGroup, int) {
	top := newTopK(kvbinding.MaxWaitingListed, func(a, b kvbinding.HeldGroup) bool {
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return a.OldestSeq < b.OldestSeq
	})
	r.mu.Lock()
	r.eng.undecided(now, top.offer)
	r.mu.Unlock()
	if top.seen == 0 {
		return nil, 0
	}
	return top.sorted(), top.seen
}
