package router

import (
	"cmp"
	"slices"
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
	// key and value: as the bucket stores the record (value nil: the
	// delete marker).
	key   string
	value []byte
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
	key, value := simEncode(b)
	kv.log.append(simKVEntry{rev: b.Revision, group: b.Group, b: &bb, key: key, value: value})
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
			key, _ := kvbinding.KeyOf(g)
			kv.log.append(simKVEntry{rev: kv.rev, group: g, key: key})
		})
	}
	return b, nil
}

// simEncode returns the key and value under which the bucket stores b.
func simEncode(b kvbinding.Binding) (string, []byte) {
	key, err := kvbinding.KeyOf(b.Group)
	if err != nil {
		panic("sim: " + err.Error())
	}
	value, err := b.Marshal()
	if err != nil {
		panic("sim: " + err.Error())
	}
	return key, value
}

// cache returns a process's real kvbinding.Cache, loaded as a watch
// starts: the latest record of every key, in revision order (the caller
// subscribes to the changes from now on).
func (kv *simKV) cache() *kvbinding.Cache {
	c := kvbinding.NewCache(kvbinding.CacheConfig{})
	f := c.Feed()
	f.Start(uint64(len(kv.recs)))
	recs := make([]kvbinding.Binding, 0, len(kv.recs))
	for _, b := range kv.recs {
		recs = append(recs, b)
	}
	slices.SortFunc(recs, func(a, b kvbinding.Binding) int { return cmp.Compare(a.Revision, b.Revision) })
	for _, b := range recs {
		key, value := simEncode(b)
		f.Put(key, value, b.Revision)
	}
	f.Ready()
	return c
}

// simRefsOf is Cache.RefsOf, sorted (the simulation's group ids are
// short: a ref is the id).
func simRefsOf(c *kvbinding.Cache, node string) []string {
	refs := c.RefsOf(node)
	slices.Sort(refs)
	return refs
}

// simRegEntry is one change of the liveness records: an announcement, or
// a withdrawal. A record's expiry leaves no marker (the registry bucket is
// hardened: kvbinding.OpenRegistry): watchers learn of it by looking the
// record up (kvbinding.LiveView.ExpireDue).
type simRegEntry struct {
	node  string
	put   bool
	gen   uint64 // a put's: its record's generation (the KV revision)
	value []byte // a put's: the record as stored
}

type simLiveRec struct {
	gen   uint64
	value []byte
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

// announce stores info as its node's liveness record, living ttl (whole
// seconds, as Registry.Announce); the server removes it after that unless
// announced again, without a marker.
func (r *simRegistry) announce(info kvbinding.NodeInfo, ttl time.Duration) {
	value, err := kvbinding.LiveValue(info, ttl)
	if err != nil {
		panic("sim: " + err.Error())
	}
	node := info.Node
	r.gen++
	gen := r.gen
	r.live[node] = simLiveRec{gen: gen, value: value}
	r.log.append(simRegEntry{node: node, put: true, gen: gen, value: value})
	ttl = max((ttl + time.Second - 1).Truncate(time.Second), time.Second)
	r.w.after(ttl+r.w.between(0, time.Second), func() {
		if rec, ok := r.live[node]; ok && rec.gen == gen {
			delete(r.live, node)
			r.w.logf("registry", "liveness record of %s expired", node)
		}
	})
}

func (r *simRegistry) withdraw(node string) {
	delete(r.live, node)
	r.log.append(simRegEntry{node: node})
}

// view returns a process's real kvbinding.LiveView on the simulated
// clock (OnChange: onChange), loaded with the records stored now and
// following their changes over owner's link, calling then after each;
// the returned subscription ends with the process.
func (r *simRegistry) view(owner string, onChange, then func()) (*kvbinding.LiveView, *simSub[simRegEntry]) {
	w := r.w
	v := kvbinding.NewLiveView(kvbinding.LiveViewConfig{Now: w.now, OnChange: onChange})
	f := v.Feed()
	for _, node := range sortedKeys(r.live) {
		rec := r.live[node]
		f.Put(kvbinding.LiveKey(node), rec.value, rec.gen)
	}
	f.Ready()
	sub := r.log.subscribe(owner, func(e simRegEntry) {
		if e.put {
			f.Put(kvbinding.LiveKey(e.node), e.value, e.gen)
		} else {
			f.Delete(kvbinding.LiveKey(e.node), 0)
		}
		then()
	})
	return v, sub
}

// simLease is the handler lease: the term holding it, when it was last
// renewed, and the node of the last holder.
type simLease struct {
	term    *simHandler
	renewed time.Duration
	last    string
}
