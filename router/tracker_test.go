package router

import (
	"reflect"
	"testing"

	"github.com/grouprouter/grouprouter/kvbinding"
)

func TestTrackerCheckpoint(t *testing.T) {
	var tr tracker
	for _, s := range []uint64{5, 6, 7, 9, 10, 11, 12} { // 8 is a gap (deleted message)
		tr.add(s)
	}
	tr.resolve(5)
	tr.resolve(7)
	tr.resolve(10)
	tr.resolve(12)
	got := tr.checkpoint()
	want := kvbinding.Checkpoint{Next: 13, Pending: [][2]uint64{{6, 6}, {9, 9}, {11, 11}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("checkpoint = %+v, want %+v", got, want)
	}
	tr.resolve(6)
	tr.resolve(9)
	tr.resolve(11)
	if got := tr.checkpoint(); got.Next != 13 || len(got.Pending) != 0 || len(tr.segs) != 0 {
		t.Fatalf("after resolving all: %+v, %d segments kept", got, len(tr.segs))
	}
	tr.resolve(3)  // below the window: ignored
	tr.resolve(40) // beyond: ignored
	tr.add(12)     // redelivery: ignored
	if got := tr.checkpoint(); got.Next != 13 {
		t.Fatalf("out-of-window calls changed the tracker: %+v", got)
	}
}

func TestTrackerBoundsCheckpointSize(t *testing.T) {
	var tr tracker
	for s := uint64(1); s <= 3*maxPendingRanges; s++ {
		tr.add(s)
		if s%2 == 0 {
			tr.resolve(s)
		}
	}
	got := tr.checkpoint()
	if got.Next != 1 || len(got.Pending) != 0 {
		t.Fatalf("oversized checkpoint = next %d with %d ranges, want the low watermark only", got.Next, len(got.Pending))
	}
}

func TestResumePoint(t *testing.T) {
	r := resumePoint{ckpt: kvbinding.Checkpoint{Next: 20, Pending: [][2]uint64{{4, 6}, {15, 15}}}}
	if r.start() != 4 {
		t.Fatalf("start = %d, want 4", r.start())
	}
	for seq, done := range map[uint64]bool{3: true, 4: false, 6: false, 7: true, 15: false, 16: true, 19: true, 20: false, 99: false} {
		if got := r.done(seq); got != done {
			t.Errorf("done(%d) = %v, want %v", seq, got, done)
		}
	}
	if (resumePoint{}).start() != 0 {
		t.Error("empty checkpoint must start from the beginning")
	}
}

// TestTrackerJumpCostsNoMemory: a purge of the ingress stream makes
// sequences jump; the tracker must not keep anything per skipped sequence.
func TestTrackerJumpCostsNoMemory(t *testing.T) {
	var tr tracker
	tr.add(1)
	tr.add(2)
	tr.resolve(2)
	tr.add(1 << 40) // a jump of a trillion sequences, with 1 still pending
	tr.add(1<<40 + 1)
	kept := 0
	for _, s := range tr.segs {
		kept += len(s.done)
	}
	if kept > 4 {
		t.Fatalf("tracker keeps %d entries across a jump", kept)
	}
	want := kvbinding.Checkpoint{Next: 1<<40 + 2, Pending: [][2]uint64{{1, 1}, {1 << 40, 1<<40 + 1}}}
	if got := tr.checkpoint(); !reflect.DeepEqual(got, want) {
		t.Fatalf("checkpoint = %+v, want %+v", got, want)
	}
	tr.resolve(1)
	tr.resolve(1 << 40)
	tr.resolve(1<<40 + 1)
	if got := tr.checkpoint(); got.Next != 1<<40+2 || len(got.Pending) != 0 || len(tr.segs) != 0 {
		t.Fatalf("after resolving all: %+v, %d segments", got, len(tr.segs))
	}
}
