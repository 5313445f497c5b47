package router

import (
	"container/heap"
	"slices"
	"strings"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// A busy group must not hold the others back (docs/consuming.md, "A busy
// group"). A node's queue is read in order by one consumer whose window
// (MaxAckPending) holds what it was delivered and has not acknowledged:
// a group with a backlog of thousands, routed at once, fills that window,
// and every other group's messages wait behind it however idle the
// consumer's other lanes are. So each group may have at most its share of
// the window on the node's queue unacknowledged; what comes past that
// waits on the node's held subject (HeldSubject, in the queue stream, read
// by no consumer), in order, and the fair shell moves it onto the queue as
// the consumer acknowledges the group's earlier messages.
//
// The share is half the window divided among the groups that have at
// least fairMinShare messages unacknowledged (one such group: 500 of the
// default 1,000), never below fairMinShare: the other half stays free for
// the groups that have little or nothing waiting. Config.GroupShare fixes
// it instead, or turns this off.
//
// The engine keeps, per group routed here, the queue sequences of the
// messages it stored on the queue and does not know acknowledged yet
// (pruned by the queue consumer's ack floor, and by lookups of the oldest
// when the floor stays behind), and how many of its messages are on the
// held subject. A group with messages held sends every later one there
// too, so that the group keeps its order; each message keeps the target
// its first publish chose (msgRec.hold), so that a retry, deduplicated by
// its Nats-Msg-Id, never lands a copy on the other side.

// fairMinShare is the least share of the window a group gets.
const fairMinShare = 16

// defaultWindow is the queue consumer's window until its info is read
// (the MaxAckPending ensureQueueConsumer creates it with).
const defaultWindow = 1000

// fairShare is the engine's per-group account of the queue window.
type fairShare struct {
	limit  int // Config.GroupShare: 0 automatic, > 0 fixed, < 0 off
	window int // the queue consumer's MaxAckPending, as last read
	floor  uint64
	groups map[string]*fairGroup // by ref
	oldest fairHeap              // groups with unacknowledged messages, by the oldest
	heavy  int                   // groups with at least fairMinShare unacknowledged
	// held: messages on the held subject, all groups; heldGroups: the
	// groups with any.
	held, heldGroups int
	// releasing: the groups whose release the shell is carrying out.
	releasing map[string]bool
}

// fairGroup is one group's account.
type fairGroup struct {
	ref, group string
	// seqs: queue sequences of the group's messages this node stored on
	// its queue and does not know acknowledged, in the order stored.
	seqs []uint64
	held int // its messages on the held subject
	// heldSince: of held, those stored since its release in progress was
	// asked for, which that release's last look may not have seen.
	heldSince int
	idx       int // in fairShare.oldest; -1 when not there
	// since: when it was first held back, this time (zero: it is not);
	// total: how many of its messages went to the held subject since.
	since time.Time
	total int
}

func newFairShare(limit int) fairShare {
	return fairShare{limit: limit, window: defaultWindow, groups: map[string]*fairGroup{}, releasing: map[string]bool{}}
}

// holding reports whether the group has messages held, or being released.
func (f *fairShare) holding(ref string) bool {
	g := f.groups[ref]
	return f.releasing[ref] || (g != nil && g.held > 0)
}

// on reports whether groups are held back at all.
func (f *fairShare) on() bool { return f.limit >= 0 }

// share returns how many unacknowledged messages a group may have on the
// node's queue.
func (f *fairShare) share() int {
	if f.limit > 0 {
		return f.limit
	}
	return max(fairMinShare, f.window/(2*max(f.heavy, 1)))
}

func (f *fairShare) get(ref, group string) *fairGroup {
	g := f.groups[ref]
	if g == nil {
		g = &fairGroup{ref: ref, group: group, idx: -1}
		f.groups[ref] = g
	}
	return g
}

// toHold reports whether the next publish of the group goes to the held
// subject: it has messages there already (they go first), or as many
// unacknowledged on the queue as its share.
func (f *fairShare) toHold(ref string) bool {
	if !f.on() {
		return false
	}
	g := f.groups[ref]
	return g != nil && (g.held > 0 || len(g.seqs) >= f.share())
}

// room returns how many more messages of the group may go onto the queue
// now (for a batch's size).
func (f *fairShare) room(ref string) int {
	if !f.on() {
		return 1 << 30
	}
	g := f.groups[ref]
	if g == nil {
		return f.share()
	}
	return max(f.share()-len(g.seqs), 0)
}

// stored records n messages of the group stored on the queue, the last at
// queue sequence last (a batch's are taken as consecutive).
func (f *fairShare) stored(ref, group string, last uint64, n int) {
	if !f.on() || last == 0 || n <= 0 {
		return
	}
	g := f.get(ref, group)
	before := len(g.seqs)
	for i := n - 1; i >= 0; i-- {
		if uint64(i) < last {
			g.seqs = append(g.seqs, last-uint64(i))
		}
	}
	f.counted(g, before)
}

// counted fixes the heap and the heavy count after g.seqs changed from
// before entries.
func (f *fairShare) counted(g *fairGroup, before int) {
	after := len(g.seqs)
	switch {
	case before < fairMinShare && after >= fairMinShare:
		f.heavy++
	case before >= fairMinShare && after < fairMinShare:
		f.heavy--
	}
	switch {
	case after == 0 && g.idx >= 0:
		heap.Remove(&f.oldest, g.idx)
	case after > 0 && g.idx < 0:
		heap.Push(&f.oldest, g)
	case after > 0:
		heap.Fix(&f.oldest, g.idx)
	}
	f.maybeDrop(g)
}

// maybeDrop forgets a group with nothing to account for.
func (f *fairShare) maybeDrop(g *fairGroup) {
	if len(g.seqs) == 0 && g.held == 0 && g.since.IsZero() && !f.releasing[g.ref] {
		delete(f.groups, g.ref)
	}
}

// consumed takes the queue consumer's ack floor and window: every message
// at or below the floor was acknowledged.
func (f *fairShare) consumed(floor uint64, window int) {
	if window > 0 {
		f.window = window
	}
	f.floor = max(f.floor, floor)
	for f.oldest.Len() > 0 && f.oldest[0].seqs[0] <= f.floor {
		g := f.oldest[0]
		f.prune(g, f.floor)
	}
}

// prune drops g's sequences at or below seq.
func (f *fairShare) prune(g *fairGroup, seq uint64) {
	before := len(g.seqs)
	i := 0
	for i < len(g.seqs) && g.seqs[i] <= seq {
		i++
	}
	if i == 0 {
		return
	}
	g.seqs = append(g.seqs[:0], g.seqs[i:]...)
	f.counted(g, before)
}

// gone takes a lookup that found the group's queue message at seq gone
// (acknowledged, or moved): its messages are consumed in order, so every
// one of it stored before is too.
func (f *fairShare) gone(ref string, seq uint64) {
	if g := f.groups[ref]; g != nil {
		f.prune(g, seq)
	}
}

// heldStored records n of the group's messages stored on the held
// subject; it reports whether the group was not held back before.
func (f *fairShare) heldStored(ref, group string, n int, now time.Time) (started bool) {
	g := f.get(ref, group)
	if g.held == 0 {
		f.heldGroups++
	}
	if f.releasing[ref] {
		g.heldSince += n
	}
	g.held += n
	f.held += n
	g.total += n
	if g.since.IsZero() {
		g.since = now
		return true
	}
	return false
}

// releaseTask asks the fair shell to move up to n of a group's held
// messages onto the queue.
type releaseTask struct {
	ref, group string
	n          int
}

// checkTask asks the fair shell whether the group's newest, then its
// oldest, message still on the queue as far as the engine knows is still
// there.
type checkTask struct {
	ref            string
	newest, oldest uint64
}

// due returns what the fair shell is to do now: releases for the groups
// with messages held and room on the queue (not already being released),
// and lookups of the groups with fairMinShare or more messages above the
// ack floor, at most maxChecks.
func (f *fairShare) due(maxChecks int) (rel []releaseTask, checks []checkTask) {
	if !f.on() {
		return nil, nil
	}
	share := f.share()
	for ref, g := range f.groups {
		if g.held > 0 && !f.releasing[ref] {
			if n := min(share-len(g.seqs), g.held); n > 0 {
				rel = append(rel, releaseTask{ref: ref, group: g.group, n: n})
				f.releasing[ref] = true
				g.heldSince = 0
				continue
			}
		}
		// The ack floor waits for the slowest message of any group: a
		// group with many messages above it is looked up, lest one busy
		// group's backlog make the others look busy too.
		if len(g.seqs) >= min(fairMinShare, share) && len(checks) < maxChecks && g.seqs[0] > f.floor {
			checks = append(checks, checkTask{ref: ref, newest: g.seqs[len(g.seqs)-1], oldest: g.seqs[0]})
		}
	}
	// In the groups' order, not the map's (the simulation replays a seed
	// exactly).
	slices.SortFunc(rel, func(a, b releaseTask) int { return strings.Compare(a.ref, b.ref) })
	slices.SortFunc(checks, func(a, b checkTask) int { return strings.Compare(a.ref, b.ref) })
	return rel, checks
}

// released takes the outcome of a release: moved of the group's held
// messages are on the queue now, at queueSeqs; left says whether the
// held subject still holds any of it (the shell read it). It reports
// whether the group stopped being held back, and for how long it was,
// with how many messages.
func (f *fairShare) released(ref string, queueSeqs []uint64, left bool, now time.Time) (ended bool, took time.Duration, total int) {
	delete(f.releasing, ref)
	g := f.groups[ref]
	if g == nil {
		return false, 0, 0
	}
	before := len(g.seqs)
	g.seqs = append(g.seqs, queueSeqs...)
	f.counted(g, before)
	moved := min(len(queueSeqs), g.held)
	g.held -= moved
	f.held -= moved
	if keep := min(g.held, g.heldSince); !left && g.held > keep {
		// The count ran ahead of the stream (a duplicate's PubAck taken for
		// a held copy): the stream says what is there, as of the release's
		// last look. A message stored on the held subject since the release
		// was asked for may have come after that look: it stays counted
		// (one counted and not there costs a release that finds nothing;
		// one there and not counted would let the group's next messages
		// pass it).
		f.held -= g.held - keep
		g.held = keep
	}
	g.heldSince = 0
	if g.held > 0 {
		return false, 0, 0
	}
	f.heldGroups--
	ended, took, total = !g.since.IsZero(), now.Sub(g.since), g.total
	g.since, g.total = time.Time{}, 0
	f.maybeDrop(g)
	return ended, took, total
}

// forget drops a group this node no longer routes (its record names
// another node): what it has held moves with the group (the hand-over
// drains the held subject as it drains the queue).
func (f *fairShare) forget(ref string) {
	g := f.groups[ref]
	if g == nil || f.releasing[ref] {
		return
	}
	if g.held > 0 {
		f.held -= g.held
		f.heldGroups--
	}
	g.held, g.since, g.total = 0, time.Time{}, 0
	before := len(g.seqs)
	g.seqs = g.seqs[:0]
	f.counted(g, before)
}

// restore takes, at start, the messages found on the node's held subject
// per group (ref -> count).
func (f *fairShare) restore(found map[string]int, groupOf func(ref string) string, now time.Time) {
	for ref, n := range found {
		if n > 0 {
			f.heldStored(ref, groupOf(ref), n, now)
		}
	}
}

// fairHeap orders groups by their oldest unacknowledged queue sequence.
type fairHeap []*fairGroup

func (h fairHeap) Len() int           { return len(h) }
func (h fairHeap) Less(i, j int) bool { return h[i].seqs[0] < h[j].seqs[0] }
func (h fairHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *fairHeap) Push(x any) { g := x.(*fairGroup); g.idx = len(*h); *h = append(*h, g) }
func (h *fairHeap) Pop() any {
	old := *h
	g := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	g.idx = -1
	return g
}

// heldFits reports whether an ingress subject fits under the held subject
// prefix with a group's key (up to kvbinding.MaxKeyLen): one that does not
// goes onto the queue, unheld.
func heldFits(subject string) bool {
	return len(HeldSubjectPrefix)+kvbinding.MaxNodeIDLen+1+kvbinding.MaxKeyLen+1+len(subject) <= maxControlLine-controlLineMargin
}

// aim decides where m, the head of ln's group about to be published,
// goes: onto the held subject (true) or the queue. A message keeps where
// its first publish went.
func (e *engine) aim(ln *lane, m *msgRec) bool {
	if m.target == 0 {
		m.target = targetQueue
		if e.cfg.holds && ln.group != "" && e.fair.toHold(ln.ref) && heldFits(m.subject) {
			m.target = targetHeld
		}
	}
	return m.target == targetHeld
}

// fairStored accounts n of ln's messages stored, on the held subject or
// on the queue (the last at queue sequence qseq).
func (e *engine) fairStored(ln *lane, held bool, qseq uint64, n int, now time.Time) {
	if !held {
		e.fair.stored(ln.ref, ln.group, qseq, n)
		return
	}
	if e.fair.heldStored(ln.ref, ln.group, n, now) && !ln.fairTold {
		e.stats.heldBack++
		e.emit(action{kind: actHold, group: ln.group, on: true, count: len(e.fair.groups[ln.ref].seqs)})
	}
	ln.fairTold = false // its hold is the held subject's now
}

// groupShareNow returns the share a group gets now (0: none applies).
func (e *engine) groupShareNow() int {
	if !e.cfg.holds || !e.fair.on() {
		return 0
	}
	return e.fair.share()
}

// heldBack lists the groups held back now, the most messages held first
// (at most kvbinding.MaxWaitingListed), and how many there are.
func (e *engine) heldBack() ([]kvbinding.HeldGroup, int) {
	if e.fair.heldGroups == 0 && len(e.fairWait) == 0 {
		return nil, 0
	}
	top := newTopK(kvbinding.MaxWaitingListed, func(a, b kvbinding.HeldGroup) bool {
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return a.Group < b.Group
	})
	for _, g := range e.fair.groups {
		if g.held > 0 {
			top.offer(kvbinding.HeldGroup{Group: g.group, Count: g.held, Since: g.since.UTC()})
		}
	}
	for ln := range e.fairWait {
		if g := e.fair.groups[ln.ref]; g == nil || g.held == 0 {
			top.offer(kvbinding.HeldGroup{Group: ln.group, Count: len(ln.msgs), Since: ln.fairSince.UTC()})
		}
	}
	return top.sorted(), top.seen
}

// A group at its share first waits in memory: the queue consumer usually
// acknowledges within milliseconds (a throughput run's consumer lags by a
// batch or two), and the next round of the fair shell lets it on. Only a
// group that waits longer than fairMemoryWait, or whose backlog would
// take the memory the other groups need, moves its next messages to the
// held subject, which costs a copy and a delete each: a batch import of
// 100,000 messages of one group, a handler stuck on it. The bound keeps a
// node's checkpoint from lagging behind a waiting group for longer than
// that (a restart re-routes from its checkpoint, within the queue's 2
// minute duplicate window).
const fairMemoryWait = 15 * time.Second

// fairTellAfter: a group waiting this long is announced (event hold).
const fairTellAfter = time.Second

// fairWaits reports whether ln, whose head m is this node's to publish,
// waits in memory for room in its group's share of the queue window.
func (e *engine) fairWaits(ln *lane, m *msgRec, now time.Time) bool {
	if !e.cfg.holds || !e.fair.on() || m.target != 0 || e.fair.holding(ln.ref) {
		e.endWait(ln, now)
		return false
	}
	if room := e.fair.room(ln.ref); room > 0 {
		ln.fairHead = time.Time{}
		if len(ln.msgs) <= room {
			e.endWait(ln, now) // all it has fits: the episode is over
		} else {
			ln.fairTick = e.fairTick // it will wait again
		}
		return false
	}
	if ln.fairSince.IsZero() {
		ln.fairSince = now
		e.fairWait[ln] = struct{}{}
		// The fair shell reads the ack floor every fairIdle while no group
		// is at its share: a group that fills its share within that (a
		// hot group routed at full speed) must not wait for the round.
		e.emit(action{kind: actFairWake})
	}
	if ln.fairHead.IsZero() {
		ln.fairHead = now
	}
	ln.fairTick = e.fairTick
	if now.Sub(ln.fairHead) < fairMemoryWait && len(ln.msgs) < e.cfg.maxHeldMessages/4 &&
		(e.mem.heldBytes < e.cfg.maxHeldBytes/2 || !e.hogsMemory(ln)) {
		return true
	}
	if m.close {
		// A closing message never goes to the held subject: its group's
		// binding ends once it is stored (askRelease), so it must be on the
		// queue behind every earlier message of the group, not held with
		// them. It waits here for room, however long that takes; what
		// comes after it waits for the release anyway.
		return true
	}
	// Too long or too big: its messages go to the held subject (aim), and
	// the hold is its (fairStored, released).
	delete(e.fairWait, ln)
	ln.fairSince, ln.fairHead = time.Time{}, time.Time{}
	return false
}

// hogsMemory reports whether ln holds more than twice its part of the
// messages the node holds, among the lanes waiting for room. When every
// group is busy alike (a saturated node: each one at its share, the node's
// memory full), none does: the lanes wait in memory and the node stops
// reading the ingress until the consumer catches up, since moving every
// group's excess through the held subject costs a copy and a delete per
// message for no group's benefit (peerbench's 1,000 groups on three
// servers: 55,090 of 100,000 messages had not arrived when it gave up).
// One group whose backlog fills the memory does, and goes to the held
// subject, so that the others' messages keep flowing. Not covered: three
// or more hot groups whose backlogs (tens of thousands of messages each)
// fill the memory alike: none hogs, the node stops reading, and quiet
// groups wait until the hot lanes' heads have waited fairMemoryWait.
// Counting only the lanes that wait for room does not tell them from a
// saturated node: there, too, only a few lanes wait at any moment (most
// have a publish in flight), so "few waiting lanes go" brought back the
// collapse (45,565 of 100,000 not arrived).
func (e *engine) hogsMemory(ln *lane) bool {
	return len(ln.msgs)*max(len(e.fairWait), 1) > 2*e.mem.heldMsgs
}

// endWait ends ln's wait in memory, announcing its end if its start was.
func (e *engine) endWait(ln *lane, now time.Time) {
	if ln.fairSince.IsZero() {
		return
	}
	delete(e.fairWait, ln)
	if ln.fairTold && !e.fair.holding(ln.ref) {
		e.emit(action{kind: actHold, group: ln.group, took: now.Sub(ln.fairSince), count: 0})
	}
	ln.fairSince, ln.fairHead, ln.fairTold = time.Time{}, time.Time{}, false
}

// fairRead takes the queue consumer's ack floor and window, moves on the
// lanes waiting for room (announcing those that wait long), and returns
// what the fair shell is to do now (fairShare.due).
func (e *engine) fairRead(floor uint64, window int, now time.Time) ([]releaseTask, []checkTask) {
	e.fair.consumed(floor, window)
	e.fairTick++
	// In the groups' order, not the map's: a pump emits publishes, and the
	// simulation replays a seed exactly.
	waiting := make([]*lane, 0, len(e.fairWait))
	for ln := range e.fairWait {
		waiting = append(waiting, ln)
	}
	slices.SortFunc(waiting, func(a, b *lane) int { return strings.Compare(a.group, b.group) })
	for _, ln := range waiting {
		if _, still := e.fairWait[ln]; !still {
			continue
		}
		if e.lanes[ln.group] == ln && len(ln.msgs) > 0 {
			e.pump(ln, now)
		}
		if ln.fairTick != e.fairTick && !ln.fairSince.IsZero() {
			e.endWait(ln, now) // no longer waiting for room (moved, fenced, dropped)
			continue
		}
		if _, still := e.fairWait[ln]; still && !ln.fairTold && now.Sub(ln.fairSince) >= fairTellAfter {
			ln.fairTold = true
			e.stats.heldBack++
			unacked := 0
			if g := e.fair.groups[ln.ref]; g != nil {
				// Dropped once nothing of it is accounted for (maybeDrop),
				// while its lane may still be waiting for this round.
				unacked = len(g.seqs)
			}
			e.emit(action{kind: actHold, group: ln.group, on: true, count: unacked})
		}
	}
	return e.fair.due(maxFairChecks)
}

// waiting returns the lanes waiting in memory for room and their messages.
func (e *engine) fairWaiting() (groups, msgs int) {
	for ln := range e.fairWait {
		groups++
		msgs += len(ln.msgs)
	}
	return groups, msgs
}

// maxFairChecks bounds the lookups of one round of the fair shell.
const maxFairChecks = 32

// fairReleased takes a release's outcome (fairShare.released) and moves
// on the lane that waited for it (a fence, a closing message).
func (e *engine) fairReleased(ref string, queueSeqs []uint64, left bool, now time.Time) {
	if ended, took, total := e.fair.released(ref, queueSeqs, left, now); ended {
		group := ref
		if ln := e.laneOf(ref); ln != nil {
			group = ln.group
		} else if g := e.fair.groups[ref]; g != nil {
			group = g.group
		}
		e.emit(action{kind: actHold, group: group, took: took, count: total})
	}
	if ln := e.laneOf(ref); ln != nil {
		e.pump(ln, now)
	}
}
