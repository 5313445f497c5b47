package proposals

import (
	"fmt"
	"sync"
	"time"

	"grouprouter/internal/logagg"
)

// groupLimit counts the new bound groups decided but not yet in the
// handler's cache (their records are being written), so that a limit
// check counts them: Cache.Bound plus these. A reservation ends when its
// record is stored and applied to the cache (writeAll), or is not
// written. A record the watch applies before its PubAck comes is counted
// twice for that moment: the limit may refuse a group a moment early,
// never bind one past it.
type groupLimit struct {
	mu       sync.Mutex
	reserved int
}

// decide runs fn with the lock held, passing the groups reserved.
func (l *groupLimit) decide(fn func(inFlight int)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fn(l.reserved)
}

// release ends n reservations (their batch is written, or failed).
func (l *groupLimit) release(n int) {
	l.mu.Lock()
	l.reserved -= n
	l.mu.Unlock()
}

// limitEventEvery bounds the limit events: one per interval while new
// groups are refused (the aggregated warning and the counter carry the
// numbers).
const limitEventEvery = 10 * time.Second

// refusedAtLimit counts a bind refused at the group limit, warns
// (aggregated) and announces it: a "limit" event at most once per
// limitEventEvery.
func (h *Handler) refusedAtLimit(group string, res Result) {
	n := h.limitRefused.Add(1)
	h.warnLimit.Warn(group, "limit", res.Limit, "refused", n)
	now := time.Now().UnixNano()
	last := h.limitEvent.Load()
	if now-last < int64(limitEventEvery) || !h.limitEvent.CompareAndSwap(last, now) {
		return
	}
	h.publish(Event{Kind: EventLimit, Group: group, By: h.id,
		Reason: fmt.Sprintf("%s; new groups are dead-lettered (%d refused so far)", res.Reason, n)})
	h.log.Debug("group limit event", "group", logagg.Short(group), "limit", res.Limit, "refused", n)
}

// LimitRefused returns how many binds this handler refused at the group
// limit.
func (h *Handler) LimitRefused() uint64 { return h.limitRefused.Load() }
