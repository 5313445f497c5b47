package kvbinding

import (
	"context"
	"sync"
	"sync/atomic"
)

// Route is the cached view of one group's binding record.
type Route struct {
	State      State
	Node       string // bound node, or the target of a move ("" otherwise)
	FromSeq    uint64 // first ingress sequence routed to Node (StateBound)
	ThroughSeq uint64 // last sequence of the ended binding (released, dead-lettered)
	PrevNode   string // node routing the messages before FromSeq / through ThroughSeq
	Handoff    bool   // Node is still taking the group over from PrevNode
	Revision   uint64
}

// Action says what a node does with a message, given a group's record.
type Action uint8

const (
	// ActRoute: the message belongs to the owner returned with it ("" for
	// a dead-lettered message); if that is not this node, skip it.
	ActRoute Action = iota + 1
	// ActWait: hold the message; a change that concerns this node is in
	// progress and a later record will decide.
	ActWait
	// ActPropose: no binding covers the message; propose one.
	ActPropose
)

// Owner says, for node me, what to do with the group's message at ingress
// sequence seq according to this record.
func (r Route) Owner(seq uint64, me string) (owner string, act Action) {
	switch r.State {
	case StateBound:
		if seq < r.FromSeq {
			if r.PrevNode != "" {
				return r.PrevNode, ActRoute
			}
			// History before FromSeq is unknown: the current binding stands
			// (the queue stream's duplicate window absorbs a double route).
			return r.Node, ActRoute
		}
		if r.Handoff && r.Node == me {
			return "", ActWait
		}
		return r.Node, ActRoute
	case StateMoving:
		if me == r.Node || me == r.PrevNode {
			return "", ActWait
		}
		// Neither the old nor the new owner: never this node's to route.
		return r.PrevNode, ActRoute
	case StateReleased:
		if seq <= r.ThroughSeq {
			return r.PrevNode, ActRoute
		}
	case StateDeadLettered:
		if seq <= r.ThroughSeq {
			return "", ActRoute
		}
	}
	return "", ActPropose
}

// entry is the compact cached form of a record: node names are interned.
type entry struct {
	rev     uint64
	seq     uint64 // FromSeq, or ThroughSeq when released or dead-lettered
	node    uint32 // index into Cache.names; 0 = none
	prev    uint32
	state   uint8
	handoff bool
}

const (
	stateBound uint8 = iota + 1
	stateDead
	stateMoving
	stateReleased
)

// Cache is an in-memory copy of the bindings bucket kept current by a KV
// watch. It is complete once Ready is closed. Revisions it has applied are
// never applied again, so a watcher that replays the bucket (as one does
// after its server dies) changes nothing. It is safe for concurrent use.
type Cache struct {
	mu       sync.RWMutex
	m        map[string]entry
	names    []string // interned node names; names[0] = ""
	index    map[string]uint32
	counts   []int // bound groups per interned node
	leaving  []int // groups being moved away from each interned node
	watchRev uint64

	onChange func(Binding, bool)
	warm     atomic.Bool // the initial records are in
	ready    chan struct{}
	once     sync.Once
}

// NewCache returns an empty cache. onChange, if not nil, is called from the
// watching goroutine after each applied change (deleted=true for removals),
// outside the cache's lock and in revision order.
func NewCache(onChange func(b Binding, deleted bool)) *Cache {
	return &Cache{
		m:        make(map[string]entry),
		names:    []string{""},
		index:    map[string]uint32{"": 0},
		counts:   []int{0},
		leaving:  []int{0},
		onChange: onChange,
		ready:    make(chan struct{}),
	}
}

// Ready is closed once the cache holds every binding that existed when the
// watch started.
func (c *Cache) Ready() <-chan struct{} { return c.ready }

// Lookup returns the cached record for a group ("" for the ungrouped
// routing binding).
func (c *Cache) Lookup(group string) (Route, bool) {
	c.mu.RLock()
	e, ok := c.m[group]
	if !ok {
		c.mu.RUnlock()
		return Route{}, false
	}
	r := c.routeLocked(e)
	c.mu.RUnlock()
	return r, true
}

func (c *Cache) routeLocked(e entry) Route {
	r := Route{Revision: e.rev, PrevNode: c.names[e.prev], Node: c.names[e.node], Handoff: e.handoff}
	switch e.state {
	case stateDead:
		r.State, r.ThroughSeq = StateDeadLettered, e.seq
	case stateReleased:
		r.State, r.ThroughSeq = StateReleased, e.seq
	case stateMoving:
		r.State, r.FromSeq = StateMoving, e.seq
	default:
		r.State, r.FromSeq = StateBound, e.seq
	}
	return r
}

// Len returns the number of cached records.
func (c *Cache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}

// Counts returns the number of groups bound to each node (the ungrouped
// routing binding is not counted).
func (c *Cache) Counts() map[string]int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]int, len(c.names))
	for i, n := range c.counts {
		if i > 0 && n > 0 {
			out[c.names[i]] = n
		}
	}
	return out
}

// Count returns the number of groups bound to node.
func (c *Cache) Count(node string) int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if i, ok := c.index[node]; ok {
		return c.counts[i]
	}
	return 0
}

// Apply records b unless the cache already holds the same or a later
// revision of the group. It reports whether it changed the cache. Use it
// for bindings learnt outside the watch (a handler's reply); the watch
// delivers the same revision later and it is then ignored.
func (c *Cache) Apply(b Binding) bool {
	c.mu.Lock()
	changed := c.applyLocked(b, false)
	c.mu.Unlock()
	if changed && c.onChange != nil {
		c.onChange(b, false)
	}
	return changed
}

func (c *Cache) applyLocked(b Binding, fromWatch bool) bool {
	if fromWatch {
		if b.Revision <= c.watchRev {
			return false
		}
		c.watchRev = b.Revision
	}
	old, had := c.m[b.Group]
	if had && old.rev >= b.Revision {
		return false
	}
	if had {
		c.uncount(b.Group, old)
	}
	e := entry{rev: b.Revision, prev: c.intern(b.PrevNode), node: c.intern(b.Node), handoff: b.Handoff}
	switch b.State {
	case StateDeadLettered:
		e.state, e.seq = stateDead, b.ThroughSeq
	case StateReleased:
		e.state, e.seq = stateReleased, b.ThroughSeq
	case StateMoving:
		e.state, e.seq = stateMoving, b.FromSeq
		c.leaving[e.prev]++
	default:
		e.state, e.seq = stateBound, b.FromSeq
		if b.Group != "" {
			c.counts[e.node]++
		}
	}
	c.m[b.Group] = e
	return true
}

func (c *Cache) deleteLocked(group string, rev uint64) bool {
	if rev <= c.watchRev {
		return false
	}
	c.watchRev = rev
	old, had := c.m[group]
	if !had || old.rev >= rev {
		return false
	}
	c.uncount(group, old)
	delete(c.m, group)
	return true
}

func (c *Cache) uncount(group string, e entry) {
	switch {
	case e.state == stateBound && group != "":
		c.counts[e.node]--
	case e.state == stateMoving:
		c.leaving[e.prev]--
	}
}

// Owners returns the nodes that hold groups: bound to them, or being moved
// away from them. The ungrouped routing binding is not counted.
func (c *Cache) Owners() map[string]bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := map[string]bool{}
	for i := range c.names {
		if i > 0 && (c.counts[i] > 0 || c.leaving[i] > 0) {
			out[c.names[i]] = true
		}
	}
	if e, ok := c.m[""]; ok {
		switch e.state {
		case stateBound:
			out[c.names[e.node]] = true
		case stateMoving:
			out[c.names[e.prev]] = true
		}
	}
	return out
}

func (c *Cache) intern(node string) uint32 {
	if node == "" {
		return 0
	}
	if i, ok := c.index[node]; ok {
		return i
	}
	i := uint32(len(c.names))
	c.names = append(c.names, node)
	c.index[node] = i
	c.counts = append(c.counts, 0)
	c.leaving = append(c.leaving, 0)
	return i
}

// Run watches the store's bucket and keeps the cache current until ctx
// ends. It returns ctx's error, or an error if the watch cannot start.
func (c *Cache) Run(ctx context.Context, s *Store) error {
	return watchBucket(ctx, s.js, s.bucket, ">", c.presize, c.applyEntry, func() {
		c.once.Do(func() {
			c.warm.Store(true)
			close(c.ready)
		})
	})
}

// presize grows an empty cache's map to the number of records the watch
// starts with: a warm start of 1M bindings spent a tenth of its time
// growing the map.
func (c *Cache) presize(records uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) == 0 && records > 0 {
		c.m = make(map[string]entry, min(records, 1<<24))
	}
}

func (c *Cache) applyEntry(key string, op entryOp, value []byte, rev uint64) {
	group, err := groupOfKey(key)
	if err != nil {
		return // not a key of ours
	}
	if op == opDelete {
		c.mu.Lock()
		changed := c.deleteLocked(group, rev)
		c.mu.Unlock()
		if changed && c.onChange != nil {
			c.onChange(Binding{Group: group, Revision: rev}, true)
		}
		return
	}
	// A revision the cache already holds (a handler's reply applied it, or
	// the handler wrote it) needs no decoding: most of a router's and a
	// handler's watch traffic is its own decisions coming back. (Not while
	// warming up: then every record is new, and the check costs a lookup.)
	if c.warm.Load() {
		c.mu.Lock()
		if e, had := c.m[group]; had && e.rev >= rev {
			c.watchRev = max(c.watchRev, rev)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
	b, ok := fastBinding(value)
	if !ok {
		var err error
		if b, err = UnmarshalBinding(value); err != nil {
			return // a value we do not understand: leave it to the operator
		}
	}
	if b.Group != group {
		return
	}
	b.Revision = rev
	c.mu.Lock()
	changed := c.applyLocked(b, true)
	c.mu.Unlock()
	if changed && c.onChange != nil {
		c.onChange(b, false)
	}
}

func groupOfKey(key string) (string, error) {
	if key == UngroupedKey {
		return "", nil
	}
	return GroupFromKey(key)
}

// GroupsOf returns the groups whose record names node as the bound node
// (StateBound) or, for a move in progress, as the node moved from.
func (c *Cache) GroupsOf(node string) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	i, ok := c.index[node]
	if !ok {
		return nil
	}
	var out []string
	for g, e := range c.m {
		if (e.state == stateBound && e.node == i) || (e.state == stateMoving && e.prev == i) {
			out = append(out, g)
		}
	}
	return out
}

// Each calls fn for every cached record until fn returns false. It holds
// the cache's read lock: fn must not call back into the cache.
func (c *Cache) Each(fn func(group string, r Route) bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for g, e := range c.m {
		if !fn(g, c.routeLocked(e)) {
			return
		}
	}
}
