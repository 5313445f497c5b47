package consumer

import (
	"sync"
	"time"
)

// warnEvery is the most often one kind of warning is logged; the ones in
// between are counted and reported with the next.
const warnEvery = time.Minute

// warnings rate-limits repeated warnings per kind.
type warnings struct {
	mu   sync.Mutex
	last map[string]time.Time
	held map[string]int
}

// allow reports whether a warning of kind may be logged at now, and how
// many of that kind were suppressed since the last one logged.
func (w *warnings) allow(kind string, now time.Time) (ok bool, suppressed int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last, w.held = make(map[string]time.Time), make(map[string]int)
	}
	if t, seen := w.last[kind]; seen && now.Sub(t) < warnEvery {
		w.held[kind]++
		return false, 0
	}
	w.last[kind] = now
	suppressed = w.held[kind]
	delete(w.held, kind)
	return true, suppressed
}
