package demo

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// The ledger's verdict finds each kind of failure it is there to find.
func TestLedgerVerdict(t *testing.T) {
	type delivery struct {
		group string
		n     int
	}
	for _, tt := range []struct {
		name      string
		published map[string]int // confirmed messages per group
		unconf    map[string]int // an unconfirmed publish per group
		got       []delivery
		want      check
		example   string
	}{
		{name: "every message once, in order",
			published: map[string]int{"a": 3, "b": 2},
			got:       []delivery{{"a", 0}, {"b", 0}, {"a", 1}, {"b", 1}, {"a", 2}},
			want:      check{Published: 5, Processed: 5}},
		{name: "a duplicate",
			published: map[string]int{"a": 2},
			got:       []delivery{{"a", 0}, {"a", 1}, {"a", 1}},
			want:      check{Published: 2, Processed: 3, Duplicates: 1}, example: "a: #1 again (on n0's queue)"},
		{name: "a message missing",
			published: map[string]int{"a": 3},
			got:       []delivery{{"a", 0}, {"a", 2}},
			want:      check{Published: 3, Processed: 2, Missing: 1}, example: "a: 1 of 3 never processed, the first #1"},
		{name: "out of order",
			published: map[string]int{"a": 3},
			got:       []delivery{{"a", 0}, {"a", 2}, {"a", 1}},
			want:      check{Published: 3, Processed: 3, OutOfOrder: 1}, example: "a: #1 after #2 (on n0's queue)"},
		{name: "an unconfirmed publish that arrived is not a failure",
			published: map[string]int{"a": 1}, unconf: map[string]int{"a": 1},
			got:  []delivery{{"a", 0}, {"a", 1}},
			want: check{Published: 1, Processed: 2, Unconfirmed: 1, UnconfArrived: 1}},
		{name: "a message never published",
			published: map[string]int{"a": 1},
			got:       []delivery{{"a", 0}, {"a", 5}, {"zz", 0}},
			want:      check{Published: 1, Processed: 2, Unexpected: 2}, example: "a: #5 processed but never published"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := newLedger([]string{"a", "b"})
			for g, n := range tt.published {
				for i := 0; i < n; i++ {
					l.published(l.index[g], i)
				}
			}
			for g, n := range tt.unconf {
				l.unconfirmedPublish(l.index[g], n)
			}
			for _, d := range tt.got {
				l.processedMsg(d.group, d.n, "n0")
			}
			got := l.verdict()
			examples := got.Examples
			got.Examples = nil
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("verdict %+v, want %+v", got, tt.want)
			}
			if tt.example != "" && !strings.Contains(strings.Join(examples, "\n"), tt.example) {
				t.Errorf("examples %q lack %q", examples, tt.example)
			}
		})
	}
}

// A killed node's group flows again when its first message published
// after the kill is processed.
func TestLedgerFlowAgain(t *testing.T) {
	l := newLedger([]string{"a", "b", "c"})
	for _, g := range []int{0, 1, 2} {
		l.published(g, 0)
	}
	l.markKill(time.Now(), []string{"a", "b", "c"})
	l.processedMsg("a", 0, "n2") // published before the kill: not yet
	if took, waiting := l.flowAgain(); len(took) != 0 || waiting != 0 {
		t.Fatalf("before any message after the kill: took %v, waiting %d", took, waiting)
	}
	l.published(0, 1)
	l.published(1, 1)
	if _, waiting := l.flowAgain(); waiting != 2 {
		t.Fatalf("waiting %d, want 2", waiting)
	}
	l.processedMsg("a", 1, "n0")
	took, waiting := l.flowAgain()
	if len(took) != 1 || took[0] <= 0 || waiting != 1 {
		t.Errorf("took %v, waiting %d; want one group flowing, one waiting", took, waiting)
	}
}
