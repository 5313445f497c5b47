package router

import (
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// simLog is a KV bucket's change log as watchers see it: entries in
// revision order, delivered to each subscriber one at a time, in order,
// each after a network hop.
type simLog[T any] struct {
	w       *simWorld
	entries []T
	subs    []*simSub[T]
}

type simSub[T any] struct {
	log     *simLog[T]
	owner   string // the node whose link the deliveries cross
	pos     int
	busy    bool
	stopped bool
	deliver func(T)
}

func (l *simLog[T]) append(e T) {
	l.entries = append(l.entries, e)
	live := l.subs[:0]
	for _, s := range l.subs {
		if !s.stopped {
			live = append(live, s)
			s.kick()
		}
	}
	clear(l.subs[len(live):])
	l.subs = live
}

// subscribe starts owner's watch from now on (the caller loaded the
// current state itself, as a watch's initial values).
func (l *simLog[T]) subscribe(owner string, deliver func(T)) *simSub[T] {
	s := &simSub[T]{log: l, owner: owner, pos: len(l.entries), deliver: deliver}
	l.subs = append(l.subs, s)
	return s
}

func (s *simSub[T]) kick() {
	if s.busy || s.stopped || s.pos >= len(s.log.entries) {
		return
	}
	s.busy = true
	s.log.w.hop(s.owner, s.log.w.lat(), func() {
		s.busy = false
		if s.stopped {
			return
		}
		e := s.log.entries[s.pos]
		s.pos++
		s.deliver(e)
		s.kick()
	})
}

// caughtUp reports whether the subscriber has seen every entry.
func (s *simSub[T]) caughtUp() bool { return s.pos >= len(s.log.entries) }

// simKVEntry is one change of the bindings bucket: a record, or the delete
// marker of an ended record whose TTL ran out (b nil).
type simKVEntry struct {
	rev   uint64
	group string
	b     *kvbinding.Binding
}

// simKV is the bindings bucket: the records (the truth), the revision of
// each key's last message (delete markers included) and the change log.
type simKV struct {
	w    *simWorld
	rev  uint64
	recs map[string]kvbinding.Binding
	last map[string]uint64
	log  simLog[simKVEntry]
}

func newSimKV(w *simWorld) *simKV {
	return &simKV{w: w, recs: map[string]kvbinding.Binding{}, last: map[string]uint64{}, log: simLog[simKVEntry]{w: w}}
}

// write stores b as kvbinding.Store does: Create (create), ReplaceTTL
// (ended: rev 0 means the group must have no record) or Replace
// (compare-and-set on rev). On a conflict it returns the current record
// (zero if there is none) and ErrExists or ErrConflict.
func (kv *simKV) write(b kvbinding.Binding, create bool, rev uint64, ended bool) (kvbinding.Binding, error) {
	if err := b.Validate(); err != nil {
		kv.w.chk.violation("record", "the state machine decided an invalid record %+v: %v", b, err)
		return kvbinding.Binding{}, err
	}
	cur, has := kv.recs[b.Group]
	switch {
	case create || (ended && rev == 0):
		if has {
			return cur, kvbinding.ErrExists
		}
	default:
		if !has || kv.last[b.Group] != rev {
			return cur, kvbinding.ErrConflict
		}
	}
	kv.rev++
	b.Revision = kv.rev
	kv.recs[b.Group] = b
	kv.last[b.Group] = b.Revision
	bb := b
	kv.log.append(simKVEntry{rev: b.Revision, group: b.Group, b: &bb})
	kv.w.chk.recordWritten(b, cur)
	if ended {
		// The server removes the message after its TTL (whole seconds)
		// and leaves a delete marker, which watchers see.
		ttl := (kv.w.p.recordTTL + time.Second - 1).Truncate(time.Second)
		g, r := b.Group, b.Revision
		kv.w.after(ttl+kv.w.between(0, time.Second), func() {
			if kv.last[g] != r {
				return
			}
			kv.rev++
			delete(kv.recs, g)
			kv.last[g] = kv.rev
			kv.w.logf("kv", "record of %q expired (rev %d)", g, kv.rev)
			kv.log.append(simKVEntry{rev: kv.rev, group: g})
		})
	}
	return b, nil
}

// simCache is a process's watched copy of the bindings bucket, with the
// kvbinding.Cache rules: a revision already held is not applied again.
// It implements the engine's records interface (with Count).
type simCache struct {
	m        map[string]kvbinding.Binding
	watchRev uint64
}

func newSimCache(kv *simKV) *simCache {
	c := &simCache{m: make(map[string]kvbinding.Binding, len(kv.recs)), watchRev: kv.rev}
	for g, b := range kv.recs {
		c.m[g] = b.Cached()
	}
	return c
}

func (c *simCache) Lookup(group string) (kvbinding.Binding, bool) {
	r, ok := c.m[group]
	return r, ok
}

// Count returns the number of groups bound to node (any step).
func (c *simCache) Count(node string) int {
	n := 0
	for g, r := range c.m {
		if g != "" && r.State == kvbinding.StateBound && r.Node == node {
			n++
		}
	}
	return n
}

// apply takes a record from the watch (fromWatch) or written by this
// process's handler, and reports whether it changed the cache.
// Bound is kvbinding.Cache.Bound: groups bound or being moved.
func (c *simCache) Bound() int {
	n := 0
	for g, r := range c.m {
		if g != "" && !r.Invalid && (r.State == kvbinding.StateBound || r.State == kvbinding.StateMoving) {
			n++
		}
	}
	return n
}

func (c *simCache) apply(b kvbinding.Binding, fromWatch bool) bool {
	if fromWatch {
		if b.Revision <= c.watchRev {
			return false
		}
		c.watchRev = b.Revision
	}
	if old, had := c.m[b.Group]; had && old.Revision >= b.Revision {
		return false
	}
	c.m[b.Group] = b.Cached()
	return true
}

func (c *simCache) applyDelete(group string, rev uint64) bool {
	if rev <= c.watchRev {
		return false
	}
	c.watchRev = rev
	old, had := c.m[group]
	if !had || old.Revision >= rev {
		return false
	}
	delete(c.m, group)
	return true
}

// counts is Cache.Counts: bound groups per node, the ungrouped binding
// not counted.
func (c *simCache) counts() map[string]int {
	out := map[string]int{}
	for g, r := range c.m {
		if g != "" && r.State == kvbinding.StateBound {
			out[r.Node]++
		}
	}
	return out
}

// owners is Cache.Owners: the nodes groups are bound to or moving away
// from, sorted.
func (c *simCache) owners() []string {
	set := map[string]bool{}
	for _, r := range c.m {
		switch r.State {
		case kvbinding.StateBound:
			set[r.Node] = true
		case kvbinding.StateMoving:
			set[r.PrevNode] = true
		}
	}
	return sortedKeys(set)
}

// unsettled is Cache.Unsettled's groups, sorted.
func (c *simCache) unsettled() []string {
	var out []string
	for _, g := range sortedKeys(c.m) {
		if r := c.m[g]; r.State == kvbinding.StateMoving || (r.State == kvbinding.StateBound && r.Step != kvbinding.StepNone) {
			out = append(out, g)
		}
	}
	return out
}

// groupsOf is Cache.RefsOf (the simulation's ids are short: a ref is the id), sorted.
func (c *simCache) groupsOf(node string) []string {
	var out []string
	for _, g := range sortedKeys(c.m) {
		r := c.m[g]
		if (r.State == kvbinding.StateBound && r.Node == node) || (r.State == kvbinding.StateMoving && r.PrevNode == node) {
			out = append(out, g)
		}
	}
	return out
}

// draining is Cache.Draining.
func (c *simCache) draining() map[string]int {
	out := map[string]int{}
	for _, r := range c.m {
		if r.State == kvbinding.StateBound && r.Step == kvbinding.StepDrain {
			for _, n := range r.Drain {
				out[n]++
			}
		}
	}
	return out
}

// catchingUp is Cache.CatchingUp.
func (c *simCache) catchingUp() map[string]int {
	out := map[string]int{}
	for _, r := range c.m {
		if r.State == kvbinding.StateBound && r.Step == kvbinding.StepCatchUp && r.PrevNode != "" {
			out[r.PrevNode]++
		}
	}
	return out
}

// simRegEntry is one change of the liveness records: an announcement or a
// removal (withdrawn, or expired).
type simRegEntry struct {
	node string
	put  bool
	has  bool
	gen  uint64 // a put's: its record's generation (the KV revision)
}

type simLiveRec struct {
	has bool
	gen uint64
}

// simRegistry is the node registry: liveness records with a TTL, their
// change log, and the checkpoints.
type simRegistry struct {
	w    *simWorld
	gen  uint64
	live map[string]simLiveRec
	log  simLog[simRegEntry]
	ckpt map[string]kvbinding.Checkpoint
	// ckptRev: each checkpoint's revision (the bucket keeps one per key);
	// revs counts the saves.
	ckptRev map[string]uint64
	revs    uint64
}

func newSimRegistry(w *simWorld) *simRegistry {
	return &simRegistry{w: w, live: map[string]simLiveRec{}, log: simLog[simRegEntry]{w: w}, ckpt: map[string]kvbinding.Checkpoint{},
		ckptRev: map[string]uint64{}}
}

// saveCheckpoint is Registry.SaveCheckpoint.
func (r *simRegistry) saveCheckpoint(node string, c kvbinding.Checkpoint) {
	r.revs++
	r.ckpt[node], r.ckptRev[node] = c, r.revs
}

// checkpointAt is Registry.LoadCheckpointAt: node's checkpoint while it is
// still the one saved at rev.
func (r *simRegistry) checkpointAt(node string, rev uint64) (kvbinding.Checkpoint, bool) {
	if rev == 0 || r.ckptRev[node] != rev {
		return kvbinding.Checkpoint{}, false
	}
	return r.ckpt[node], true
}

// announce stores node's liveness record (TTL: kvbinding.NodeTTL, whole
// seconds, as Registry.Announce).
func (r *simRegistry) announce(node string, has bool) {
	r.gen++
	gen := r.gen
	r.live[node] = simLiveRec{has: has, gen: gen}
	r.log.append(simRegEntry{node: node, put: true, has: has, gen: gen})
	ttl := kvbinding.NodeTTL(simHeartbeat)
	r.w.after(ttl+r.w.between(0, time.Second), func() {
		if rec, ok := r.live[node]; ok && rec.gen == gen {
			delete(r.live, node)
			r.w.logf("registry", "liveness record of %s expired", node)
			r.log.append(simRegEntry{node: node})
		}
	})
}

func (r *simRegistry) withdraw(node string) {
	delete(r.live, node)
	r.log.append(simRegEntry{node: node})
}

// simRegView is one process's watched view of the liveness records, as
// kvbinding.Registry keeps it (seen: when it last received each node's
// announcement).
type simRegView struct {
	w        *simWorld
	live     map[string]bool
	seen     map[string]time.Duration
	rev      map[string]uint64 // Registry.SeenRevision
	sub      *simSub[simRegEntry]
	onChange func()
}

func newSimRegView(w *simWorld, owner string, onChange func()) *simRegView {
	v := &simRegView{w: w, live: map[string]bool{}, seen: map[string]time.Duration{}, rev: map[string]uint64{}, onChange: onChange}
	for node, rec := range w.reg.live {
		v.live[node] = rec.has
		v.seen[node] = w.clock
		v.rev[node] = rec.gen
	}
	v.sub = w.reg.log.subscribe(owner, v.apply)
	return v
}

func (v *simRegView) apply(e simRegEntry) {
	changed := false
	if e.put {
		old, had := v.live[e.node]
		changed = !had || old != e.has
		v.live[e.node] = e.has
		v.seen[e.node] = v.w.clock
		v.rev[e.node] = max(v.rev[e.node], e.gen)
	} else if _, had := v.live[e.node]; had {
		delete(v.live, e.node)
		delete(v.seen, e.node)
		changed = true
	}
	if changed && v.onChange != nil {
		v.onChange()
	}
}

// simLease is the handler lease: the term holding it, when it was last
// renewed, and the node of the last holder.
type simLease struct {
	term    *simHandler
	renewed time.Duration
	last    string
}
