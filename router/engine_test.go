package router

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// Focused tests of lane-engine behaviour the deterministic simulation
// (TestSimulation) found wrong; each names the seed that first showed it.
// Those that need only the engine's inputs and actions are scripts under
// testdata/engine (TestEngineScripts); these look inside it.

// mapRecords is the engine's view of the records, from a map.
type mapRecords map[string]kvbinding.Binding

func (m mapRecords) Lookup(group string) (kvbinding.Binding, bool) {
	r, ok := m[group]
	return r, ok
}

var testNow = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func newTestEngine(node string, recs mapRecords) *engine {
	e := newEngine(engineConfig{node: node, maxHeldMessages: 1000, maxHeldBytes: 1 << 20, maxInFlight: 100, timeout: time.Second},
		recs, rand.New(rand.NewPCG(1, 2)))
	e.setLive(map[string]proposals.NodeState{"n1": {HasConsumer: true}, "n2": {HasConsumer: true}}, testNow)
	e.take()
	return e
}

func kinds(acts []action) map[actKind]int {
	out := map[actKind]int{}
	for _, a := range acts {
		out[a.kind]++
	}
	return out
}

// A long id's lane is found by its ref, which is how the cache tells of
// its record's changes (the cache keeps no long id): the record that
// binds it here publishes the held message, and a move away from this
// node, once the lane is gone, makes a fence ask naming the full id (the
// cache names a long id while its record is unsettled).
func TestEngineLongIDFollowsItsRef(t *testing.T) {
	now := testNow
	cache := kvbinding.NewCache(kvbinding.CacheConfig{})
	e := newEngine(engineConfig{node: "n1", maxHeldMessages: 1000, maxHeldBytes: 1 << 20, maxInFlight: 100, timeout: time.Second},
		cache, rand.New(rand.NewPCG(1, 2)))
	e.setLive(map[string]proposals.NodeState{"n1": {HasConsumer: true}, "n2": {HasConsumer: true}}, now)
	e.take()
	long := "g-" + strings.Repeat("x", 998)
	ref := kvbinding.Ref(long)
	if !kvbinding.IsRef(ref) {
		t.Fatalf("a 1000-byte id has no digest ref")
	}
	e.ingest(long, &msgRec{seq: 7}, now)
	e.take()
	if ln := e.laneOf(ref); ln == nil || ln.group != long {
		t.Fatalf("the lane is not found by its ref")
	}
	cache.Apply(kvbinding.Binding{Group: long, State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 3, DecidedBy: "h"})
	e.changed(ref, now)
	var pub *action
	for _, a := range e.take() {
		if a.kind == actPublish {
			pub = &a
		}
	}
	if pub == nil || pub.msg.seq != 7 || pub.group != long {
		t.Fatalf("the record did not publish the held message")
	}
	e.step(inOutcomes{batch: []outcome{pub.outcome()}}, now) // found by its group, not its ref
	e.take()
	if e.laneOf(ref) != nil || len(e.byRef) != 0 {
		t.Fatalf("the lane outlived its last message")
	}
	cache.Apply(kvbinding.Binding{Group: long, State: kvbinding.StateMoving, Node: "n2", PrevNode: "n1", FromSeq: 8, Epoch: 3,
		Revision: 4, DecidedBy: "h"})
	e.changed(ref, now)
	e.take()
	batch := e.askBatch(10, now)
	if len(batch) != 1 || batch[0].p.Op != proposals.OpFence || batch[0].p.Group != long {
		t.Fatalf("asks %+v, want a fence of the long id", batch)
	}
}

// A lane that waited for room in its group's share, whose group the fair
// account drops once the consumer acknowledged all of it, goes on with
// more messages than its new room: it stays among the waiting lanes for
// the round, with no account. Announcing its wait then must not need the
// account (CI's nemesis seed 103: a node died of a nil pointer here).
func TestEngineFairWaitOutlivesItsGroupsAccount(t *testing.T) {
	now := testNow
	recs := mapRecords{"g": {State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 5, Epoch: 5}}
	e := newTestEngine("n1", recs)
	e.cfg.holds = true
	e.fair = newFairShare(2)
	for seq := uint64(1); seq <= 6; seq++ {
		e.ingest("g", &msgRec{seq: seq}, now)
	}
	var qseq uint64
	for range 10 {
		published := false
		for _, a := range e.take() {
			if a.kind == actPublish && !a.held {
				qseq++
				published = true
				o := a.outcome()
				o.seq = qseq
				e.step(inOutcomes{batch: []outcome{o}}, now)
			}
		}
		if !published {
			break
		}
	}
	if qseq != 2 || len(e.fairWait) != 1 {
		t.Fatalf("stored %d, %d lanes waiting; want 2 stored (the share) and the lane waiting", qseq, len(e.fairWait))
	}
	later := now.Add(2 * fairTellAfter)
	e.fairRead(qseq, 100, later) // both acknowledged: the account goes
	held := 0
	for _, a := range e.take() {
		if a.kind == actHold && a.on {
			held++
		}
	}
	if held != 1 {
		t.Errorf("%d hold announcements, want 1 (it waited past fairTellAfter)", held)
	}
}

// Among lanes waiting for room, one that holds far more than its part of
// the node's held messages goes to the held subject when memory runs low;
// lanes busy alike wait in memory (the node stops reading instead).
func TestEngineHogsMemory(t *testing.T) {
	e := newTestEngine("n1", mapRecords{})
	lanes := make([]*lane, 10)
	fill := func(sizes ...int) {
		clear(e.fairWait)
		e.mem.heldMsgs = 0
		for i, n := range sizes {
			lanes[i] = &lane{group: "g" + strconv.Itoa(i), msgs: make([]*msgRec, n)}
			e.fairWait[lanes[i]] = struct{}{}
			e.mem.heldMsgs += n
		}
	}
	fill(5, 5, 5, 5, 5, 5, 5, 5, 5, 5)
	for i, ln := range lanes {
		if e.hogsMemory(ln) {
			t.Errorf("busy alike: lane %d of 10 with 5 of 50 held counted as hogging", i)
		}
	}
	fill(40, 1, 1, 1, 1, 1, 1, 1, 1, 1)
	if !e.hogsMemory(lanes[0]) {
		t.Error("a lane with 40 of 49 held messages not counted as hogging")
	}
	if e.hogsMemory(lanes[1]) {
		t.Error("a lane with 1 of 49 held messages counted as hogging")
	}
}

// A spilled message the shell read again from the ingress comes back with
// its publish's outcome (outcome.payload): the shell never writes the
// engine's message record (the action carries a copy of it). A failed
// publish is retried with that body, not read again.
func TestEngineKeepsAFetchedBodyForTheRetry(t *testing.T) {
	recs := mapRecords{}
	e := newTestEngine("n1", recs)
	m := &msgRec{seq: 5, subject: "s"} // spilled: no payload
	e.step(inMsg{group: "g", m: m}, testNow)
	e.take()
	recs["g"] = kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 2}
	e.step(inChanged{refs: []string{"g"}}, testNow)
	var pub *action
	for _, a := range e.take() {
		if a.kind == actPublish {
			pub = &a
		}
	}
	if pub == nil || pub.msg.seq != m.seq || pub.msg.payload != nil {
		t.Fatalf("no publish of the body-less message: %+v", pub)
	}
	body := &held{}
	pub.msg.payload = body // as fetchSpilled does, on the shell's copy
	o := pub.outcome()
	o.err = errors.New("no PubAck")
	e.step(inOutcomes{batch: []outcome{o}}, testNow)
	if m.payload != body {
		t.Fatalf("the engine did not keep the body the shell read: %v", m.payload)
	}
	e.take()
	e.step(inTick{}, testNow.Add(time.Minute))
	retried := false
	for _, a := range e.take() {
		retried = retried || a.kind == actPublish && a.msg.seq == m.seq && a.msg.payload == body
	}
	if !retried {
		t.Fatalf("the failed publish was not retried with the body read")
	}
}

// The ungrouped lane's flights: taken out by sequence in any order, the
// front first, reusing their array.
func TestFlights(t *testing.T) {
	var f flights
	for seq := uint64(1); seq <= 5; seq++ {
		f.add(&msgRec{seq: seq})
	}
	for _, seq := range []uint64{1, 3, 2} {
		if m := f.take(seq); m == nil || m.seq != seq {
			t.Fatalf("take(%d) = %v", seq, m)
		}
	}
	if m := f.take(3); m != nil {
		t.Fatalf("take(3) again = %v, want nil", m)
	}
	if f.head != 2 || len(f.ms) != 4 || f.ms[2].seq != 4 {
		t.Fatalf("head %d, %d kept; want 2 and 4, 4 next (1 and 2 taken from the front, 3 from the middle)", f.head, len(f.ms))
	}
	for len(f.ms) < cap(f.ms) {
		f.add(&msgRec{seq: 6})
	}
	array := &f.ms[:1][0]
	f.add(&msgRec{seq: 7}) // full but for the front: moved down, not grown
	if &f.ms[0] != array || f.head != 0 || f.ms[0].seq != 4 {
		t.Fatalf("a full list with room at its front grew or lost its order: head %d, first %v", f.head, f.ms[0])
	}
	for f.head < len(f.ms) {
		if f.take(f.ms[f.head].seq) == nil {
			t.Fatalf("the front's message not found")
		}
	}
	if f.head != 0 || len(f.ms) != 0 {
		t.Fatalf("emptied: head %d, %d kept; want 0 and 0", f.head, len(f.ms))
	}
}

// An outcome names its publish by the lane's group and the message's
// ingress sequence: the ungrouped lane's, which leave the lane when they
// are published, are found in whatever order their outcomes come; a lane
// dead-lettering its messages has them all in flight. An outcome of no
// publish in flight changes nothing but a counter.
func TestEngineOutcomesFindTheirMessages(t *testing.T) {
	recs := mapRecords{"": {State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 2, Epoch: 2}}
	e := newTestEngine("n1", recs)
	for seq := uint64(1); seq <= 4; seq++ {
		e.step(inMsg{group: "", m: &msgRec{seq: seq, size: 10}}, testNow)
	}
	pubs := map[uint64]action{}
	for _, a := range e.take() {
		if a.kind == actPublish {
			pubs[a.msg.seq] = a
		}
	}
	if len(pubs) != 4 || e.inflight != 4 || len(e.lanes[""].msgs) != 0 {
		t.Fatalf("%d publishes, %d in flight, %d held in the lane; want 4, 4 and 0", len(pubs), e.inflight, len(e.lanes[""].msgs))
	}
	stray := func(o outcome) {
		t.Helper()
		before := e.stats.strayOutcomes
		e.step(inOutcomes{batch: []outcome{o}}, testNow)
		if e.stats.strayOutcomes != before+1 || len(e.take()) != 0 {
			t.Fatalf("outcome %+v: not counted as stray, or it did something", o)
		}
	}
	stray(outcome{group: "", ingress: 9})
	stray(outcome{group: "other", ingress: 1})
	stray(outcome{group: "", ingress: 1, batch: 2})
	for _, seq := range []uint64{3, 1, 4, 2} {
		a := pubs[seq]
		e.step(inOutcomes{batch: []outcome{a.outcome()}}, testNow)
		if seq == 1 {
			stray(a.outcome()) // its publish is done
		}
	}
	if e.inflight != 0 || e.mem.heldMsgs != 0 || e.lanes[""] != nil || len(e.ungrouped.ms) != 0 {
		t.Fatalf("after the outcomes: %d in flight, %d held, lane %v, %d flights; want all gone", e.inflight, e.mem.heldMsgs, e.lanes[""], len(e.ungrouped.ms))
	}

	e.step(inMsg{group: "g", m: &msgRec{seq: 5}}, testNow)
	e.step(inMsg{group: "g", m: &msgRec{seq: 6}}, testNow)
	e.step(inMsg{group: "g", m: &msgRec{seq: 7}}, testNow)
	e.take()
	ln := e.lanes["g"]
	e.startDeadLetter(ln, "no routing decision", testNow)
	dlq := map[uint64]action{}
	for _, a := range e.take() {
		if a.kind == actPublish && a.dlq && a.group == "g" {
			dlq[a.msg.seq] = a
		}
	}
	for _, seq := range []uint64{6, 7, 5} {
		a := dlq[seq]
		e.step(inOutcomes{batch: []outcome{a.outcome()}}, testNow)
	}
	if e.stats.deadLettered != 3 || ln.dlqPending != 0 || ln.deadLettering || e.stats.strayOutcomes != 4 {
		t.Fatalf("dead-lettered %d, pending %d, stray %d; want 3, 0 and the 4 strays before", e.stats.deadLettered, ln.dlqPending, e.stats.strayOutcomes)
	}
}

// The ungrouped lane publishes its messages all at once, so a binding it
// needs again (its record ended) can fail past MaxAttempts while earlier
// messages of it are still in flight as ordinary publishes. Their outcomes
// are not the dead-letter copies': the dead-letter record is asked for
// only once every held message is on the dead-letter stream, and each
// message in flight is released (memory, the resolved position) when its
// publish is done.
func TestUngroupedDeadLetterWaitsForItsOwnCopies(t *testing.T) {
	for _, node := range []string{"n1", "n2"} {
		recs := mapRecords{"": {State: kvbinding.StateBound, Node: node, FromSeq: 1, Revision: 2, Epoch: 2}}
		e := newTestEngine(node, recs)
		if !e.isProposer("") {
			continue
		}
		e.cfg.maxAttempts = 1
		for seq := uint64(1); seq <= 2; seq++ {
			e.step(inMsg{group: "", m: &msgRec{seq: seq, size: 10}}, testNow)
		}
		pubs := map[uint64]action{}
		for _, a := range e.take() {
			if a.kind == actPublish {
				pubs[a.msg.seq] = a
			}
		}
		if len(pubs) != 2 {
			t.Fatalf("%d publishes of the ungrouped messages, want 2", len(pubs))
		}
		// The ungrouped binding ends through 2: message 3 needs a new one,
		// and its one attempt fails.
		recs[""] = kvbinding.Binding{State: kvbinding.StateReleased, PrevNode: node, ThroughSeq: 2, Revision: 3, Epoch: 2}
		e.step(inChanged{refs: []string{""}}, testNow)
		e.step(inMsg{group: "", m: &msgRec{seq: 3, size: 10}}, testNow)
		e.take()
		asks := e.askBatch(10, testNow)
		if len(asks) != 1 {
			t.Fatalf("%d asks, want the ungrouped binding's", len(asks))
		}
		e.step(inReplied{batch: asks, err: proposals.ErrNoHandler}, testNow)
		var dlq action
		for _, a := range e.take() {
			if a.kind == actPublish && a.dlq {
				dlq = a
			}
		}
		if dlq.msg.seq != 3 {
			t.Fatalf("message 3 not dead-lettered after its failed attempt (got %+v)", dlq)
		}
		for _, seq := range []uint64{1, 2} {
			a := pubs[seq]
			o := a.outcome()
			o.seq = seq
			e.step(inOutcomes{batch: []outcome{o}}, testNow)
			for _, a := range e.take() {
				if a.kind == actDeadLettered {
					t.Fatalf("node %s: the dead-letter record asked for when ordinary message %d was stored, before message 3's dead-letter copy", node, seq)
				}
			}
		}
		if e.stats.deadLettered != 0 {
			t.Fatalf("node %s: %d counted dead-lettered, want 0 (only ordinary publishes are done)", node, e.stats.deadLettered)
		}
		e.step(inOutcomes{batch: []outcome{dlq.outcome()}}, testNow)
		told := false
		for _, a := range e.take() {
			told = told || a.kind == actDeadLettered
		}
		if !told || e.stats.deadLettered != 1 {
			t.Fatalf("node %s: after the dead-letter copy: record asked %v, %d dead-lettered; want true, 1", node, told, e.stats.deadLettered)
		}
		// Message 3 is held until the record is written (every node drops
		// it then); the ordinary ones are done.
		if e.mem.heldMsgs != 1 || e.inflight != 0 {
			t.Fatalf("node %s: %d held, %d in flight; want message 3 held, nothing in flight", node, e.mem.heldMsgs, e.inflight)
		}
		recs[""] = kvbinding.Binding{State: kvbinding.StateDeadLettered, ThroughSeq: 3, Revision: 4, Epoch: 2}
		e.step(inChanged{refs: []string{""}}, testNow)
		e.take()
		if e.mem.heldMsgs != 0 || e.position() != 4 {
			t.Fatalf("node %s: after the dead-letter record, %d held, position %d; want 0, 4", node, e.mem.heldMsgs, e.position())
		}
		return
	}
	t.Fatal("neither n1 nor n2 proposes the ungrouped binding")
}

// A closing message ends its group's binding once it is stored (the
// release ask follows its PubAck), so it never goes to the held subject:
// a batch aimed there stops before it, and a closing message at its
// group's share waits in memory for room however long that takes, where
// other messages go to the held subject after fairMemoryWait. Before, the
// simulation's seed 74 (fair share of 3) stored a closing message on the
// held subject in a batch; the binding ended behind it, the group was
// bound again, and its next messages were consumed before the held ones.
func TestEngineClosingMessageNeverHeld(t *testing.T) {
	bound := kvbinding.Binding{State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 2, Epoch: 2}
	// heldClose: an action sends the closing message (its seq) to the
	// held subject.
	heldClose := func(acts []action, close uint64) bool {
		for _, a := range acts {
			switch {
			case a.kind == actPublish && a.held && a.msg.seq == close:
				return true
			case a.kind == actBatch && a.held && slices.ContainsFunc(a.batch, func(m pubMsg) bool { return m.seq == close }):
				return true
			}
		}
		return false
	}
	t.Run("a held batch stops before it", func(t *testing.T) {
		recs := mapRecords{}
		e := newBatchEngine(recs, 8, 4)
		e.cfg.holds, e.fair = true, newFairShare(1)
		e.fair.heldStored("g", "g", 1, testNow) // messages of g wait on the held subject already
		for _, m := range []*msgRec{{seq: 2}, {seq: 3, close: true}, {seq: 4}} {
			e.ingest("g", m, testNow)
		}
		e.take()
		recs["g"] = bound
		e.changed("g", testNow)
		acts := e.take()
		if got := publishes(acts); !slices.EqualFunc(got, [][]uint64{{2}}, slices.Equal) || heldClose(acts, 3) {
			t.Fatalf("publishes %v (a closing message held: %v), want [[2]] on the held subject", got, heldClose(acts, 3))
		}
	})
	t.Run("at its share it waits in memory", func(t *testing.T) {
		recs := mapRecords{"g": bound}
		e := newBatchEngine(recs, 1, 4)
		e.cfg.holds, e.fair = true, newFairShare(1)
		e.ingest("g", &msgRec{seq: 1}, testNow)
		var pub *action
		for _, a := range e.take() {
			if a.kind == actPublish {
				pub = &a
			}
		}
		if pub == nil || pub.held {
			t.Fatalf("the first message did not go onto the queue: %+v", pub)
		}
		o := pub.outcome()
		o.seq = 1
		e.step(inOutcomes{batch: []outcome{o}}, testNow) // stored, not acknowledged: the share is full
		e.take()
		e.ingest("g", &msgRec{seq: 2, close: true}, testNow)
		if acts := e.take(); len(publishes(acts)) != 0 {
			t.Fatalf("published %v past the share", publishes(acts))
		}
		later := testNow.Add(2 * fairMemoryWait)
		e.fairRead(0, 100, later)
		if acts := e.take(); len(publishes(acts)) != 0 {
			t.Fatalf("after %v: published %v (a closing message held: %v), want it still waiting in memory", 2*fairMemoryWait, publishes(acts), heldClose(acts, 2))
		}
		e.fairRead(1, 100, later) // the first is acknowledged: room
		acts := e.take()
		if got := publishes(acts); !slices.EqualFunc(got, [][]uint64{{2}}, slices.Equal) || heldClose(acts, 2) {
			t.Fatalf("with room: published %v (held %v), want [[2]] onto the queue", got, heldClose(acts, 2))
		}
	})
}

// An unbind (a move to no node) drains nothing, so a node holding
// messages of the group on its held subject does not forget them, and
// fences only once its fair shell has released them onto its queue: the
// binding that follows (this node's again, with no drain) would route its
// catch-up ahead of them (simulation seed 74, a node restarted with two
// held messages during an unbind). A move to another node fences at once
// and forgets them: its drain takes the held subject along.
func TestEngineUnbindWaitsForHeldMessages(t *testing.T) {
	fences := func(e *engine) int {
		n := 0
		for _, a := range e.askBatch(10, testNow) {
			if a.p.Op == proposals.OpFence {
				n++
			}
		}
		return n
	}
	for _, target := range []string{"", "n2"} {
		recs := mapRecords{"g": {State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 2, Epoch: 2}}
		e := newTestEngine("n1", recs)
		e.cfg.holds, e.fair = true, newFairShare(2)
		e.step(inHeldFound{counts: map[string]int{"g": 2}, groups: map[string]string{"g": "g"}}, testNow)
		recs["g"] = kvbinding.Binding{State: kvbinding.StateMoving, Node: target, PrevNode: "n1", FromSeq: 1, Revision: 3, Epoch: 2}
		e.changed("g", testNow)
		e.take()
		if target != "" {
			if n := fences(e); n != 1 || e.fair.holding("g") {
				t.Errorf("a move to %s: %d fences, held messages still counted %v; want a fence at once, nothing counted", target, n, e.fair.holding("g"))
			}
			continue
		}
		if n := fences(e); n != 0 || !e.fair.holding("g") {
			t.Fatalf("an unbind: %d fences, held messages counted %v; want no fence while they are held", n, e.fair.holding("g"))
		}
		rel, _ := e.fairRead(0, 100, testNow)
		if len(rel) != 1 || rel[0].ref != "g" {
			t.Fatalf("releases %+v, want g's", rel)
		}
		e.step(inReleased{ref: "g", queueSeqs: []uint64{7, 8}}, testNow)
		e.take()
		if n := fences(e); n != 1 {
			t.Fatalf("after the release: %d fences, want 1", n)
		}
	}
}

// A release of held messages says whether its last look at the held
// subject found more (left); a message of the group stored there after
// that look, its PubAck taken while the release ran, is still counted, and
// the group's next message goes behind it. Before, the count was zeroed,
// the group's hold ended, and its next messages went onto the queue ahead
// of the held one (simulation seeds 9354, 7754, 13004 and 15534; 9364
// left it on the held subject for good).
func TestEngineHeldDuringARelease(t *testing.T) {
	recs := mapRecords{"g": {State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 2, Epoch: 2}}
	e := newTestEngine("n1", recs)
	e.cfg.holds, e.fair = true, newFairShare(1)
	e.step(inHeldFound{counts: map[string]int{"g": 1}, groups: map[string]string{"g": "g"}}, testNow)
	rel, _ := e.fairRead(0, 100, testNow)
	if len(rel) != 1 {
		t.Fatalf("releases %+v, want g's", rel)
	}
	// publish stores seq's message and hands its outcome in; it reports
	// whether it went to the held subject.
	publish := func(seq uint64) bool {
		e.ingest("g", &msgRec{seq: seq}, testNow)
		for _, a := range e.take() {
			if a.kind == actPublish && a.msg.seq == seq {
				o := a.outcome()
				o.seq = 100 + seq
				e.step(inOutcomes{batch: []outcome{o}}, testNow)
				e.take()
				return a.held
			}
		}
		t.Fatalf("seq %d not published", seq)
		return false
	}
	if !publish(5) {
		t.Fatalf("seq 5 went onto the queue while the group holds a message")
	}
	e.step(inReleased{ref: "g", queueSeqs: []uint64{7}, left: false}, testNow) // its look came before seq 5
	e.take()
	if !e.fair.holding("g") {
		t.Fatalf("the group's hold ended with seq 5 on the held subject")
	}
	if !publish(6) {
		t.Fatalf("seq 6 went onto the queue ahead of seq 5, held")
	}
}
