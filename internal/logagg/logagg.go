// Package logagg logs warnings that repeat — once per group, once per
// attempt — as one line per interval instead of one line each: the first
// occurrence at once, then, at the end of every interval that had more, a
// line with how many there were, over how many distinct keys, a few
// examples and the attributes of the last one. Keys (group ids) are
// truncated in what is logged; counters elsewhere carry the full numbers.
package logagg

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// Defaults of a Warner.
const (
	// DefaultEvery is the interval between two lines of one warning.
	DefaultEvery = 10 * time.Second
	// MaxExamples is how many keys an aggregated line names.
	MaxExamples = 3
	// MaxKeyLen is how much of a key is logged.
	MaxKeyLen = 64
	// maxDistinct bounds the keys remembered per interval (to count
	// distinct ones); past it the count says "at least".
	maxDistinct = 10_000
)

// Warner aggregates one kind of warning. It is safe for concurrent use.
// Close flushes what is pending and stops its timer.
type Warner struct {
	log   *slog.Logger
	level slog.Level
	msg   string
	every time.Duration
	now   func() time.Time

	mu       sync.Mutex
	windowAt time.Time // when the current interval began (zero: none)
	count    int       // occurrences in the interval not logged yet
	keys     map[string]struct{}
	examples []string
	last     []any
	timer    *time.Timer
	closed   bool
	logged   uint64 // lines written
	total    uint64 // occurrences seen
}

// New returns a Warner writing msg to log at warning level, at most one
// line per every (DefaultEvery when every <= 0).
func New(log *slog.Logger, msg string, every time.Duration) *Warner {
	if every <= 0 {
		every = DefaultEvery
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Warner{log: log, level: slog.LevelWarn, msg: msg, every: every, now: time.Now}
}

// Warn records one occurrence for key (a group id; "" if none) with the
// attributes of this occurrence (as slog's key-value pairs).
func (w *Warner) Warn(key string, attrs ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.total++
	now := w.now()
	if w.windowAt.IsZero() {
		// Quiet until now: this one is logged at once, and opens an
		// interval in which the next ones are counted.
		w.windowAt = now
		w.logged++
		w.log.Log(context.Background(), w.level, w.msg, append(keyAttr(key), attrs...)...)
		w.timer = time.AfterFunc(w.every, w.flush)
		return
	}
	w.count++
	if w.keys == nil {
		w.keys = map[string]struct{}{}
	}
	if len(w.keys) < maxDistinct {
		if _, seen := w.keys[key]; !seen {
			w.keys[key] = struct{}{}
			if len(w.examples) < MaxExamples {
				w.examples = append(w.examples, Short(key))
			}
		}
	}
	w.last = attrs
}

// flush logs what the interval collected, and keeps the interval open
// while occurrences come.
func (w *Warner) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed && w.count == 0 {
		return
	}
	if w.count == 0 {
		w.windowAt = time.Time{} // quiet: the next one is logged at once
		return
	}
	w.emitLocked()
	if !w.closed {
		w.windowAt = w.now()
		w.timer = time.AfterFunc(w.every, w.flush)
	}
}

func (w *Warner) emitLocked() {
	distinct := strconv.Itoa(len(w.keys))
	if len(w.keys) >= maxDistinct {
		distinct = "at least " + distinct
	}
	attrs := []any{"repeated", w.count, "within", w.every.String(), "keys", distinct, "examples", w.examples}
	w.logged++
	w.log.Log(context.Background(), w.level, w.msg, append(attrs, w.last...)...)
	w.count, w.keys, w.examples, w.last = 0, nil, nil, nil
}

// Close logs what is pending and stops the Warner.
func (w *Warner) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.count > 0 {
		w.emitLocked()
	}
}

// Counts returns how many occurrences were seen and how many lines
// were logged.
func (w *Warner) Counts() (seen, lines uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.total, w.logged
}

func keyAttr(key string) []any {
	if key == "" {
		return nil
	}
	return []any{"group", Short(key)}
}

// Short returns key as it is logged: at most MaxKeyLen bytes (cut on a
// rune boundary), followed by how many bytes were left out.
func Short(key string) string {
	if len(key) <= MaxKeyLen {
		return key
	}
	cut := MaxKeyLen
	for cut > 0 && key[cut]&0xC0 == 0x80 { // not inside a UTF-8 sequence
		cut--
	}
	return key[:cut] + "...(+" + strconv.Itoa(len(key)-cut) + " bytes)"
}
