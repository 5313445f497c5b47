package proposals

import (
	"reflect"
	"testing"
	"time"

	"grouprouter/kvbinding"
)

func TestDecide(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	all := map[string]NodeState{
		"n0": {HasConsumer: true, Groups: 5},
		"n1": {HasConsumer: true, Groups: 2},
		"n2": {HasConsumer: false, Groups: 0},
	}
	none := map[string]NodeState{"n0": {Groups: 4}, "n1": {Groups: 1}}
	boundN0 := &kvbinding.Route{State: kvbinding.StateBound, Node: "n0", FromSeq: 3, Revision: 7}
	dead := &kvbinding.Route{State: kvbinding.StateDeadLettered, ThroughSeq: 10, Revision: 8}
	tests := []struct {
		name       string
		state      State
		p          Proposal
		action     Action
		node       string
		redirected bool
	}{
		{"unbound, eligible node accepted", State{Live: all}, Proposal{Group: "g", Node: "n0", FromSeq: 1}, Create, "n0", false},
		{"unbound, node without consumer redirected to fewest groups", State{Live: all}, Proposal{Group: "g", Node: "n2", FromSeq: 1}, Create, "n1", true},
		{"unbound, dead node redirected", State{Live: all}, Proposal{Group: "g", Node: "n9", FromSeq: 1}, Create, "n1", true},
		{"no node has a consumer: any live node", State{Live: none}, Proposal{Group: "g", Node: "n0", FromSeq: 1}, Create, "n0", false},
		{"no node has a consumer: dead node redirected to least loaded", State{Live: none}, Proposal{Group: "g", Node: "n7", FromSeq: 1}, Create, "n1", true},
		{"no live node fails", State{Live: map[string]NodeState{}}, Proposal{Group: "g", Node: "n0", FromSeq: 1}, Fail, "", false},
		{"bound group keeps its node", State{Live: all, Existing: boundN0}, Proposal{Group: "g", Node: "n1", FromSeq: 9}, Keep, "n0", false},
		{"bound to a dead node still keeps it", State{Live: map[string]NodeState{"n1": {HasConsumer: true}}, Existing: boundN0}, Proposal{Group: "g", Node: "n1", FromSeq: 9}, Keep, "n0", false},
		{"dead-lettered, stale proposal keeps the record", State{Live: all, Existing: dead}, Proposal{Group: "g", Node: "n0", FromSeq: 10}, Keep, "", false},
		{"dead-lettered, later messages bind afresh", State{Live: all, Existing: dead}, Proposal{Group: "g", Node: "n0", FromSeq: 11}, Replace, "n0", false},
		{"ungrouped router: any live node, consumer or not", State{Live: all}, Proposal{Group: "", Node: "n2", FromSeq: 1}, Create, "n2", false},
		{"ties broken by node id", State{Live: map[string]NodeState{"b": {HasConsumer: true, Groups: 1}, "a": {HasConsumer: true, Groups: 1}}}, Proposal{Group: "g", Node: "zz", FromSeq: 1}, Create, "a", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Decide(tt.state, tt.p, now)
			if v.Action != tt.action {
				t.Fatalf("action = %v, want %v (reason %q)", v.Action, tt.action, v.Reason)
			}
			if v.Binding.Node != tt.node || v.Redirected != tt.redirected {
				t.Errorf("node = %q redirected = %v, want %q %v", v.Binding.Node, v.Redirected, tt.node, tt.redirected)
			}
			if tt.action == Create || tt.action == Replace {
				b := v.Binding
				if b.Group != tt.p.Group || b.FromSeq != tt.p.FromSeq || b.State != kvbinding.StateBound || !b.DecidedAt.Equal(now) {
					t.Errorf("binding = %+v", b)
				}
				b.DecidedBy = "h/n0"
				if err := b.Validate(); err != nil {
					t.Errorf("binding does not validate: %v", err)
				}
			}
		})
	}
}

// TestDecideIsPure checks that Decide neither changes its input nor
// depends on anything but its arguments.
func TestDecideIsPure(t *testing.T) {
	live := map[string]NodeState{"n0": {HasConsumer: true, Groups: 1}, "n1": {HasConsumer: true}}
	s := State{Live: live}
	p := Proposal{Group: "g", Node: "n5", FromSeq: 4}
	now := time.Unix(100, 0)
	first := Decide(s, p, now)
	for i := 0; i < 100; i++ {
		if got := Decide(s, p, now); !reflect.DeepEqual(got, first) {
			t.Fatalf("Decide changed its answer: %+v vs %+v", got, first)
		}
	}
	if live["n0"].Groups != 1 || len(live) != 2 {
		t.Fatalf("Decide modified its state: %v", live)
	}
}

func TestEligible(t *testing.T) {
	live := map[string]NodeState{"c": {HasConsumer: true}, "a": {}, "b": {HasConsumer: true}}
	if got := Eligible(live, false); len(got) != 2 || got[0] != "b" || got[1] != "c" {
		t.Errorf("Eligible(grouped) = %v, want [b c]", got)
	}
	if got := Eligible(live, true); len(got) != 3 || got[0] != "a" {
		t.Errorf("Eligible(ungrouped) = %v, want [a b c]", got)
	}
}
