package logagg

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// lines is a slog handler that keeps what is logged.
type lines struct {
	mu  sync.Mutex
	got []slog.Record
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, r.Clone())
	return nil
}
func (l *lines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *lines) WithGroup(string) slog.Handler      { return l }

func (l *lines) records() []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]slog.Record(nil), l.got...)
}

func attrs(r slog.Record) map[string]string {
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	return m
}

func waitLines(t *testing.T, l *lines, n int) []slog.Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got := l.records(); len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lines logged, want %d", len(l.records()), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A storm of one warning, per group and per attempt, is two lines: the
// first at once, then one with the count, the distinct groups and a few
// examples.
func TestWarnerAggregates(t *testing.T) {
	l := &lines{}
	w := New(slog.New(l), "no routing decision", 100*time.Millisecond)
	defer w.Close()
	for attempt := 1; attempt <= 10; attempt++ {
		for g := 0; g < 100; g++ {
			w.Warn(fmt.Sprintf("g%03d", g), "attempt", attempt)
		}
	}
	got := waitLines(t, l, 2)
	time.Sleep(250 * time.Millisecond) // nothing more comes
	if got = l.records(); len(got) != 2 {
		t.Fatalf("%d lines for 1,000 warnings, want 2", len(got))
	}
	first, agg := attrs(got[0]), attrs(got[1])
	if first["group"] != "g000" || first["attempt"] != "1" {
		t.Errorf("first line %v, want group g000 attempt 1", first)
	}
	if agg["repeated"] != "999" || agg["keys"] != "100" || agg["attempt"] != "10" || !strings.Contains(agg["examples"], "g001") {
		t.Errorf("aggregated line %v, want repeated 999, keys 100, examples, the last attempt", agg)
	}
	if seen, logged := w.Counts(); seen != 1000 || logged != 2 {
		t.Errorf("Counts = %d seen, %d lines; want 1000, 2", seen, logged)
	}
	// Quiet for an interval: the next one is logged at once again.
	w.Warn("g-late", "attempt", 1)
	got = waitLines(t, l, 3)
	if a := attrs(got[2]); a["group"] != "g-late" {
		t.Errorf("after a quiet interval: %v, want g-late logged at once", a)
	}
}

func TestWarnerCloseFlushes(t *testing.T) {
	l := &lines{}
	w := New(slog.New(l), "x", time.Hour)
	w.Warn("a")
	w.Warn("b")
	w.Warn("b")
	w.Close()
	got := l.records()
	if len(got) != 2 || attrs(got[1])["repeated"] != "2" || attrs(got[1])["keys"] != "1" {
		t.Fatalf("after Close: %d lines (%v)", len(got), got)
	}
	w.Warn("c") // after Close: dropped
	if len(l.records()) != 2 {
		t.Fatal("a warning after Close was logged")
	}
}

func TestShort(t *testing.T) {
	long := strings.Repeat("a", 63) + "é" + strings.Repeat("b", 1000)
	s := Short(long)
	if !strings.HasPrefix(s, strings.Repeat("a", 63)+"...(+") || !strings.HasSuffix(s, " bytes)") {
		t.Fatalf("Short cut inside a rune or wrongly: %q", s)
	}
	if Short("order-42") != "order-42" {
		t.Fatal("a short key was changed")
	}
	if !strings.Contains(Short(strings.Repeat("x", 1000)), "(+936 bytes)") {
		t.Fatalf("Short(1000 x) = %q", Short(strings.Repeat("x", 1000)))
	}
}
