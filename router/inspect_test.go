package router

import (
	"fmt"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// heldLane returns a lane of n messages from ingress sequence first on.
func heldLane(group string, waiting bool, first uint64, n int) *lane {
	ln := &lane{group: group, waiting: waiting}
	for i := range n {
		ln.msgs = append(ln.msgs, &msgRec{seq: first + uint64(i)})
	}
	return ln
}

func TestHeldUndecided(t *testing.T) {
	r := &Router{eng: &engine{lanes: map[string]*lane{}}}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	if got, n := r.heldUndecided(t0); got != nil || n != 0 {
		t.Fatalf("no lanes: %v, %d", got, n)
	}
	r.eng.lanes["a"] = heldLane("a", true, 10, 2)
	r.eng.lanes["b"] = heldLane("b", true, 5, 3)
	r.eng.lanes["c"] = heldLane("c", true, 7, 2)
	r.eng.lanes["routing"] = heldLane("routing", false, 1, 9) // bound: queued behind its publish
	r.eng.lanes["empty"] = heldLane("empty", true, 0, 0)

	got, n := r.heldUndecided(t0)
	want := []kvbinding.HeldGroup{
		{Group: "b", Count: 3, OldestSeq: 5, Since: t0},
		{Group: "c", Count: 2, OldestSeq: 7, Since: t0},
		{Group: "a", Count: 2, OldestSeq: 10, Since: t0},
	}
	if n != 3 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v (%d), want %v (3)", got, n, want)
	}

	// A group held from the same message keeps its Since; one held from
	// another message (decided in between, then held again) starts anew.
	t1 := t0.Add(time.Second)
	r.eng.lanes["a"].msgs = append(r.eng.lanes["a"].msgs, &msgRec{seq: 20})
	r.eng.lanes["c"] = heldLane("c", true, 30, 1)
	delete(r.eng.lanes, "b")
	got, n = r.heldUndecided(t1)
	want = []kvbinding.HeldGroup{
		{Group: "a", Count: 3, OldestSeq: 10, Since: t0},
		{Group: "c", Count: 1, OldestSeq: 30, Since: t1},
	}
	if n != 2 || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v (%d), want %v (2)", got, n, want)
	}

	// The list is bounded; the count is not.
	for i := range kvbinding.MaxWaitingListed + 50 {
		g := fmt.Sprintf("g%03d", i)
		r.eng.lanes[g] = heldLane(g, true, uint64(100+i), 1)
	}
	got, n = r.heldUndecided(t1)
	if len(got) != kvbinding.MaxWaitingListed || n != kvbinding.MaxWaitingListed+52 {
		t.Fatalf("%d listed of %d, want %d of %d", len(got), n, kvbinding.MaxWaitingListed, kvbinding.MaxWaitingListed+52)
	}
	if got[0].Group != "a" || got[1].Group != "c" || got[2].Group != "g000" || got[len(got)-1].Group != "g097" {
		t.Errorf("order: first %v, last %v", got[:3], got[len(got)-1])
	}
}
