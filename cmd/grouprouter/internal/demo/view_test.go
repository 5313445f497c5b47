package demo

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/proposals"
)

// A failed run says so, with examples, and OK is false.
func TestSummaryWrite(t *testing.T) {
	ok := Summary{Duration: 8 * time.Second, Took: 8 * time.Second, Groups: 20, Published: 792, Processed: 792,
		Moves: map[string]int{"node n2 gone for 2s": 6, "rebalance": 11}, Handoffs: 17,
		Killed: true, KilledGroups: 6, FlowAgain: []time.Duration{2 * time.Second, 2100 * time.Millisecond}, MovedBack: 6,
		Joined: true, JoinedAfter: 2 * time.Second, JoinedGot: 5,
		GroupsPerNode: map[string]int{"n0": 5, "n1": 5, "n2": 5, "n3": 5}}
	bad := ok
	bad.Processed, bad.Duplicates, bad.Missing = 793, 2, 1
	bad.Examples = []string{"g003: #12 again (on n0's queue)"}
	for _, tt := range []struct {
		s    Summary
		ok   bool
		want []string
	}{
		{ok, true, []string{
			"published    792 messages over 20 groups",
			"processed    792 by the consumers: every message exactly once, in order within its group",
			"moves        17 (6 node n2 gone for 2s, 11 rebalance); 17 hand-overs done",
			"n2 killed    halfway, with 6 groups: they flowed again 2.1s after the kill (median; the last 2.1s; node grace 2s from its last heartbeat)",
			"n2 back      6 groups moved back to it by rebalancing",
			"n3 joined    2.0s in: rebalancing moved 5 groups to it, idle ones first",
			"at the end   groups per node: n0 5, n1 5, n2 5, n3 5",
			"result       OK",
		}},
		{bad, false, []string{
			"processed    793 by the consumers: 2 duplicates, 1 missing, 0 out of order, 0 never published",
			"g003: #12 again (on n0's queue)",
			"result       FAILED",
		}},
	} {
		var buf bytes.Buffer
		if err := tt.s.Write(&buf); err != nil {
			t.Fatal(err)
		}
		if tt.s.OK() != tt.ok {
			t.Errorf("OK() = %v, want %v", tt.s.OK(), tt.ok)
		}
		for _, w := range tt.want {
			if !strings.Contains(buf.String(), w) {
				t.Errorf("summary lacks %q:\n%s", w, buf.String())
			}
		}
	}
}

// The plain view sums moves up by nodes and reason.
func TestAggregate(t *testing.T) {
	var events []proposals.Event
	for i := 0; i < 3; i++ {
		events = append(events, proposals.Event{Kind: proposals.EventMove, Group: "g", PrevNode: "n2", Node: "n0", Reason: "node n2 gone for 2s"})
	}
	events = append(events,
		proposals.Event{Kind: proposals.EventMove, Group: "h", PrevNode: "n2", Node: "n1", Reason: "node n2 gone for 2s"},
		proposals.Event{Kind: proposals.EventHandoff, Group: "h", PrevNode: "n2", Node: "n1", Count: 4},
		proposals.Event{Kind: proposals.EventProgress, Node: "n0", Step: "catchup", Count: 100, Total: 300, Groups: 33})
	got := strings.Join(aggregate(17500*time.Millisecond, events), "\n")
	want := strings.Join([]string{
		" 17.5s  3 groups moving n2 -> n0 (node n2 gone for 2s)",
		" 17.5s  1 group moving n2 -> n1 (node n2 gone for 2s)",
		" 17.5s  1 group taken over n2 -> n1",
		" 17.5s  progress: n0 catchup of 33 groups: 100 of 300 messages routed from the ingress",
	}, "\n")
	if got != want {
		t.Errorf("aggregate:\n%s\nwant\n%s", got, want)
	}
}

func TestWrap(t *testing.T) {
	got := wrap("now: n2 is gone: its 66 groups move to n0 and n1, which drain its queue and catch up from its checkpoint", 40, "     ")
	for _, l := range got {
		if len([]rune(l)) > 40 {
			t.Errorf("line %q longer than 40", l)
		}
	}
	if len(got) != 3 || !strings.HasPrefix(got[1], "     ") {
		t.Errorf("wrap: %q", got)
	}
}
