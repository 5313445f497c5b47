package proposals

import (
	"slices"
	"sync"
)

// groupLocks makes a group's decisions one at a time in the handler: from
// reading its record in the cache, through the write, to the event that
// announces it. Without it a decision could read a record another worker
// had just written (the watch delivers it before that worker has its
// PubAck) and announce its own change before the earlier one: a "move"
// event before the "bind" it moves.
type groupLocks struct {
	mu   sync.Mutex
	cond sync.Cond
	held map[string]struct{}
}

func newGroupLocks() *groupLocks {
	l := &groupLocks{held: map[string]struct{}{}}
	l.cond.L = &l.mu
	return l
}

// lock takes the locks of groups (duplicates allowed), waiting for those
// another decision holds, and returns the function that releases them.
// Every caller takes all its groups at once, in sorted order, and no
// caller takes more while holding some: there is no deadlock.
func (l *groupLocks) lock(groups []string) (unlock func()) {
	keys := slices.Clone(groups)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	l.mu.Lock()
	for _, k := range keys {
		for {
			if _, busy := l.held[k]; !busy {
				break
			}
			l.cond.Wait()
		}
		l.held[k] = struct{}{}
	}
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		for _, k := range keys {
			delete(l.held, k)
		}
		l.mu.Unlock()
		l.cond.Broadcast()
	}
}
