package router

import (
	"testing"
	"time"
)

func TestMissedRange(t *testing.T) {
	tests := []struct {
		name            string
		next, from, seq uint64
		wantLo, wantHi  uint64
		wantOK          bool
	}{
		{"next in order", 5, 1, 5, 0, 0, false},
		{"one gone", 5, 1, 6, 5, 5, true},
		{"several gone", 91, 1, 101, 91, 100, true},
		{"first delivery past the checkpoint", 91, 91, 101, 91, 100, true},
		{"gone before the checkpoint's next: not this node's", 50, 101, 95, 0, 0, false},
		{"straddles the checkpoint's next", 50, 101, 110, 101, 109, true},
		{"first delivery without checkpoint", 1, 5000, 5000, 0, 0, false},
		{"behind next (already read)", 10, 1, 8, 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lo, hi, ok := missedRange(tt.next, tt.from, tt.seq)
			if lo != tt.wantLo || hi != tt.wantHi || ok != tt.wantOK {
				t.Errorf("missedRange(%d, %d, %d) = %d, %d, %v; want %d, %d, %v",
					tt.next, tt.from, tt.seq, lo, hi, ok, tt.wantLo, tt.wantHi, tt.wantOK)
			}
		})
	}
}

// TestGapLimiter: the first gap is reported at once, the gaps within the
// next period are summed into one report, due when the period is over.
func TestGapLimiter(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	l := gapLimiter{every: 10 * time.Second}
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	rep, ok := l.note(91, 100, at(0))
	if want := (gapReport{gaps: 1, missing: 10, first: 91, last: 100}); !ok || rep != want {
		t.Fatalf("first gap: %+v %v, want %+v reported at once", rep, ok, want)
	}
	if rep, ok := l.note(200, 200, at(time.Second)); ok {
		t.Fatalf("second gap within the period reported at once: %+v", rep)
	}
	if rep, ok := l.note(150, 151, at(2*time.Second)); ok {
		t.Fatalf("third gap within the period reported at once: %+v", rep)
	}
	if w := l.wait(at(2 * time.Second)); w != 8*time.Second {
		t.Errorf("wait = %v, want 8s (the rest of the period)", w)
	}
	if rep, ok := l.due(at(9 * time.Second)); ok {
		t.Fatalf("due before the period ended: %+v", rep)
	}
	rep, ok = l.due(at(10 * time.Second))
	if want := (gapReport{gaps: 2, missing: 3, first: 150, last: 200}); !ok || rep != want {
		t.Fatalf("summed report: %+v %v, want %+v", rep, ok, want)
	}
	if rep, ok := l.due(at(30 * time.Second)); ok || l.wait(at(30*time.Second)) != 0 {
		t.Fatalf("nothing pending, yet due: %+v", rep)
	}
	// After a quiet period, the next gap is reported at once again.
	if _, ok := l.note(300, 309, at(40*time.Second)); !ok {
		t.Fatal("gap after a quiet period not reported at once")
	}
	// flush reports what is pending whatever the time (a stop).
	l.note(400, 400, at(41*time.Second))
	if rep, ok := l.flush(at(41 * time.Second)); !ok || rep.missing != 1 {
		t.Fatalf("flush: %+v %v", rep, ok)
	}
	if _, ok := l.flush(at(42 * time.Second)); ok {
		t.Fatal("flush with nothing pending reported")
	}
}
