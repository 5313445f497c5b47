package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// TestIsGoneOnTheLibrarysErrors checks isGone against the errors the
// JetStream client really returns: a drain tells "the old consumer acked it
// meanwhile" from a failure by them, and Stream.DeleteMsg does not wrap the
// server's API error.
func TestIsGoneOnTheLibrarysErrors(t *testing.T) {
	s := natstest.RunServer(t)
	js, err := jetstream.New(s.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, "t.a", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, ack.Sequence); err != nil {
		t.Fatal(err)
	}
	err = st.DeleteMsg(ctx, ack.Sequence)
	if err == nil || !isGone(err) {
		t.Errorf("second delete: isGone(%v) = false", err)
	}
	if _, err = st.GetMsg(ctx, ack.Sequence); err == nil || !isGone(err) {
		t.Errorf("get of a deleted message: isGone(%v) = false", err)
	}
	if err := js.DeleteStream(ctx, "T"); err != nil {
		t.Fatal(err)
	}
	if err = st.DeleteMsg(ctx, ack.Sequence); err == nil || isGone(err) {
		t.Errorf("delete in a deleted stream: isGone(%v) = true, want a real failure", err)
	}
}

// testRouter returns a router for node with its streams on a fresh server,
// ready for the hand-over shell's steps (no Run: no goroutines).
func testRouter(t *testing.T, node string) (*Router, jetstream.JetStream) {
	t.Helper()
	s := natstest.RunServer(t)
	js, err := jetstream.New(s.Connect())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Name: "h", Type: Local, Address: "jms", Timeout: time.Second, Node: node}.withDefaults()
	if err := ensureStreams(context.Background(), js, cfg, 1); err != nil {
		t.Fatal(err)
	}
	r := &Router{js: js, cfg: cfg, log: slog.New(slog.DiscardHandler), duties: newDutyQueue(),
		cache: kvbinding.NewCache(kvbinding.CacheConfig{})}
	r.warnLapsed = logagg.New(r.log, "lapsed", logagg.DefaultEvery)
	r.warnLate = logagg.New(r.log, "late", logagg.DefaultEvery)
	t.Cleanup(func() { r.warnLapsed.Close(); r.warnLate.Close() })
	r.eng = newEngine(engineConfig{node: node, maxHeldMessages: 100, maxHeldBytes: 1 << 20, maxInFlight: 100, timeout: time.Second},
		r.cache, rand.New(rand.NewPCG(1, 2)))
	return r, js
}

// record puts b in the router's cache and returns its route.
func record(t *testing.T, r *Router, b kvbinding.Binding) kvbinding.Binding {
	t.Helper()
	if !r.cache.Apply(b) {
		t.Fatalf("record %+v not applied", b)
	}
	route, _ := r.cache.Lookup(b.Group)
	return route
}

// queuedSeqs returns the ingress sequences on node's queue, in stream order.
func queuedSeqs(t *testing.T, js jetstream.JetStream, node string) []uint64 {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(QueueSubjectPrefix+node+".>"))
		if isGone(err) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		is, _ := strconv.ParseUint(m.Header.Get(HeaderIngressSeq), 10, 64)
		out = append(out, is)
		seq = m.Sequence + 1
	}
}

func publishQueued(t *testing.T, js jetstream.JetStream, node, group string, seq uint64) {
	t.Helper()
	m := nats.NewMsg(QueueSubject(node, "jms.x"))
	m.Header.Set(DefaultGroupHeader, group)
	m.Header.Set(HeaderIngressSeq, strconv.FormatUint(seq, 10))
	m.Header.Set(jetstream.MsgIDHeader, IngressStream+":"+strconv.FormatUint(seq, 10))
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// A takeover of the ungrouped routing binding catches up the messages
// that cannot be grouped onto the dead-letter stream, as the lane would
// have: skipped, they were lost with the node that owned the binding.
// (The simulation's seeds 134 and 165.)
func TestCatchUpDeadLettersWhatCannotBeGrouped(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	for i, hdr := range []nats.Header{
		{},                               // 1: ungrouped
		{DefaultGroupHeader: {"a", "b"}}, // 2: two different group ids
		{},                               // 3: ungrouped
		{DefaultGroupHeader: {"g"}},      // 4: another group's
		{},                               // 5: past the span
	} {
		m := &nats.Msg{Subject: "jms.x", Header: hdr, Data: []byte{byte('0' + i)}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	r.eng.resume = resumePoint{ckpt: kvbinding.Checkpoint{Next: 5}} // read past them
	route := record(t, r, kvbinding.Binding{Group: "", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, PrevNode: "n0",
		Step: kvbinding.StepCatchUp, Revision: 7})
	if _, err := r.catchUp(ctx, map[string]kvbinding.Binding{"": route}); err != nil {
		t.Fatal(err)
	}
	if got := queuedSeqs(t, js, "n1"); len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Errorf("queue holds %v, want [1 3]", got)
	}
	dlq, err := js.Stream(ctx, DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatalf("nothing dead-lettered: %v", err)
	}
	if m.Header.Get(HeaderIngressSeq) != "2" || m.Header.Get(HeaderDeadReason) == "" {
		t.Errorf("dead-lettered %v, want ingress seq 2 with a reason", m.Header)
	}
}

// A catch-up whose publish the queue stream takes for a duplicate of a
// copy on the old owner's queue moves that copy here before it routes the
// group's next message: the old owner's publish was held by a partitioned
// link and landed after the drain looked (CI: a group's message 30
// processed from the old queue after 31..193 from the new one). A
// duplicate of this node's own earlier attempt stays where it is.
func TestCatchUpMovesACopyThatLandedLateOnTheOldQueue(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	for range 4 {
		m := &nats.Msg{Subject: "jms.x", Header: nats.Header{DefaultGroupHeader: {"g"}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	publishQueued(t, js, "n1", "g", 1) // this node's own earlier attempt
	publishQueued(t, js, "n9", "g", 2) // the old owner's, landed late
	r.eng.resume = resumePoint{ckpt: kvbinding.Checkpoint{Next: 5}}
	route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, PrevNode: "n9",
		Step: kvbinding.StepCatchUp, Revision: 7, Epoch: 7})
	if _, err := r.catchUp(ctx, map[string]kvbinding.Binding{"g": route}); err != nil {
		t.Fatal(err)
	}
	if got := queuedSeqs(t, js, "n1"); fmt.Sprint(got) != "[1 2 3 4]" {
		t.Fatalf("n1's queue holds %v, want [1 2 3 4]", got)
	}
	if got := queuedSeqs(t, js, "n9"); len(got) != 0 {
		t.Errorf("n9's queue still holds %v", got)
	}
}

// A group coming back to a node whose own queue still holds some of it is
// drained from that queue too, so that the earlier messages from the other
// queue come first; a retried drain leaves its own copies in place. (The
// simulation's seeds 39554 and 78333.)
func TestDrainMergesTheTakersOwnQueue(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	publishQueued(t, js, "n1", "g", 8)
	publishQueued(t, js, "n1", "g", 9)
	publishQueued(t, js, "n9", "g", 7)
	publishQueued(t, js, "n1", "g", 10)
	route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 11, PrevNode: "n1",
		Step: kvbinding.StepDrain, Drain: []string{"n1", "n9"}, Revision: 5})
	for attempt := 1; attempt <= 2; attempt++ {
		if _, err := r.drainQueues(ctx, map[string]kvbinding.Binding{"g": route}); err != nil {
			t.Fatal(err)
		}
		if got := queuedSeqs(t, js, "n1"); fmt.Sprint(got) != "[7 8 9 10]" {
			t.Fatalf("attempt %d: n1's queue holds %v, want [7 8 9 10]", attempt, got)
		}
		if got := queuedSeqs(t, js, "n9"); len(got) != 0 {
			t.Fatalf("attempt %d: n9's queue still holds %v", attempt, got)
		}
	}
}

// A drain stops once the record moved past the revision it works for.
// (The simulation's seed 112894.)
func TestDrainStopsWhenTheRecordMovesOn(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	publishQueued(t, js, "n9", "g", 7)
	route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 8, PrevNode: "n9",
		Step: kvbinding.StepDrain, Drain: []string{"n9"}, Revision: 5})
	record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n2", FromSeq: 8, PrevNode: "n9",
		Step: kvbinding.StepDrain, Drain: []string{"n9", "n1"}, Revision: 6})
	if _, err := r.drainQueues(ctx, map[string]kvbinding.Binding{"g": route}); !errors.Is(err, errSuperseded) {
		t.Fatalf("drain of a superseded revision: err %v, want errSuperseded", err)
	}
	if got := queuedSeqs(t, js, "n9"); fmt.Sprint(got) != "[7]" {
		t.Errorf("n9's queue holds %v, want [7] (left to the record's new node)", got)
	}
}

// A step report the handler could not take yet is sent again; one the
// record moved past is not. (The simulation's seeds 120, 130, 177: failed;
// 284, 1693: refused from an older revision.)
func TestSortReports(t *testing.T) {
	sent := []proposals.Proposal{
		{Op: proposals.OpDrained, Group: "accepted", Rev: 5},
		{Op: proposals.OpDrained, Group: "failed", Rev: 5},
		{Op: proposals.OpCaughtUp, Group: "lagging", Rev: 6},
		{Op: proposals.OpCaughtUp, Group: "moved-on", Rev: 6},
		{Op: proposals.OpCaughtUp, Group: "failed-moved-on", Rev: 6},
		{Op: proposals.OpDrained, Group: "no-record-here", Rev: 5},
	}
	ds := []proposals.Decision{
		{Group: "accepted", Outcome: proposals.Accepted, Revision: 6},
		{Group: "failed", Outcome: proposals.Failed, Error: "write failed"},
		{Group: "lagging", Outcome: proposals.Refused, Revision: 2},
		{Group: "moved-on", Outcome: proposals.Refused, Revision: 9},
		{Group: "failed-moved-on", Outcome: proposals.Failed},
		{Group: "no-record-here", Outcome: proposals.Refused, Revision: 0},
	}
	seen := map[string]uint64{"accepted": 5, "failed": 5, "lagging": 6, "moved-on": 9, "failed-moved-on": 8, "no-record-here": 0}
	again, notTaken := sortReports(sent, ds, func(g string) uint64 { return seen[g] })
	var gotAgain []string
	for _, p := range again {
		gotAgain = append(gotAgain, p.Group)
	}
	wantAgain := []string{"failed", "lagging"}
	wantNot := []string{"moved-on", "failed-moved-on", "no-record-here"}
	if len(gotAgain) != len(wantAgain) || gotAgain[0] != wantAgain[0] || gotAgain[1] != wantAgain[1] {
		t.Errorf("sent again %v, want %v", gotAgain, wantAgain)
	}
	if len(notTaken) != len(wantNot) {
		t.Fatalf("not taken %v, want %v", notTaken, wantNot)
	}
	for i := range wantNot {
		if notTaken[i] != wantNot[i] {
			t.Errorf("not taken %v, want %v", notTaken, wantNot)
		}
	}
}
