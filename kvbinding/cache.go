package kvbinding

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// entry is the compact cached form of a record: node names are interned.
type entry struct {
	rev   uint64
	epoch uint64 // Binding.OwnerEpoch
	seq   uint64 // FromSeq, or ThroughSeq when released or dead-lettered
	node  uint32 // index into Cache.names; 0 = none
	prev  uint32
	// phase is where the record stands (Binding.Phase; its State and Step
	// come back from Phase.Record): PhaseNone for a value that is not
	// usable (Binding.Invalid).
	phase Phase
}

// CacheConfig configures a Cache.
type CacheConfig struct {
	// Notify, if not nil, receives the Ref of the group of every change
	// the cache applies once it is ready ("" is the ungrouped routing
	// binding), in revision order, from the goroutine that applied it (the
	// watch, or a caller of Apply), outside the cache's lock. The send
	// blocks: the receiver must keep reading until the cache's Run
	// returns. A ref is the group id itself but for long ids (see Ref):
	// the delete of a digest key carries no value, and the cache does not
	// keep long ids, so it cannot name their group.
	Notify chan<- string
	// Logger receives the keys of values the cache ignores. Default: discard.
	Logger *slog.Logger
	// OnRewind, if not nil, learns that the bucket went back below what
	// the cache had read (see Cache.Rewinds), with the last revision read
	// and the bucket's last now, from the watch's goroutine.
	OnRewind func(seen, last uint64)
	// RewindCheck is how often the watch checks the bucket for a rewind.
	// Default: 5 s.
	RewindCheck time.Duration
}

// Cache is an in-memory copy of the bindings bucket kept current by a KV
// watch. It is complete once Ready is closed. Revisions it has applied are
// never applied again, so a watcher that replays the bucket (as one does
// after its server dies) changes nothing. It is safe for concurrent use.
//
// A value that does not decode, fails Binding.Validate or names another
// group than its key's is logged and never applied: the cache keeps the
// group's last valid record (and lists the bad revision in Bad, for the
// handler to restore the record over it), or, when it has none, counts
// the group as unbound (Binding.Invalid) until a valid revision comes.
//
// Every map of the cache is keyed by Ref: a group id up to 62 plain
// characters, the digest key of a longer one. A long id is kept only while
// its record is moving or in a hand-over step (the handler's monitor and
// the takeovers need it); otherwise Lookup of a ref returns a record whose
// Group is "", and Store.Names reads the ids from the bucket.
type Cache struct {
	mu     sync.RWMutex
	m      map[string]entry    // by Ref
	drains map[string][]string // Drain lists of records in StepDrain
	// steps: what records in a hand-over step carry beside their entry,
	// for those that carry any of it.
	steps map[string]stepFields
	bad   map[string]uint64 // revisions of bad values over valid records
	// unsettled holds the groups whose record is moving or in a
	// hand-over step (what the handler's monitor looks after): each ref's
	// group id.
	unsettled map[string]string
	names     []string // interned node names; names[0] = ""
	index     map[string]uint32
	counts    []int // bound groups per interned node
	leaving   []int // groups being moved away from each interned node
	watchRev  uint64
	// delivered is the last bucket sequence the watch handed the cache,
	// whatever became of it (applied, already held, refused).
	delivered atomic.Uint64
	ignored   atomic.Uint64
	rewinds   atomic.Uint64
	// rewoundThrough is the highest revision read when the bucket was
	// found below it (RewoundThrough).
	rewoundThrough atomic.Uint64

	// replay, while not nil, receives what the watch reads after a
	// rewind, until its initial records are in: then the cache adopts
	// it (only the watch's goroutine touches the field).
	replay      *Cache
	onRewind    func(seen, last uint64)
	rewindCheck time.Duration
	// legacy holds, by ref, the full key ("r."/"b.", longer than
	// MaxKeyLen) of each group whose record stands under one, written
	// before digest keys (LegacyKey).
	legacy map[string]string
	// reserved counts, by ref, the reservations of groups whose first
	// bound record is being written (Reserve).
	reserved map[string]int

	notify chan<- string
	done   chan struct{} // closed when Run returns: no more notifications
	log    *slog.Logger
	warm   atomic.Bool // the initial records are in
	ready  chan struct{}
	once   sync.Once
}

// NewCache returns an empty cache.
func NewCache(cfg CacheConfig) *Cache {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Cache{
		m:         make(map[string]entry),
		drains:    make(map[string][]string),
		steps:     make(map[string]stepFields),
		bad:       make(map[string]uint64),
		unsettled: make(map[string]string),
		legacy:    make(map[string]string),
		done:      make(chan struct{}),
		names:     []string{""},
		index:     map[string]uint32{"": 0},
		counts:    []int{0},
		leaving:   []int{0},
		notify:    cfg.Notify,
		log:       log,
		ready:     make(chan struct{}),

		onRewind:    cfg.OnRewind,
		rewindCheck: cfg.RewindCheck,
	}
}

// Ready is closed once the cache holds every binding that existed when the
// watch started.
func (c *Cache) Ready() <-chan struct{} { return c.ready }

// Ignored returns how many bucket values the cache refused as invalid.
func (c *Cache) Ignored() uint64 { return c.ignored.Load() }

// Lookup returns the cached record for a group ("" for the ungrouped
// routing binding), or for a group's Ref: a caller that looks a long id
// up often keeps its ref, which costs no hashing. The record's Group is
// the group asked for; asked by the ref of a long id, it is the id while
// the cache keeps it (the record is unsettled), else "".
func (c *Cache) Lookup(group string) (Binding, bool) {
	ref := group
	if !IsRef(group) {
		ref = Ref(group)
	}
	c.mu.RLock()
	e, ok := c.m[ref]
	if !ok {
		c.mu.RUnlock()
		return Binding{}, false
	}
	r := c.routeLocked(ref, e)
	c.mu.RUnlock()
	if !IsRef(group) {
		r.Group = group
	}
	return r, true
}

// nameLocked returns the group id of a ref, or "" when the cache does not
// keep it.
func (c *Cache) nameLocked(ref string) string {
	if !IsRef(ref) {
		return ref
	}
	return c.unsettled[ref]
}

func (c *Cache) routeLocked(ref string, e entry) Binding {
	group := c.nameLocked(ref)
	r := Binding{Group: group, Revision: e.rev, Epoch: e.epoch, PrevNode: c.names[e.prev], Node: c.names[e.node]}
	r.State, r.Step = e.phase.Record()
	switch e.phase {
	case PhaseNone:
		r.Invalid = true
	case PhaseReleased, PhaseDeadLettered:
		r.ThroughSeq = e.seq
	default:
		r.FromSeq = e.seq
	}
	if e.phase == PhaseDraining {
		r.Drain = c.drains[ref]
	}
	if e.phase.TakingOver() {
		f := c.steps[ref]
		r.Routed, r.Reason, r.Ckpt = f.routed, f.reason, f.ckpt
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

// Bound returns the number of groups bound to a node or being moved
// between nodes: the records a group limit counts (ended records, which
// expire by themselves, and the ungrouped routing binding are not).
func (c *Cache) Bound() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.boundLocked()
}

func (c *Cache) boundLocked() int {
	n := 0
	for i := range c.counts {
		n += c.counts[i] + c.leaving[i]
	}
	return n
}

// BoundReserved returns Bound plus the groups reserved (Reserve): what a
// group limit counts.
func (c *Cache) BoundReserved() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.boundLocked() + len(c.reserved)
}

// Reserve counts ref's group (by Ref) in BoundReserved until the cache
// holds a record of it that Bound counts, or Unreserve ends it: a group
// limit's count of a new group whose record is being written, once
// whether the writer's Apply or the watch brings the record first. A
// group reserved twice is counted once, until both end.
func (c *Cache) Reserve(ref string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[ref]; ok && countsBound(ref, e) {
		return
	}
	if c.reserved == nil {
		c.reserved = map[string]int{}
	}
	c.reserved[ref]++
}

// Unreserve ends a reservation of ref (its record was not written, or is
// in the cache already).
func (c *Cache) Unreserve(ref string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reserved[ref] <= 1 {
		delete(c.reserved, ref)
		return
	}
	c.reserved[ref]--
}

// countsBound reports whether Bound counts ref's record e.
func countsBound(ref string, e entry) bool {
	return e.phase == PhaseMoving || e.phase.Bound() && ref != ""
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
// revision of the group, and reports whether it changed the cache. It is
// for records the caller wrote itself (the handler applies its own
// compare-and-set writes at once); the watch delivers the same revision
// later and it is then ignored. Records learnt from other processes must
// come through the watch only.
func (c *Cache) Apply(b Binding) bool {
	if err := b.Validate(); err != nil {
		return false
	}
	ref := Ref(b.Group)
	c.mu.Lock()
	changed := c.applyLocked(ref, b, false)
	c.mu.Unlock()
	if changed {
		c.changed(ref)
	}
	return changed
}

// changed notifies a change of ref's record, once the initial records are
// in (the receiver looks at every record once the cache is ready).
func (c *Cache) changed(ref string) {
	if c.notify == nil || !c.warm.Load() {
		return
	}
	select {
	case c.notify <- ref:
	case <-c.done:
	}
}

// applyLocked records b, the record of ref's group.
func (c *Cache) applyLocked(ref string, b Binding, fromWatch bool) bool {
	if fromWatch {
		if b.Revision <= c.watchRev {
			return false
		}
		c.watchRev = b.Revision
	}
	old, had := c.m[ref]
	if had && old.rev >= b.Revision {
		return false
	}
	delete(c.bad, ref)
	if had {
		c.uncount(ref, old)
	}
	// The id is kept only where the record is unsettled; for a short id
	// the ref is the id.
	name := ref
	if IsRef(ref) {
		name = b.Group
	}
	e := entry{rev: b.Revision, epoch: b.OwnerEpoch(), prev: c.intern(b.PrevNode), node: c.intern(b.Node), phase: b.Phase()}
	switch {
	case e.phase.Ended():
		e.seq = b.ThroughSeq
	case e.phase == PhaseMoving:
		e.seq = b.FromSeq
		c.leaving[e.prev]++
		c.unsettled[ref] = name
	case e.phase.Bound():
		e.seq = b.FromSeq
		if e.phase == PhaseDraining {
			c.drains[ref] = append([]string(nil), b.Drain...)
		}
		if e.phase.TakingOver() {
			c.unsettled[ref] = name
			if f := (stepFields{routed: b.Routed, reason: b.Reason, ckpt: b.Ckpt}); f != (stepFields{}) {
				c.steps[ref] = f
			}
		}
		if b.Group != "" {
			c.counts[e.node]++
		}
	}
	c.m[ref] = e
	if len(c.reserved) > 0 && countsBound(ref, e) {
		delete(c.reserved, ref) // counted by Bound now
	}
	return true
}

// invalidLocked records that ref's latest value, at rev, is unusable.
func (c *Cache) invalidLocked(ref string, rev uint64) bool {
	if rev <= c.watchRev {
		return false
	}
	c.watchRev = rev
	old, had := c.m[ref]
	if had && old.rev >= rev {
		return false
	}
	if had && old.phase != PhaseNone {
		// Keep routing by the last valid record; the handler writes it
		// back over the bad value (Bad).
		c.bad[ref] = rev
		return false
	}
	if had {
		c.uncount(ref, old)
	}
	c.m[ref] = entry{rev: rev, phase: PhaseNone}
	return true
}

// Bad returns the groups whose latest value is unusable while the cache
// keeps their last valid record, with the bad value's revision: the
// handler restores the valid record over it. They are named by Ref: a
// long id's record, looked up by its ref, names its group only while it
// is unsettled (the handler cannot write back the others: nodes keep
// routing by the valid record until the group's next change).
func (c *Cache) Bad() map[string]uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if len(c.bad) == 0 {
		return nil
	}
	out := make(map[string]uint64, len(c.bad))
	for g, rev := range c.bad {
		out[g] = rev
	}
	return out
}

func (c *Cache) deleteLocked(ref string, rev uint64) bool {
	if rev <= c.watchRev {
		return false
	}
	c.watchRev = rev
	delete(c.bad, ref)
	old, had := c.m[ref]
	if !had || old.rev >= rev {
		return false
	}
	c.uncount(ref, old)
	delete(c.m, ref)
	return true
}

func (c *Cache) uncount(ref string, e entry) {
	switch {
	case e.phase.Bound() && ref != "":
		c.counts[e.node]--
	case e.phase == PhaseMoving:
		c.leaving[e.prev]--
	}
	if e.phase == PhaseDraining {
		delete(c.drains, ref)
	}
	if e.phase == PhaseMoving || e.phase.TakingOver() {
		delete(c.unsettled, ref)
		delete(c.steps, ref)
	}
}

// stepFields is what a record in a hand-over step carries that its entry
// does not: Routed, Reason (an evacuation's: proposals.Evacuated) and
// Ckpt.
type stepFields struct {
	routed uint64
	reason string
	ckpt   uint64
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
		switch {
		case e.phase.Bound():
			out[c.names[e.node]] = true
		case e.phase == PhaseMoving:
			out[c.names[e.prev]] = true
		}
	}
	return out
}

// Draining returns, for every node named in the Drain list of a record in
// StepDrain, how many groups are still to be moved off its queue.
func (c *Cache) Draining() map[string]int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := map[string]int{}
	for _, list := range c.drains {
		for _, n := range list {
			out[n]++
		}
	}
	return out
}

// CatchingUp returns, per node, how many records catch up a group taken
// from it (their previous node).
func (c *Cache) CatchingUp() map[string]int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := map[string]int{}
	for ref := range c.unsettled {
		if e := c.m[ref]; e.phase == PhaseCatchingUp && c.names[e.prev] != "" {
			out[c.names[e.prev]]++
		}
	}
	return out
}

// UnsettledLen returns how many groups have a record that is moving or in
// a hand-over step, without copying them (see Unsettled).
func (c *Cache) UnsettledLen() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.unsettled)
}

// Unsettled returns the groups whose record is moving or in a hand-over
// step, with their records.
func (c *Cache) Unsettled() map[string]Binding {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]Binding, len(c.unsettled))
	for ref, g := range c.unsettled {
		out[g] = c.routeLocked(ref, c.m[ref])
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
//
// When the bucket goes back below the revisions the cache has read (its
// servers lost acknowledged writes: see the servers' fsync policy in
// docs/operations.md), the cache logs it at error, counts it (Rewinds),
// tells OnRewind, and reads the whole bucket again: it keeps answering
// from what it had until the new reading is complete, then takes it as
// its whole state, notifying every group whose record changed.
func (c *Cache) Run(ctx context.Context, s *Store) error {
	defer close(c.done)
	return watchBucket(ctx, s.js, s.bucket, ">", watchHooks{
		start: c.watchStart,
		entry: c.watchEntry,
		ready: c.watchReady,
		rewound: func(seen, last uint64) {
			c.rewinds.Add(1)
			if seen > c.rewoundThrough.Load() {
				c.rewoundThrough.Store(seen) // only the watch's goroutine writes it
			}
			c.log.Error("the bindings bucket went back below what this node had read: its servers lost acknowledged writes; reading it again",
				"bucket", s.bucket, "read_through", seen, "bucket_last", last)
			c.replay = NewCache(CacheConfig{Logger: c.log})
			if c.onRewind != nil {
				c.onRewind(seen, last)
			}
		},
		rewindEvery: c.rewindCheck,
	})
}

// Rewinds counts the times the bucket was found below what the cache had
// read.
func (c *Cache) Rewinds() uint64 { return c.rewinds.Load() }

// RewoundThrough returns the highest revision the cache had read when it
// found the bucket below it (0: never). The bucket's next writes reuse
// revisions up to there unless a writer first moves the bucket past it
// (Store.Advance): a revision is a group's epoch, which consumers take as
// only ever growing.
func (c *Cache) RewoundThrough() uint64 { return c.rewoundThrough.Load() }

func (c *Cache) watchStart(records uint64) {
	if c.replay != nil {
		c.replay.presize(records)
		return
	}
	c.presize(records)
}

func (c *Cache) watchEntry(key string, op entryOp, value []byte, rev uint64) {
	c.entry(key, op, value, rev)
}

// entry takes one record of the watch and reports whether it changed the
// cache (after a rewind, the cache being read again changes, not this
// one).
func (c *Cache) entry(key string, op entryOp, value []byte, rev uint64) bool {
	if c.replay != nil {
		c.replay.applyEntry(key, op, value, rev)
		return false
	}
	ref, changed := c.applyEntry(key, op, value, rev)
	c.delivered.Store(rev)
	if changed {
		c.changed(ref)
	}
	return changed
}

// Feed hands the cache a bindings bucket's entries read by other means
// than Run's watch: a bucket kept in memory, as the router's simulation
// keeps one. Run's watch feeds the cache through the same steps. One
// goroutine at a time calls them, in the bucket's order: Start, the
// latest record of every key, Ready, then every change.
type Feed struct{ c *Cache }

// Feed returns the cache's feed. A cache is fed by Run or by its feed,
// not both.
func (c *Cache) Feed() Feed { return Feed{c} }

// Start says how many records the bucket holds when the watch starts.
func (f Feed) Start(records uint64) { f.c.watchStart(records) }

// Put takes the value stored under key at revision rev, and reports
// whether it changed the cache; when it did, the cache notifies the
// change (CacheConfig.Notify) before Put returns.
func (f Feed) Put(key string, value []byte, rev uint64) bool {
	return f.c.entry(key, opPut, value, rev)
}

// Delete takes the delete marker (or purge) of key at revision rev, as
// Put does.
func (f Feed) Delete(key string, rev uint64) bool {
	return f.c.entry(key, opDelete, nil, rev)
}

// Ready says the initial records are in: the cache is Ready.
func (f Feed) Ready() { f.c.watchReady() }

// Delivered returns the last sequence of the bucket's stream the watch
// delivered to the cache (0: none yet): every record stored up to it is in
// the cache, or was refused, or replaced by a later one. Compared with
// Store.LastRevision read after some moment, it tells whether the cache has
// caught up with every record stored before that moment.
func (c *Cache) Delivered() uint64 { return c.delivered.Load() }

func (c *Cache) watchReady() {
	if r := c.replay; r != nil {
		c.replay = nil
		c.adopt(r)
		return
	}
	c.once.Do(func() {
		c.warm.Store(true)
		close(c.ready)
	})
}

// adopt takes r's records as the cache's whole state and notifies every
// group whose record differs.
func (c *Cache) adopt(r *Cache) {
	c.mu.Lock()
	var changed []string
	for g, e := range c.m {
		if n, ok := r.m[g]; !ok || !sameEntry(c.names, e, r.names, n) {
			changed = append(changed, g)
		}
	}
	for g := range r.m {
		if _, ok := c.m[g]; !ok {
			changed = append(changed, g)
		}
	}
	c.m, c.drains, c.steps, c.bad, c.unsettled = r.m, r.drains, r.steps, r.bad, r.unsettled
	c.names, c.index, c.counts, c.leaving = r.names, r.index, r.counts, r.leaving
	c.legacy = r.legacy
	c.watchRev = r.watchRev
	for ref := range c.reserved {
		if e, ok := c.m[ref]; ok && countsBound(ref, e) {
			delete(c.reserved, ref)
		}
	}
	c.mu.Unlock()
	c.log.Info("bindings read again after the bucket went back", "records", len(r.m), "changed", len(changed))
	for _, g := range changed {
		c.changed(g)
	}
}

// sameEntry reports whether a, with node names an, and b, with names bn,
// are the same record.
func sameEntry(an []string, a entry, bn []string, b entry) bool {
	return a.rev == b.rev && a.epoch == b.epoch && a.seq == b.seq && a.phase == b.phase &&
		an[a.node] == bn[b.node] && an[a.prev] == bn[b.prev]
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

// applyEntry takes one record of the watch and returns its ref and
// whether it changed the cache; the caller notifies the change.
func (c *Cache) applyEntry(key string, op entryOp, value []byte, rev uint64) (string, bool) {
	group, err := groupOfKey(key)
	digest := errors.Is(err, ErrDigestKey)
	if err != nil && !digest {
		return "", false // not a key of ours
	}
	long := !digest && len(key) > MaxKeyLen // a legacy full key
	var ref string
	switch {
	case digest:
		// The key does not say whose it is: the record does, and the
		// cache needs only the key to find it again (a delete carries no
		// value).
		ref = refOfKey(key)
	case long:
		ref = Ref(group)
	default:
		ref = group
	}
	if op == opDelete {
		c.mu.Lock()
		changed := c.deleteLocked(ref, rev)
		if _, had := c.m[ref]; !had && long && c.legacy[ref] == key {
			delete(c.legacy, ref)
		}
		c.mu.Unlock()
		return ref, changed
	}
	// A revision the cache already holds (the handler wrote it and applied
	// it) needs no decoding. (Not while warming up: then every record is
	// new, and the check costs a lookup.)
	if c.warm.Load() {
		c.mu.Lock()
		if e, had := c.m[ref]; had && e.rev >= rev {
			c.watchRev = max(c.watchRev, rev)
			c.mu.Unlock()
			return ref, false
		}
		c.mu.Unlock()
	}
	b, ok := fastBinding(value)
	if !ok {
		var err error
		if b, err = UnmarshalBinding(value); err != nil {
			return ref, c.refuse(key, ref, !digest || c.holds(ref), rev, err.Error())
		}
	}
	switch {
	case digest && !KeyHolds(key, b.Group):
		// Another group's record (a SHA-256 collision, or forged): it
		// routes neither group. It marks the key's group when the cache
		// holds a record of it.
		return ref, c.refuse(key, ref, c.holds(ref), rev, "the value is the record of group "+quote(b.Group)+", whose key is another")
	case !digest && b.Group != group:
		return ref, c.refuse(key, ref, true, rev, "the value is the record of group "+quote(b.Group))
	}
	if b.Epoch > rev {
		// An epoch is the revision of an earlier record: one from the
		// future was not written by a handler.
		return ref, c.refuse(key, ref, true, rev, "epoch "+strconv.FormatUint(b.Epoch, 10)+" is past the record's revision")
	}
	b.Revision = rev
	c.mu.Lock()
	changed := c.applyLocked(ref, b, true)
	if _, had := c.m[ref]; had && long {
		c.legacy[ref] = key
	}
	c.mu.Unlock()
	return ref, changed
}

// holds reports whether the cache has an entry under ref.
func (c *Cache) holds(ref string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	_, ok := c.m[ref]
	return ok
}

// LegacyKey returns the full key ("r."/"b.", longer than MaxKeyLen) under
// which group's record stands, written before digest keys, and true; ""
// and false when its record (if any) stands under Key(group). Give it to
// Store.UseLegacyKeys.
func (c *Cache) LegacyKey(group string) (string, bool) {
	if !digested(group) {
		return "", false
	}
	ref := Ref(group)
	c.mu.RLock()
	defer c.mu.RUnlock()
	key, ok := c.legacy[ref]
	return key, ok
}

// refuse records that the value of key at rev is unusable, logs why, and
// reports whether that changed the cache. Unless mark is set, it marks no
// group.
func (c *Cache) refuse(key, ref string, mark bool, rev uint64, why string) bool {
	c.ignored.Add(1)
	c.log.Warn("ignoring an invalid binding record", "key", shortID(key), "revision", rev, "reason", why)
	if !mark {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.invalidLocked(ref, rev)
}

func quote(s string) string {
	const max = 64
	if len(s) > max {
		s = s[:max] + "..."
	}
	return "\"" + s + "\""
}

func groupOfKey(key string) (string, error) {
	if key == UngroupedKey {
		return "", nil
	}
	return GroupFromKey(key)
}

// RefsOf returns the refs (see Ref) of the groups whose record involves
// node: bound to it (whatever the step), or, for a move in progress,
// moved away from it. A ref is the group id but for long ids:
// Store.Names reads those ids.
func (c *Cache) RefsOf(node string) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	i, ok := c.index[node]
	if !ok {
		return nil
	}
	var out []string
	for ref, e := range c.m {
		if (e.phase.Bound() && e.node == i) || (e.phase == PhaseMoving && e.prev == i) {
			out = append(out, ref)
		}
	}
	return out
}

// Each calls fn for every cached record, with its group's ref (see Ref),
// until fn returns false. It holds the cache's read lock: fn must not
// call back into the cache.
func (c *Cache) Each(fn func(ref string, r Binding) bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for ref, e := range c.m {
		if !fn(ref, c.routeLocked(ref, e)) {
			return
		}
	}
}
