package router

import (
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

func TestConsumerViewProgress(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var v consumerView
	v = v.observe(consumerView{exists: true, delivered: 10, ackFloor: 2, pending: 8, ackWait: 30 * time.Second}, t0)
	if !v.progress.Equal(t0) {
		t.Fatalf("first reading: progress %v, want %v", v.progress, t0)
	}
	// Nothing acked: the clock runs.
	v = v.observe(consumerView{exists: true, delivered: 10, ackFloor: 2, pending: 8, ackWait: 30 * time.Second}, t0.Add(29*time.Second))
	if v.stalled(t0.Add(29 * time.Second)) {
		t.Fatal("stalled before its ack wait")
	}
	if !v.stalled(t0.Add(30 * time.Second)) {
		t.Fatal("not stalled after its ack wait without progress")
	}
	// An ack out of order (pending down, floor still): progress.
	t1 := t0.Add(31 * time.Second)
	v = v.observe(consumerView{exists: true, delivered: 10, ackFloor: 2, pending: 7, ackWait: 30 * time.Second}, t1)
	if !v.progress.Equal(t1) || v.stalled(t1) {
		t.Fatalf("an ack did not count as progress: %+v", v)
	}
	// The floor moving counts too.
	t2 := t1.Add(time.Second)
	v = v.observe(consumerView{exists: true, delivered: 10, ackFloor: 3, pending: 7, ackWait: 30 * time.Second}, t2)
	if !v.progress.Equal(t2) {
		t.Fatalf("a moved ack floor did not count as progress: %+v", v)
	}
	if !v.quiet {
		t.Fatal("two readings with the same last delivered sequence are not quiet")
	}
	v = v.observe(consumerView{exists: true, delivered: 11, ackFloor: 3, pending: 8, ackWait: 30 * time.Second}, t2.Add(time.Second))
	if v.quiet {
		t.Fatal("a reading with a new delivery counts as quiet")
	}
	if (consumerView{}).stalled(t2.Add(time.Hour)) {
		t.Fatal("a queue without consumer counts as stalled")
	}
}

// A reading that finds the consumer paused (its leader applied the pause)
// is quiet at once: nothing is delivered while it is, so what is past its
// delivered sequence may move without a second reading.
func TestConsumerViewPausedIsQuiet(t *testing.T) {
	t0 := time.Unix(1000, 0)
	running := consumerView{exists: true, delivered: 10, ackWait: 30 * time.Second}
	if v := (consumerView{}).observe(running, t0); v.quiet {
		t.Fatal("a first reading of a running consumer counts as quiet")
	}
	paused := running
	paused.paused, paused.pauseLeft = true, 9*time.Second
	v := (consumerView{}).observe(paused, t0)
	if !v.quiet {
		t.Fatal("a first reading of a paused consumer is not quiet")
	}
	if got := fateOf(drainMsg{node: "a", seq: 11}, v, t0); got != fateMove {
		t.Errorf("an undelivered message of a paused consumer: fate %v, want move", got)
	}
	if got := fateOf(drainMsg{node: "a", seq: 10}, v, t0); got != fateAwait {
		t.Errorf("a delivered, unacked message of a paused consumer: fate %v, want await", got)
	}
	// After a leader change within the ack wait, the pause does not make
	// the reading sure.
	v.unsure = t0.Add(time.Second)
	if got := fateOf(drainMsg{node: "a", seq: 11}, v, t0); got != fateAwait {
		t.Errorf("paused, but its leader is new: fate %v, want await", got)
	}
	// A paused reading without a consumer is no quiet one.
	if v := (consumerView{}).observe(consumerView{paused: true}, t0); v.quiet {
		t.Error("a reading without a consumer counts as quiet")
	}
}

func TestPlanDrain(t *testing.T) {
	now := time.Unix(1000, 0)
	alive := consumerView{exists: true, delivered: 20, ackFloor: 10, pending: 5, ackWait: 30 * time.Second, progress: now.Add(-time.Second), quiet: true}
	delivering := alive
	delivering.quiet = false
	stalled := alive
	stalled.progress = now.Add(-30 * time.Second)
	tests := []struct {
		name    string
		msgs    []drainMsg
		views   map[string]consumerView
		ready   bool
		move    []uint64 // stream sequences
		awaited int
		lapsed  int
	}{
		{"nothing found", nil, nil, true, nil, 0, 0},
		{"not delivered: moved", []drainMsg{{node: "a", seq: 21}, {node: "a", seq: 25}}, map[string]consumerView{"a": alive}, true, []uint64{21, 25}, 0, 0},
		{"delivered to a live consumer: the group waits, nothing moves",
			[]drainMsg{{node: "a", seq: 15}, {node: "a", seq: 21}}, map[string]consumerView{"a": alive}, false, nil, 1, 0},
		{"delivered and acked meanwhile", []drainMsg{{node: "a", seq: 15, gone: true}, {node: "a", seq: 21}}, map[string]consumerView{"a": alive}, true, []uint64{21}, 0, 0},
		{"at or below the ack floor: acked", []drainMsg{{node: "a", seq: 10}, {node: "a", seq: 21}}, map[string]consumerView{"a": alive}, true, []uint64{21}, 0, 0},
		{"a consumer silent for its ack wait: lapsed, moved", []drainMsg{{node: "a", seq: 15}, {node: "a", seq: 21}}, map[string]consumerView{"a": stalled}, true, []uint64{15, 21}, 0, 1},
		{"no consumer: nothing was delivered", []drainMsg{{node: "a", seq: 1}}, map[string]consumerView{}, true, []uint64{1}, 0, 0},
		{"not delivered, but deliveries may not have stopped: wait", []drainMsg{{node: "a", seq: 21}}, map[string]consumerView{"a": delivering}, false, nil, 1, 0},
		{"two old queues, one still working on the group",
			[]drainMsg{{node: "a", seq: 15}, {node: "b", seq: 16}}, map[string]consumerView{"a": stalled, "b": alive}, false, nil, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := planDrain(tt.msgs, tt.views, now)
			var move []uint64
			flagged := 0
			for _, m := range p.move {
				move = append(move, m.seq)
				if m.lapsed {
					flagged++
				}
			}
			if flagged != p.lapsed {
				t.Fatalf("planDrain flags %d moved messages lapsed, counts %d", flagged, p.lapsed)
			}
			if p.ready != tt.ready || p.awaited != tt.awaited || p.lapsed != tt.lapsed || !equalSeqs(move, tt.move) {
				t.Fatalf("planDrain = ready %v move %v awaited %d lapsed %d; want ready %v move %v awaited %d lapsed %d",
					p.ready, move, p.awaited, p.lapsed, tt.ready, tt.move, tt.awaited, tt.lapsed)
			}
		})
	}
}

func equalSeqs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCatchUpSpan(t *testing.T) {
	tests := []struct {
		name                           string
		route                          kvbinding.Binding
		laneFrom, movedThrough, caught uint64
		from, until                    uint64
	}{
		{"from the fence to the lane", kvbinding.Binding{FromSeq: 10}, 20, 0, 0, 10, 20},
		{"after what the drain found on the old queue", kvbinding.Binding{FromSeq: 10}, 20, 14, 0, 15, 20},
		{"after what an earlier taker routed", kvbinding.Binding{FromSeq: 10, Routed: 17}, 20, 14, 0, 18, 20},
		{"after what this node caught up before", kvbinding.Binding{FromSeq: 10, Routed: 12}, 20, 0, 19, 20, 20},
		{"marks below the fence do not count", kvbinding.Binding{FromSeq: 10, Routed: 5}, 20, 3, 9, 10, 20},
	}
	for _, tt := range tests {
		from, until := catchUpSpan(tt.route, tt.laneFrom, tt.movedThrough, tt.caught)
		if from != tt.from || until != tt.until {
			t.Errorf("%s: catchUpSpan = [%d, %d), want [%d, %d)", tt.name, from, until, tt.from, tt.until)
		}
	}
}
