package router

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// Focused tests of lane-engine behaviour the deterministic simulation
// (TestSimulation) found wrong; each names the seed that first showed it.

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

// A bind rejected by a handler whose view lagged the node's (the node has
// already seen the group released) must not leave the answered ask on the
// lane: the lane asks again. Seed 171.
func TestEngineAsksAgainAfterARejectedBindItOutran(t *testing.T) {
	now := testNow
	recs := mapRecords{"g": {State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 5}}
	e := newTestEngine("n1", recs)
	// The group is released (rev 6) while message 22 waits for a binding.
	recs["g"] = kvbinding.Binding{State: kvbinding.StateReleased, PrevNode: "n1", ThroughSeq: 21, Revision: 6}
	e.ingest("g", &msgRec{seq: 22}, now)
	e.take()
	batch := e.askBatch(10, now)
	if len(batch) != 1 || batch[0].p.Seq != 22 {
		t.Fatalf("asks: %+v, want one bind for seq 22", batch)
	}
	// The handler still saw rev 5 (bound): rejected, naming rev 5, which the
	// node has outrun.
	e.replied(batch, []proposals.Decision{{Group: "g", Outcome: proposals.Rejected, Revision: 5}}, nil, now)
	e.take()
	if got := e.askBatch(10, now.Add(2*time.Second)); len(got) != 1 || got[0].p.Seq != 22 {
		t.Fatalf("after the rejection the lane asks %+v, want a new bind for seq 22", got)
	}
}

// The same, when the reply names a revision the node sees only later.
func TestEngineAsksAgainWhenTheNamedRevisionEndsTheBinding(t *testing.T) {
	now := testNow
	recs := mapRecords{}
	e := newTestEngine("n1", recs)
	e.ingest("g", &msgRec{seq: 3}, now)
	e.take()
	batch := e.askBatch(10, now)
	if len(batch) != 1 {
		t.Fatalf("asks: %+v", batch)
	}
	e.replied(batch, []proposals.Decision{{Group: "g", Outcome: proposals.Rejected, Revision: 4}}, nil, now)
	// Revision 4 arrives, and is already a released record that ends
	// before message 3.
	recs["g"] = kvbinding.Binding{State: kvbinding.StateReleased, PrevNode: "n2", ThroughSeq: 2, Revision: 4}
	e.changed("g", now)
	e.take()
	if got := e.askBatch(10, now.Add(2*time.Second)); len(got) != 1 || got[0].p.Seq != 3 {
		t.Fatalf("after revision 4 the lane asks %+v, want a new bind for seq 3", got)
	}
}

// A record naming this node for a takeover step is handed to the shell
// even when the lane it finds holds only the previous owner's messages
// (which pump skips, emptying the lane). Seed 4050.
func TestEngineHandsTheDutyWhenTheLaneEmpties(t *testing.T) {
	now := testNow
	recs := mapRecords{"g": {State: kvbinding.StateMoving, Node: "n1", PrevNode: "n2", FromSeq: 1, Revision: 3}}
	e := newTestEngine("n1", recs)
	e.ingest("g", &msgRec{seq: 33}, now) // held: a move to this node is in progress
	e.take()
	recs["g"] = kvbinding.Binding{State: kvbinding.StateBound, Node: "n1", PrevNode: "n2", FromSeq: 34,
		Step: kvbinding.StepDrain, Drain: []string{"n2"}, Revision: 4}
	e.changed("g", now)
	acts := e.take()
	if kinds(acts)[actDuty] != 1 {
		t.Fatalf("actions %+v, want the drain duty handed", acts)
	}
	if e.lanes["g"] != nil {
		t.Errorf("the lane of the previous owner's message is still there")
	}
}

// After a restart, a catch-up covers the messages below the checkpoint's
// Next: ingest skips those the checkpoint marks done, and some may be the
// group's, skipped while another node owned it. Seed 16649.
func TestEngineTakeoverFromCoversTheResumeCheckpoint(t *testing.T) {
	now := testNow
	e := newTestEngine("n1", mapRecords{})
	e.resume = resumePoint{ckpt: kvbinding.Checkpoint{Next: 38, Pending: [][2]uint64{{32, 33}}}}
	for seq := uint64(32); seq <= 36; seq++ {
		e.ingest("other", &msgRec{seq: seq}, now)
	}
	if p := e.position(); p != 37 {
		t.Fatalf("position %d, want 37", p)
	}
	if got := e.takeoverFrom("g"); got != 38 {
		t.Errorf("takeoverFrom = %d, want 38 (the checkpoint's Next)", got)
	}
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
	if pub == nil || pub.m.seq != 7 {
		t.Fatalf("the record did not publish the held message")
	}
	e.acked(pub.ln, pub.m, false, "", nil, 0, now)
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
				e.acked(a.ln, a.m, false, "", nil, qseq, now)
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
