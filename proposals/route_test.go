package proposals

import (
	"fmt"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

func TestOwner(t *testing.T) {
	moving := kvbinding.Binding{State: kvbinding.StateMoving, Node: "n2", PrevNode: "n1"}
	drain := kvbinding.Binding{State: kvbinding.StateBound, Node: "n2", FromSeq: 10, PrevNode: "n1", Step: kvbinding.StepDrain, Drain: []string{"n1"}}
	catchup := kvbinding.Binding{State: kvbinding.StateBound, Node: "n2", FromSeq: 10, PrevNode: "n1", Step: kvbinding.StepCatchUp}
	released := kvbinding.Binding{State: kvbinding.StateReleased, ThroughSeq: 7, PrevNode: "n1"}
	tests := []struct {
		name  string
		r     kvbinding.Binding
		seq   uint64
		me    string
		owner string
		act   RouteAction
	}{
		{"bound after fence", kvbinding.Binding{State: kvbinding.StateBound, Node: "n1", FromSeq: 10}, 10, "n0", "n1", RouteTo},
		{"before fence with prev", kvbinding.Binding{State: kvbinding.StateBound, Node: "n1", FromSeq: 10, PrevNode: "n0"}, 9, "n0", "n0", RouteTo},
		{"before fence no history", kvbinding.Binding{State: kvbinding.StateBound, Node: "n1", FromSeq: 10}, 3, "n0", "n1", RouteTo},
		{"dead-lettered", kvbinding.Binding{State: kvbinding.StateDeadLettered, ThroughSeq: 5}, 5, "n0", "", RouteTo},
		{"after dead-letter", kvbinding.Binding{State: kvbinding.StateDeadLettered, ThroughSeq: 5}, 6, "n0", "", RoutePropose},
		{"moving: old owner waits", moving, 50, "n1", "", RouteWait},
		{"moving: new owner waits", moving, 50, "n2", "", RouteWait},
		{"moving: others skip", moving, 50, "n3", "n1", RouteTo},
		{"drain: new owner waits", drain, 10, "n2", "", RouteWait},
		{"catch-up: new owner waits", catchup, 10, "n2", "", RouteWait},
		{"drain: others skip", drain, 10, "n3", "n2", RouteTo},
		{"drain: before fence is prev's", drain, 9, "n2", "n1", RouteTo},
		{"released: before fence is prev's", released, 7, "n3", "n1", RouteTo},
		{"released: after fence proposes", released, 8, "n1", "", RoutePropose},
		{"invalid record proposes", kvbinding.Binding{Invalid: true, Revision: 4}, 8, "n1", "", RoutePropose},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			owner, act := Owner(tt.r, tt.seq, tt.me)
			if owner != tt.owner || act != tt.act {
				t.Errorf("Owner(%d, %s) = %q, %v; want %q, %v", tt.seq, tt.me, owner, act, tt.owner, tt.act)
			}
		})
	}
}

func TestDutyOf(t *testing.T) {
	tests := []struct {
		r    kvbinding.Binding
		me   string
		want Duty
	}{
		{kvbinding.Binding{State: kvbinding.StateMoving, Node: "n2", PrevNode: "n1"}, "n1", DutyFence},
		{kvbinding.Binding{State: kvbinding.StateMoving, PrevNode: "n1"}, "n1", DutyFence},
		{kvbinding.Binding{State: kvbinding.StateMoving, Node: "n2", PrevNode: "n1"}, "n2", DutyNone},
		{kvbinding.Binding{State: kvbinding.StateBound, Node: "n2", Step: kvbinding.StepDrain, Drain: []string{"n1"}}, "n2", DutyDrain},
		{kvbinding.Binding{State: kvbinding.StateBound, Node: "n2", Step: kvbinding.StepDrain, Drain: []string{"n1"}}, "n1", DutyNone},
		{kvbinding.Binding{State: kvbinding.StateBound, Node: "n2", Step: kvbinding.StepCatchUp}, "n2", DutyCatchUp},
		{kvbinding.Binding{State: kvbinding.StateBound, Node: "n2"}, "n2", DutyNone},
		{kvbinding.Binding{Invalid: true}, "n2", DutyNone},
	}
	for _, tt := range tests {
		if got := DutyOf(tt.r, tt.me); got != tt.want {
			t.Errorf("DutyOf(%+v, %s) = %v, want %v", tt.r, tt.me, got, tt.want)
		}
	}
}

func TestMoveDone(t *testing.T) {
	settled := &kvbinding.Binding{State: kvbinding.StateBound, Node: "n2"}
	taking := &kvbinding.Binding{State: kvbinding.StateBound, Node: "n2", Step: kvbinding.StepCatchUp}
	moving := &kvbinding.Binding{State: kvbinding.StateMoving, Node: "n2", PrevNode: "n1"}
	released := &kvbinding.Binding{State: kvbinding.StateReleased, PrevNode: "n1"}
	for _, tt := range []struct {
		r      *kvbinding.Binding
		target string
		want   bool
	}{
		{settled, "n2", true}, {taking, "n2", false}, {moving, "n2", false}, {nil, "n2", false}, {settled, "n3", false},
		{released, "", true}, {nil, "", true}, {moving, "", false}, {settled, "", true},
	} {
		if got := MoveDone(tt.r, tt.target); got != tt.want {
			t.Errorf("MoveDone(%+v, %q) = %v, want %v", tt.r, tt.target, got, tt.want)
		}
	}
}

func TestEligibleAndChoose(t *testing.T) {
	live := map[string]NodeState{"c": {HasConsumer: true, Groups: 1}, "a": {}, "b": {HasConsumer: true, Groups: 1}}
	if got := Eligible(live, false); len(got) != 2 || got[0] != "b" || got[1] != "c" {
		t.Errorf("Eligible(grouped) = %v, want [b c]", got)
	}
	if got := Eligible(live, true); len(got) != 3 || got[0] != "a" {
		t.Errorf("Eligible(ungrouped) = %v, want [a b c]", got)
	}
	if n, r := Choose(live, "c", false); n != "c" || r {
		t.Errorf("Choose(c) = %s, %v", n, r)
	}
	if n, r := Choose(live, "a", false); n != "b" || !r {
		t.Errorf("Choose(a) = %s, %v; want b redirected (tie broken by id)", n, r)
	}
	counts := map[string]NodeState{"x": {HasConsumer: true}, "y": {HasConsumer: true}}
	first, second := PickTarget(counts, "g1", ""), PickTarget(counts, "g2", "")
	if first == second {
		t.Errorf("PickTarget put two groups on %s: it must count its picks", first)
	}
	if got := PickTarget(counts, "g3", "y"); got != "y" {
		t.Errorf("PickTarget kept %s, want the move's target y", got)
	}
}

// TestProposerSpreads: the rendezvous hash gives every node a share of
// groups, also for ids that share a long prefix.
func TestProposerSpreads(t *testing.T) {
	nodes := []string{"n0", "n1", "n2"}
	got := map[string]int{}
	for i := 0; i < 3000; i++ {
		got[Proposer(fmt.Sprintf("order-2026-12-01-%06d", i), nodes)]++
	}
	for _, n := range nodes {
		if got[n] < 800 {
			t.Fatalf("proposer shares %v: %s gets too few", got, n)
		}
	}
	if p := Proposer("g", []string{"only"}); p != "only" {
		t.Fatalf("Proposer over one node = %q", p)
	}
}

// Evacuated tells the take-over records an evacuation wrote from those a
// fence wrote, on the records Transition writes.
func TestEvacuatedOnTheRecordsTransitionWrites(t *testing.T) {
	env := Env{Now: time.Unix(1000, 0), Handler: "h", Live: map[string]NodeState{"n1": {HasConsumer: true}, "n2": {HasConsumer: true}}}
	bound := &kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 5, Revision: 3}
	moving := &kvbinding.Binding{Group: "g", State: kvbinding.StateMoving, Node: "n2", PrevNode: "n1", FromSeq: 5, Reason: "rebalance", Revision: 4}
	for _, tt := range []struct {
		name string
		cur  *kvbinding.Binding
		in   Input
		want bool
	}{
		{"fence", moving, Input{Op: OpFence, By: "n1", Seq: 9, Rev: 4}, false},
		{"clean fence", moving, Input{Op: OpFence, By: "n1", Seq: 9, Rev: 4, Clean: true}, false},
		{"evacuate a settled group", bound, Input{Op: OpEvacuate, By: "h", From: "n1", Node: "n2", Seq: 7, Reason: "node n1 gone for 15s"}, true},
		{"evacuate a move never fenced", moving, Input{Op: OpEvacuate, By: "h", From: "n1", Node: "n2", Seq: 7, Reason: "node n1 did not fence within 30s"}, true},
	} {
		res := Transition("g", tt.cur, tt.in, env)
		if res.Outcome != Accepted || res.Write == nil {
			t.Fatalf("%s: %v (%s)", tt.name, res.Outcome, res.Reason)
		}
		if got := Evacuated(*res.Write); got != tt.want {
			t.Errorf("%s: Evacuated(%+v) = %v, want %v", tt.name, *res.Write, got, tt.want)
		}
		if tt.want && res.Write.Step == kvbinding.StepDrain {
			drained := Transition("g", withRev(res.Write, 10), Input{Op: OpDrained, By: "n2", Rev: 10}, env)
			if drained.Write == nil || Evacuated(*drained.Write) {
				t.Errorf("%s: the catch-up record after the drain %+v reads as an evacuation's", tt.name, drained.Write)
			}
		}
	}
}

func withRev(b *kvbinding.Binding, rev uint64) *kvbinding.Binding {
	c := *b
	c.Revision = rev
	return &c
}
