package proposals

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestGroupLocks: decisions that share a group run one at a time, those
// that do not share one run at once, and overlapping sets taken in any
// order do not deadlock.
func TestGroupLocks(t *testing.T) {
	l := newGroupLocks()
	unlockA := l.lock([]string{"a", "b", "a"})
	got := make(chan struct{})
	go func() {
		defer l.lock([]string{"c", "b"})()
		close(got)
	}()
	unlockD := l.lock([]string{"d"}) // not shared: taken while a and b are held
	select {
	case <-got:
		t.Fatal("b taken twice")
	default:
	}
	unlockD()
	unlockA()
	<-got

	var inside, most atomic.Int32
	var wg sync.WaitGroup
	sets := [][]string{{"x", "y"}, {"y", "z"}, {"z", "x"}, {"x", "y", "z"}, {"y"}}
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			set := sets[i%len(sets)]
			unlock := l.lock(set)
			if set[0] == "y" && len(set) == 1 {
				if n := inside.Add(1); n > most.Load() {
					most.Store(n)
				}
				inside.Add(-1)
			}
			unlock()
		}()
	}
	wg.Wait()
	if most.Load() > 1 {
		t.Errorf("%d decisions held y at once", most.Load())
	}
	if len(l.held) != 0 {
		t.Errorf("locks left held: %v", l.held)
	}
}
