package proposals

import (
	"fmt"
	"sync"
	"time"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// groupLimit serializes the limit checks of concurrent decisions: a
// check counts the bound groups and the new ones being written
// (Cache.BoundReserved) and reserves its own new group under one lock, so
// that concurrent batches never bind past the limit together. The cache
// counts a group being written once, whether its record came through the
// handler's Apply or, first, through the watch; a reservation ends there,
// or when its record is not written (writeAll, unreserve).
type groupLimit struct {
	mu sync.Mutex
}

// decide runs fn with the lock held, passing the groups bound and
// reserved in cache. When fn returns true, group is reserved until
// release.
func (l *groupLimit) decide(cache *kvbinding.Cache, group string, fn func(bound int) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if fn(cache.BoundReserved()) {
		cache.Reserve(kvbinding.Ref(group))
	}
}

// release ends a reservation of group in cache (its record is written and
// in the cache, or is not written).
func (l *groupLimit) release(cache *kvbinding.Cache, group string) {
	cache.Unreserve(kvbinding.Ref(group))
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
