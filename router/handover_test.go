package router

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"grouprouter/internal/natstest"
	"grouprouter/proposals"
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
