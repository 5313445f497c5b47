package proposals

import (
	"reflect"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

var testMonitorConfig = MonitorConfig{NodeGrace: 15 * time.Second, RebindAfter: 30 * time.Second, FenceDeadline: 10 * time.Second,
	Rebalance: RebalanceConfig{Enabled: true, Tolerance: 1, MaxMoves: 2, MaxInFlight: 8, CoolDown: 30 * time.Second}}

// TestPlanTicks drives one MonitorState through a script of ticks: each
// step's input and the actions it must give.
func TestPlanTicks(t *testing.T) {
	moving := func(prev, to string, rev uint64) kvbinding.Binding {
		return kvbinding.Binding{State: kvbinding.StateMoving, PrevNode: prev, Node: to, Revision: rev}
	}
	type step struct {
		in   MonitorInput
		want MonitorActions
		// done: evacuations and rebinds that end after the step
		// (node -> gone/noConsumer cleared).
		done map[string][2]bool
	}
	tests := []struct {
		name  string
		cfg   MonitorConfig
		steps []step
	}{
		{
			name: "a gone node is evacuated after the grace, counted from its last announcement",
			steps: []step{
				// First seen gone: its groups bound after its checkpoint go
				// at once (Departed), the others wait for the grace.
				{in: MonitorInput{Now: at(10), Live: map[string]bool{"n1": true}, Owners: map[string]bool{"n1": true, "n2": true},
					LastSeen: map[string]time.Time{"n2": at(2)}},
					want: MonitorActions{Departed: []string{"n2"}}, done: map[string][2]bool{"n2": {}}},
				{in: MonitorInput{Now: at(17.5), Live: map[string]bool{"n1": true}, Owners: map[string]bool{"n1": true, "n2": true}},
					want: MonitorActions{Evacuate: []Evacuation{{Node: "n2"}}}},
				// Still gone and evacuating: nothing more until done.
				{in: MonitorInput{Now: at(18), Live: map[string]bool{"n1": true}, Owners: map[string]bool{"n1": true, "n2": true}},
					done: map[string][2]bool{"n2": {true, false}}},
				// Done, its clock cleared: a new grace from now.
				{in: MonitorInput{Now: at(19), Live: map[string]bool{"n1": true}, Owners: map[string]bool{"n1": true, "n2": true}},
					want: MonitorActions{Departed: []string{"n2"}}, done: map[string][2]bool{"n2": {}}},
				{in: MonitorInput{Now: at(34), Live: map[string]bool{"n1": true}, Owners: map[string]bool{"n1": true, "n2": true}},
					want: MonitorActions{Evacuate: []Evacuation{{Node: "n2"}}}},
			},
		},
		{
			name: "a node back within the grace is not evacuated",
			steps: []step{
				{in: MonitorInput{Now: at(0), Live: map[string]bool{"n1": true}, Owners: map[string]bool{"n2": true}},
					want: MonitorActions{Departed: []string{"n2"}}, done: map[string][2]bool{"n2": {}}},
				{in: MonitorInput{Now: at(10), Live: map[string]bool{"n1": true, "n2": true}, Owners: map[string]bool{"n2": true}}},
				{in: MonitorInput{Now: at(20), Live: map[string]bool{"n1": true}, Owners: map[string]bool{"n2": true}},
					want: MonitorActions{Departed: []string{"n2"}}, done: map[string][2]bool{"n2": {}}},
				{in: MonitorInput{Now: at(34), Live: map[string]bool{"n1": true}, Owners: map[string]bool{"n2": true}}},
				{in: MonitorInput{Now: at(35), Live: map[string]bool{"n1": true}, Owners: map[string]bool{"n2": true}},
					want: MonitorActions{Evacuate: []Evacuation{{Node: "n2"}}}},
			},
		},
		{
			name: "a node without a consumer is rebound after RebindAfter while another has one",
			steps: []step{
				{in: MonitorInput{Now: at(0), Live: map[string]bool{"n1": false, "n2": false}, Owners: map[string]bool{"n1": true}}},
				// Nobody has a consumer: no clock.
				{in: MonitorInput{Now: at(40), Live: map[string]bool{"n1": false, "n2": true}, Owners: map[string]bool{"n1": true}}},
				{in: MonitorInput{Now: at(69), Live: map[string]bool{"n1": false, "n2": true}, Owners: map[string]bool{"n1": true}}},
				{in: MonitorInput{Now: at(70), Live: map[string]bool{"n1": false, "n2": true}, Owners: map[string]bool{"n1": true}},
					want: MonitorActions{Rebind: []string{"n1"}}, done: map[string][2]bool{"n1": {false, true}}},
				{in: MonitorInput{Now: at(71), Live: map[string]bool{"n1": false, "n2": true}, Owners: map[string]bool{"n1": true}}},
			},
		},
		{
			name: "rebinding disabled",
			cfg:  MonitorConfig{NodeGrace: 15 * time.Second, RebindAfter: -1, FenceDeadline: 10 * time.Second},
			steps: []step{
				{in: MonitorInput{Now: at(0), Live: map[string]bool{"n1": false, "n2": true}, Owners: map[string]bool{"n1": true}}},
				{in: MonitorInput{Now: at(100), Live: map[string]bool{"n1": false, "n2": true}, Owners: map[string]bool{"n1": true}}},
			},
		},
		{
			name: "a move not fenced within the deadline is fenced by the handler; a new revision restarts the clock",
			steps: []step{
				{in: MonitorInput{Now: at(0), Live: map[string]bool{"n1": true, "n2": true}, Owners: map[string]bool{"n1": true},
					Unsettled: map[string]kvbinding.Binding{"b": moving("n1", "n2", 5), "a": moving("n1", "n2", 4)}}},
				{in: MonitorInput{Now: at(5), Live: map[string]bool{"n1": true, "n2": true}, Owners: map[string]bool{"n1": true},
					Unsettled: map[string]kvbinding.Binding{"b": moving("n1", "n2", 5), "a": moving("n1", "n2", 7)}}},
				{in: MonitorInput{Now: at(10), Live: map[string]bool{"n1": true, "n2": true}, Owners: map[string]bool{"n1": true},
					Unsettled: map[string]kvbinding.Binding{"b": moving("n1", "n2", 5), "a": moving("n1", "n2", 7)}},
					want: MonitorActions{Evacuate: []Evacuation{{Node: "n1", Groups: []string{"b"}}}}, done: map[string][2]bool{"n1": {}}},
				{in: MonitorInput{Now: at(15), Live: map[string]bool{"n1": true, "n2": true}, Owners: map[string]bool{"n1": true},
					Unsettled: map[string]kvbinding.Binding{"b": moving("n1", "n2", 5), "a": moving("n1", "n2", 7)}},
					want: MonitorActions{Evacuate: []Evacuation{{Node: "n1", Groups: []string{"a", "b"}}}}},
			},
		},
		{
			name: "rebalance waits for evacuations and for its previous moves",
			steps: []step{
				{in: MonitorInput{Now: at(0), Live: map[string]bool{"n1": true, "n2": true}, Owners: map[string]bool{"n1": true, "n3": true},
					Nodes:      map[string]NodeState{"n1": {HasConsumer: true, Groups: 6}, "n2": {HasConsumer: true}},
					Candidates: map[string][]Candidate{"n1": {{Group: "a"}, {Group: "b"}, {Group: "c"}}},
					LastSeen:   map[string]time.Time{"n3": at(-20)}},
					want: MonitorActions{Evacuate: []Evacuation{{Node: "n3"}}}, done: map[string][2]bool{"n3": {true, false}}},
				{in: MonitorInput{Now: at(1), Live: map[string]bool{"n1": true, "n2": true}, Owners: map[string]bool{"n1": true},
					Nodes:      map[string]NodeState{"n1": {HasConsumer: true, Groups: 6}, "n2": {HasConsumer: true}},
					Candidates: map[string][]Candidate{"n1": {{Group: "a"}, {Group: "b"}, {Group: "c"}}}},
					want: MonitorActions{Rebalance: []RebalanceMove{{"a", "n1", "n2"}, {"b", "n1", "n2"}}}},
				// The moves are being written: nothing planned.
				{in: MonitorInput{Now: at(2), Live: map[string]bool{"n1": true, "n2": true}, Owners: map[string]bool{"n1": true},
					Nodes:      map[string]NodeState{"n1": {HasConsumer: true, Groups: 6}, "n2": {HasConsumer: true}},
					Candidates: map[string][]Candidate{"n1": {{Group: "a"}, {Group: "b"}, {Group: "c"}}}}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			if cfg.NodeGrace == 0 {
				cfg = testMonitorConfig
			}
			var s MonitorState
			for i, st := range tt.steps {
				got := s.Plan(cfg, st.in)
				if !reflect.DeepEqual(got, st.want) {
					t.Fatalf("step %d: got %+v, want %+v", i, got, st.want)
				}
				for node, d := range st.done {
					s.Done(node, d[0], d[1])
				}
			}
		})
	}
}

func TestPlanRebalanceCoolDown(t *testing.T) {
	var s MonitorState
	cfg := testMonitorConfig
	in := func(now float64, unsettled map[string]kvbinding.Binding) MonitorInput {
		return MonitorInput{Now: at(now), Live: map[string]bool{"n1": true, "n2": true}, Owners: map[string]bool{"n1": true},
			Unsettled:  unsettled,
			Nodes:      map[string]NodeState{"n1": {HasConsumer: true, Groups: 6}, "n2": {HasConsumer: true}},
			Candidates: map[string][]Candidate{"n1": {{Group: "a"}, {Group: "b"}, {Group: "c"}, {Group: "d"}}}}
	}
	// "a" is moving (an operator's move) at 0 and settles before 1.
	if got := s.Plan(cfg, in(0, map[string]kvbinding.Binding{"a": {State: kvbinding.StateBound, Node: "n1", Step: kvbinding.StepCatchUp}})); len(got.Rebalance) != 2 ||
		got.Rebalance[0].Group != "b" || got.Rebalance[1].Group != "c" {
		t.Fatalf("tick 0: %+v, want b and c (a moved recently)", got.Rebalance)
	}
	s.RebalanceDone()
	// Counts unchanged (the moves failed): b and c wait out their
	// cool-down, a too; d goes.
	if got := s.Plan(cfg, in(29, nil)); len(got.Rebalance) != 1 || got.Rebalance[0].Group != "d" {
		t.Fatalf("tick 29: %+v, want d alone", got.Rebalance)
	}
	s.RebalanceDone()
	if got := s.Plan(cfg, in(30.5, nil)); len(got.Rebalance) != 2 || got.Rebalance[0].Group != "a" {
		t.Fatalf("tick 30.5: %+v, want a and b (cool-downs over)", got.Rebalance)
	}
}

func TestPlanRebalance(t *testing.T) {
	cons := func(groups ...int) map[string]NodeState {
		out := map[string]NodeState{}
		for i, g := range groups {
			out[string(rune('1'+i))] = NodeState{HasConsumer: true, Groups: g}
		}
		return out
	}
	cands := func(node string, groups ...string) []Candidate {
		out := make([]Candidate, len(groups))
		for i, g := range groups {
			out[i] = Candidate{Group: node + g}
		}
		return out
	}
	cfg := RebalanceConfig{Enabled: true, Tolerance: 1, MaxMoves: 10, CoolDown: time.Minute}
	tests := []struct {
		name string
		cfg  RebalanceConfig
		in   RebalanceInput
		want []RebalanceMove
	}{
		{name: "balanced within the tolerance", in: RebalanceInput{Nodes: cons(11, 10, 9),
			Candidates: map[string][]Candidate{"1": cands("1", "a", "b")}}},
		{name: "tolerance 0 spreads to within one", cfg: RebalanceConfig{Enabled: true, MaxMoves: 10},
			in:   RebalanceInput{Nodes: cons(11, 10, 9), Candidates: map[string][]Candidate{"1": cands("1", "a", "b")}},
			want: []RebalanceMove{{"1a", "1", "3"}}},
		{name: "a few groups off among hundreds: within the slack", cfg: RebalanceConfig{Enabled: true, Tolerance: 1, Slack: 0.05, MaxMoves: 10},
			in: RebalanceInput{Nodes: cons(337, 331, 332), Candidates: map[string][]Candidate{"1": cands("1", "a", "b")}}},
		{name: "the same without slack: moves", cfg: RebalanceConfig{Enabled: true, Tolerance: 1, MaxMoves: 10},
			in:   RebalanceInput{Nodes: cons(337, 331, 332), Candidates: map[string][]Candidate{"1": cands("1", "a", "b")}},
			want: []RebalanceMove{{"1a", "1", "2"}, {"1b", "1", "2"}}},
		{name: "a node joined: it takes groups up to its share less the slack", cfg: RebalanceConfig{Enabled: true, Tolerance: 1, Slack: 0.05, MaxMoves: 400},
			in: RebalanceInput{Nodes: cons(50, 50, 0), Candidates: map[string][]Candidate{"1": cands("1", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z"),
				"2": cands("2", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z")}},
			want: []RebalanceMove{{"1a", "1", "3"}, {"2a", "2", "3"}, {"1b", "1", "3"}, {"2b", "2", "3"}, {"1c", "1", "3"}, {"2c", "2", "3"},
				{"1d", "1", "3"}, {"2d", "2", "3"}, {"1e", "1", "3"}, {"2e", "2", "3"}, {"1f", "1", "3"}, {"2f", "2", "3"},
				{"1g", "1", "3"}, {"2g", "2", "3"}, {"1h", "1", "3"}, {"2h", "2", "3"}, {"1i", "1", "3"}, {"2i", "2", "3"},
				{"1j", "1", "3"}, {"2j", "2", "3"}, {"1k", "1", "3"}, {"2k", "2", "3"}, {"1l", "1", "3"}, {"2l", "2", "3"},
				{"1m", "1", "3"}, {"2m", "2", "3"}, {"1n", "1", "3"}, {"2n", "2", "3"}, {"1o", "1", "3"}, {"2o", "2", "3"},
				{"1p", "1", "3"}, {"2p", "2", "3"}}},
		{name: "started together: 30/0/0", in: RebalanceInput{Nodes: cons(30, 0, 0),
			Candidates: map[string][]Candidate{"1": cands("1", "a", "b", "c", "d", "e")}},
			want: []RebalanceMove{{"1a", "1", "2"}, {"1b", "1", "3"}, {"1c", "1", "2"}, {"1d", "1", "3"}, {"1e", "1", "2"}}},
		{name: "bounded per tick", cfg: RebalanceConfig{Enabled: true, Tolerance: 1, MaxMoves: 2},
			in:   RebalanceInput{Nodes: cons(30, 0, 0), Candidates: map[string][]Candidate{"1": cands("1", "a", "b", "c")}},
			want: []RebalanceMove{{"1a", "1", "2"}, {"1b", "1", "3"}}},
		{name: "bounded by the moves in flight", cfg: RebalanceConfig{Enabled: true, Tolerance: 1, MaxMoves: 4, MaxInFlight: 5},
			in:   RebalanceInput{InFlight: 4, Nodes: cons(30, 0, 0), Candidates: map[string][]Candidate{"1": cands("1", "a", "b", "c")}},
			want: []RebalanceMove{{"1a", "1", "2"}}},
		{name: "none when MaxInFlight are moving", cfg: RebalanceConfig{Enabled: true, Tolerance: 1, MaxMoves: 4, MaxInFlight: 5},
			in: RebalanceInput{InFlight: 5, Nodes: cons(30, 0, 0), Candidates: map[string][]Candidate{"1": cands("1", "a")}}},
		{name: "a node joins 20/20/0: it gets to its share minus the tolerance", in: RebalanceInput{Nodes: cons(20, 20, 0),
			Candidates: map[string][]Candidate{"1": cands("1", "a", "b", "c", "d", "e", "f", "g"), "2": cands("2", "a", "b", "c", "d", "e", "f", "g")}},
			want: []RebalanceMove{{"1a", "1", "3"}, {"2a", "2", "3"}, {"1b", "1", "3"}, {"2b", "2", "3"}, {"1c", "1", "3"},
				{"2c", "2", "3"}, {"1d", "1", "3"}, {"2d", "2", "3"}, {"1e", "1", "3"}, {"2e", "2", "3"}}},
		{name: "groups moving in count for their target", in: RebalanceInput{Nodes: cons(8, 0), Incoming: map[string]int{"2": 3},
			Candidates: map[string][]Candidate{"1": cands("1", "a", "b", "c")}},
			want: []RebalanceMove{{"1a", "1", "2"}, {"1b", "1", "2"}}},
		{name: "idle groups first, then by id", in: RebalanceInput{Nodes: cons(6, 0),
			Candidates: map[string][]Candidate{"1": {{Group: "a", Busy: true}, {Group: "c"}, {Group: "b", Busy: true}, {Group: "d"}}}},
			want: []RebalanceMove{{"c", "1", "2"}, {"d", "1", "2"}}},
		{name: "cool-down and the ungrouped binding", in: RebalanceInput{Now: at(100), Nodes: cons(6, 0),
			LastMove:   map[string]time.Time{"a": at(50), "b": at(30)},
			Candidates: map[string][]Candidate{"1": {{Group: "a"}, {Group: ""}, {Group: "b"}}}},
			want: []RebalanceMove{{"b", "1", "2"}}},
		{name: "nodes without a consumer neither give nor take", in: RebalanceInput{
			Nodes:      map[string]NodeState{"1": {HasConsumer: true, Groups: 6}, "2": {Groups: 0}, "3": {HasConsumer: true, Groups: 0}},
			Candidates: map[string][]Candidate{"1": cands("1", "a", "b", "c"), "2": cands("2", "a")}},
			want: []RebalanceMove{{"1a", "1", "3"}, {"1b", "1", "3"}}},
		{name: "the most loaded node has nothing movable: the next one gives", in: RebalanceInput{Nodes: cons(10, 9, 0),
			Candidates: map[string][]Candidate{"2": cands("2", "a", "b", "c", "d")}},
			want: []RebalanceMove{{"2a", "2", "3"}, {"2b", "2", "3"}, {"2c", "2", "3"}, {"2d", "2", "3"}}},
		{name: "one node", in: RebalanceInput{Nodes: cons(10), Candidates: map[string][]Candidate{"1": cands("1", "a")}}},
		{name: "disabled", cfg: RebalanceConfig{MaxMoves: 4}, in: RebalanceInput{Nodes: cons(10, 0),
			Candidates: map[string][]Candidate{"1": cands("1", "a")}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.cfg
			if c.MaxMoves == 0 {
				c = cfg
			}
			got := PlanRebalance(c, tt.in)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestOverloaded(t *testing.T) {
	cfg := RebalanceConfig{Enabled: true, Tolerance: 1}
	tests := []struct {
		name  string
		nodes map[string]NodeState
		in    map[string]int
		want  []string
	}{
		{"balanced", map[string]NodeState{"a": {HasConsumer: true, Groups: 11}, "b": {HasConsumer: true, Groups: 9}}, nil, nil},
		{"one above", map[string]NodeState{"a": {HasConsumer: true, Groups: 13}, "b": {HasConsumer: true, Groups: 7}}, nil, []string{"a"}},
		{"within the tolerance of a fractional share", map[string]NodeState{"a": {HasConsumer: true, Groups: 14},
			"b": {HasConsumer: true, Groups: 13}, "c": {HasConsumer: true, Groups: 13}}, nil, nil},
		{"one below the share minus the tolerance", map[string]NodeState{"a": {HasConsumer: true, Groups: 14},
			"b": {HasConsumer: true, Groups: 14}, "c": {HasConsumer: true, Groups: 12}}, nil, []string{"a", "b"}},
		{"one below by more than the tolerance", map[string]NodeState{"a": {HasConsumer: true, Groups: 15},
			"b": {HasConsumer: true, Groups: 14}, "c": {HasConsumer: true, Groups: 11}}, nil, []string{"a", "b"}},
		{"moving in counts", map[string]NodeState{"a": {HasConsumer: true, Groups: 11}, "b": {HasConsumer: true, Groups: 6}},
			map[string]int{"b": 3}, nil},
		{"only nodes with a consumer", map[string]NodeState{"a": {HasConsumer: true, Groups: 10}, "b": {Groups: 0}}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Overloaded(cfg, tt.nodes, tt.in); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestLeastLoaded(t *testing.T) {
	load := map[string]int{"a": 2, "b": 1, "c": 1, "d": 3}
	f := func(n string) int { return load[n] }
	tests := []struct {
		nodes []string
		turn  int
		want  string
	}{
		{nil, 0, ""},
		{[]string{"a", "b", "c", "d"}, 0, "b"},
		{[]string{"a", "b", "c", "d"}, 1, "b"},
		{[]string{"a", "b", "c", "d"}, 2, "c"},
		{[]string{"a", "b", "c", "d"}, 3, "b"},
		{[]string{"a", "b", "c", "d"}, 6, "c"},
		{[]string{"a", "d"}, 0, "a"},
	}
	for _, tt := range tests {
		if got := LeastLoaded(tt.nodes, f, tt.turn); got != tt.want {
			t.Errorf("LeastLoaded(%v, turn %d) = %q, want %q", tt.nodes, tt.turn, got, tt.want)
		}
	}
}

func TestPlanPauses(t *testing.T) {
	w := 10 * time.Second
	tests := []struct {
		name                  string
		in                    PauseInput
		wantPause, wantResume []string
	}{
		{name: "a drained queue not paused yet", in: PauseInput{Now: at(0), Window: w, Draining: map[string]int{"n1": 2}},
			wantPause: []string{"n1"}},
		{name: "paused recently: not again", in: PauseInput{Now: at(0), Window: w, Draining: map[string]int{"n1": 2},
			Paused: map[string]time.Time{"n1": at(7)}}},
		{name: "a third of the window gone: renewed", in: PauseInput{Now: at(0), Window: w, Draining: map[string]int{"n1": 2},
			Paused: map[string]time.Time{"n1": at(6)}}, wantPause: []string{"n1"}},
		{name: "no drain left: resumed", in: PauseInput{Now: at(0), Window: w, Paused: map[string]time.Time{"n1": at(9), "n2": at(9)},
			Draining: map[string]int{"n2": 1}}, wantResume: []string{"n1"}},
		{name: "a write in flight keeps it paused", in: PauseInput{Now: at(0), Window: w, Paused: map[string]time.Time{"n1": at(9)},
			Pausing: map[string]int{"n1": 1}}},
		{name: "a catch-up from its node keeps it paused", in: PauseInput{Now: at(0), Window: w, Paused: map[string]time.Time{"n1": at(9)},
			CatchingUp: map[string]int{"n1": 1}, CatchUpSince: map[string]time.Time{"n1": at(-1)}}},
		{name: "and renewed", in: PauseInput{Now: at(0), Window: w, Paused: map[string]time.Time{"n1": at(6), "n2": at(6)},
			CatchingUp: map[string]int{"n1": 1}, CatchUpSince: map[string]time.Time{"n1": at(-29)}, Draining: map[string]int{"n2": 1}},
			wantPause: []string{"n1", "n2"}},
		{name: "for CatchUpHold at most", in: PauseInput{Now: at(0), Window: w, Paused: map[string]time.Time{"n1": at(9)},
			CatchingUp: map[string]int{"n1": 1}, CatchUpSince: map[string]time.Time{"n1": at(-30)}}, wantResume: []string{"n1"}},
		{name: "a catch-up pauses no queue this handler did not", in: PauseInput{Now: at(0), Window: w,
			CatchingUp: map[string]int{"n1": 1}, CatchUpSince: map[string]time.Time{"n1": at(-1)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, r := PlanPauses(tt.in)
			if !reflect.DeepEqual(p, tt.wantPause) || !reflect.DeepEqual(r, tt.wantResume) {
				t.Fatalf("got pause %v resume %v, want %v %v", p, r, tt.wantPause, tt.wantResume)
			}
		})
	}
}

// TrackCatchUps counts a node's catch-ups from when it first sees them
// with no drain of the node left, and forgets the node once they end or a
// drain comes back.
func TestTrackCatchUps(t *testing.T) {
	since := map[string]time.Time{}
	TrackCatchUps(since, map[string]int{"n1": 1, "n2": 1}, map[string]int{"n2": 1}, at(0))
	if len(since) != 1 || !since["n1"].Equal(at(0)) {
		t.Fatalf("since %v, want n1 at 0 (n2 is still drained)", since)
	}
	TrackCatchUps(since, map[string]int{"n1": 2, "n2": 1}, nil, at(5))
	if len(since) != 2 || !since["n1"].Equal(at(0)) || !since["n2"].Equal(at(5)) {
		t.Fatalf("since %v, want n1 at 0, n2 at 5", since)
	}
	TrackCatchUps(since, map[string]int{"n2": 1}, map[string]int{"n2": 1}, at(6))
	if len(since) != 0 {
		t.Fatalf("since %v, want none: n1's catch-ups ended, n2 is drained again", since)
	}
}

// Rebalancing waits while the count of groups changes from one tick to the
// next (groups being bound spread by themselves, and a count taken in a
// burst of bindings is off by a few), but not for more than steadyTicks
// ticks in a row.
func TestPlanRebalanceWaitsForASteadyCount(t *testing.T) {
	var s MonitorState
	cfg := testMonitorConfig
	in := func(now float64, n1, n2 int) MonitorInput {
		return MonitorInput{Now: at(now), Live: map[string]bool{"n1": true, "n2": true}, Owners: map[string]bool{"n1": true},
			Nodes:      map[string]NodeState{"n1": {HasConsumer: true, Groups: n1}, "n2": {HasConsumer: true, Groups: n2}},
			Candidates: map[string][]Candidate{"n1": {{Group: "a"}, {Group: "b"}, {Group: "c"}, {Group: "d"}}}}
	}
	if got := s.Plan(cfg, in(0, 0, 0)); len(got.Rebalance) != 0 {
		t.Fatalf("tick 0: %+v, want nothing", got.Rebalance)
	}
	// Binding: counts grow; nothing moves.
	if got := s.Plan(cfg, in(0.5, 6, 1)); len(got.Rebalance) != 0 {
		t.Fatalf("tick 0.5 (count 0 -> 7): %+v, want nothing", got.Rebalance)
	}
	// The same count: spread.
	if got := s.Plan(cfg, in(1, 6, 1)); len(got.Rebalance) == 0 {
		t.Fatal("tick 1 (count steady): nothing planned")
	}
	s.RebalanceDone()
	s = MonitorState{}
	s.Plan(cfg, in(0, 0, 0))
	for i := 1; i <= steadyTicks; i++ {
		if got := s.Plan(cfg, in(float64(i)/2, 6+i, 0)); len(got.Rebalance) != 0 {
			t.Fatalf("changing count, tick %d: %+v, want nothing", i, got.Rebalance)
		}
	}
	if got := s.Plan(cfg, in(float64(steadyTicks+1)/2, 7+steadyTicks, 0)); len(got.Rebalance) == 0 {
		t.Fatalf("after %d ticks of a changing count: nothing planned", steadyTicks)
	}
}
