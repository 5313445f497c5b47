package proposals

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

func TestNextFloor(t *testing.T) {
	for _, tc := range []struct {
		name        string
		prev        uint64
		starts      map[string]uint64
		ingressNext uint64
		want        uint64
		wantReset   bool
	}{
		{"the least checkpoint start of the live nodes", 0, map[string]uint64{"n1": 120, "n2": 80, "n3": 200}, 300, 80, false},
		{"never lowered: a node restarted from an older checkpoint", 100, map[string]uint64{"n1": 120, "n2": 40}, 300, 100, false},
		{"raised as the slowest node moves on", 100, map[string]uint64{"n1": 150, "n2": 130}, 300, 130, false},
		{"a node lagging holds it", 100, map[string]uint64{"n1": 5000, "n2": 101}, 6000, 101, false},
		{"a live node without a checkpoint yet (0) holds it", 100, map[string]uint64{"n1": 500, "n2": 0}, 600, 100, false},
		{"no live node with a checkpoint: kept (a stopped cluster)", 70, nil, 300, 70, false},
		{"no floor, no checkpoint", 0, map[string]uint64{}, 0, 0, false},
		{"ingress unknown: no bound", 10, map[string]uint64{"n1": 50}, 0, 50, false},
		{"not past the ingress stream's end", 10, map[string]uint64{"n1": 500}, 301, 301, false},
		{"at the end exactly (everything read)", 300, map[string]uint64{"n1": 301}, 301, 301, false},
		{"past the end: the stream was recreated, start again", 900, map[string]uint64{"n1": 950}, 12, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, reset := NextFloor(tc.prev, tc.starts, tc.ingressNext)
			if got != tc.want || reset != tc.wantReset {
				t.Errorf("NextFloor = %d (reset %v), want %d (reset %v)", got, reset, tc.want, tc.wantReset)
			}
			if !reset && got < tc.prev {
				t.Errorf("the floor went down from %d to %d", tc.prev, got)
			}
		})
	}
}

func TestTransitionBindBelowFloor(t *testing.T) {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	live := map[string]NodeState{"n1": {HasConsumer: true}, "n2": {HasConsumer: true}}
	released := &kvbinding.Binding{State: kvbinding.StateReleased, PrevNode: "n1", ThroughSeq: 40, Revision: 7}
	bound := &kvbinding.Binding{State: kvbinding.StateBound, Node: "n2", FromSeq: 10, Revision: 3}
	for _, tc := range []struct {
		name    string
		cur     *kvbinding.Binding
		seq     uint64
		floor   uint64
		want    Outcome
		wantErr error
	}{
		{"no record, below the floor: routed already", nil, 99, 100, Refused, ErrBelowFloor},
		{"no record, at the floor", nil, 100, 100, Accepted, nil},
		{"no record, no floor", nil, 5, 0, Accepted, nil},
		{"ended record, after its end but below the floor", released, 60, 100, Refused, ErrBelowFloor},
		{"ended record, after its end and the floor", released, 120, 100, Accepted, nil},
		{"ended record, within it: the record answers", released, 30, 100, Rejected, nil},
		{"bound: the record answers, whatever the floor", bound, 50, 100, Rejected, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Transition("g", tc.cur, Input{Op: OpBind, By: "n3", Node: "n1", Seq: tc.seq}, Env{Now: now, Handler: "h/n1", Live: live, Floor: tc.floor})
			if res.Outcome != tc.want {
				t.Fatalf("outcome %s (%s), want %s", res.Outcome, res.Reason, tc.want)
			}
			if !errors.Is(res.Err, tc.wantErr) {
				t.Errorf("err %v, want %v", res.Err, tc.wantErr)
			}
			if tc.wantErr != nil && (res.Floor != tc.floor || res.Write != nil) {
				t.Errorf("refused below the floor: Floor %d (want %d), Write %+v", res.Floor, tc.floor, res.Write)
			}
			if res.Outcome == Accepted && res.Write.FromSeq < tc.floor && tc.cur == nil {
				t.Errorf("a binding from %d, below the floor %d", res.Write.FromSeq, tc.floor)
			}
		})
	}
}

// TestFloorHeldByALiveNodeWithoutCheckpoint: while a live node has no
// checkpoint yet (it started at the floor and may hold its groups'
// messages from there), the active handler does not raise the floor past
// it, however far the other nodes are; once it saves one, the floor moves.
func TestFloorHeldByALiveNodeWithoutCheckpoint(t *testing.T) {
	s := natstest.RunServer(t)
	e := startHandler(t, s, "h1", liveNodes)
	natstest.Eventually(t, 5*time.Second, func() error {
		if !e.h.Active() {
			return natstest.ErrNotYet
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.h.reg.SaveCheckpoint(ctx, "n1", kvbinding.Checkpoint{Next: 500}); err != nil {
		t.Fatal(err)
	}
	// Three rounds of the floor (one a second) with n2 live and without
	// a checkpoint.
	time.Sleep(3 * floorEvery)
	if f := e.h.Floor(); f != 0 {
		t.Fatalf("floor %d raised past n2, live without a checkpoint", f)
	}
	if err := e.h.reg.SaveCheckpoint(ctx, "n2", kvbinding.Checkpoint{Next: 300}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		if f := e.h.Floor(); f != 300 {
			return fmt.Errorf("floor %d, want 300", f)
		}
		return nil
	})
}
