package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

func TestBindings(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := srv.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := kvbinding.OpenStore(ctx, js, kvbinding.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2025, 3, 14, 15, 9, 26, 535_000_000, time.FixedZone("CET", 3600))
	var revs []uint64
	for _, b := range []kvbinding.Binding{
		{Group: "orders-42", State: kvbinding.StateBound, Node: "node-b", FromSeq: 17, DecidedAt: at, DecidedBy: "gh/node-a", ProposedBy: "node-b"},
		{Group: "Bestellung für Zürich 7", State: kvbinding.StateBound, Node: "node-a", FromSeq: 3, DecidedAt: at, DecidedBy: "gh/node-a"},
		{Group: "", State: kvbinding.StateBound, Node: "node-c", FromSeq: 1, DecidedAt: at, DecidedBy: "gh/node-a"},
	} {
		got, err := store.Create(ctx, b)
		if err != nil {
			t.Fatalf("create %q: %v", b.Group, err)
		}
		revs = append(revs, got.Revision)
	}
	// Ended records are listed with --all only.
	for _, b := range []kvbinding.Binding{
		{Group: "old", State: kvbinding.StateReleased, PrevNode: "node-a", ThroughSeq: 9, DecidedAt: at, DecidedBy: "node-a"},
		{Group: "dead", State: kvbinding.StateDeadLettered, ThroughSeq: 5, DecidedAt: at, DecidedBy: "node-b", Reason: "no decision"},
	} {
		if _, err := store.Create(ctx, b); err != nil {
			t.Fatalf("create %q: %v", b.Group, err)
		}
	}

	t.Run("table", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"bindings", "--nats", srv.URL()}, &stdout, &stderr); code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		want := `GROUP                      NODE    FROM-SEQ  STATE  DECIDED-AT                DECIDED-BY
(ungrouped)                node-c  1         bound  2025-03-14T14:09:26.535Z  gh/node-a
"Bestellung für Zürich 7"  node-a  3         bound  2025-03-14T14:09:26.535Z  gh/node-a
orders-42                  node-b  17        bound  2025-03-14T14:09:26.535Z  gh/node-a
`
		if got := stdout.String(); got != want {
			t.Errorf("table\n got:\n%s\nwant:\n%s", got, want)
		}
		if stderr.Len() != 0 {
			t.Errorf("stderr: %s", stderr.String())
		}
	})

	t.Run("all", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"bindings", "--all", "--nats", srv.URL()}, &stdout, &stderr); code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		want := `GROUP                      NODE    FROM-SEQ  STATE          DECIDED-AT                DECIDED-BY
(ungrouped)                node-c  1         bound          2025-03-14T14:09:26.535Z  gh/node-a
"Bestellung für Zürich 7"  node-a  3         bound          2025-03-14T14:09:26.535Z  gh/node-a
dead                       -       -         dead-lettered  2025-03-14T14:09:26.535Z  node-b
old                        -       -         released       2025-03-14T14:09:26.535Z  node-a
orders-42                  node-b  17        bound          2025-03-14T14:09:26.535Z  gh/node-a
`
		if got := stdout.String(); got != want {
			t.Errorf("table\n got:\n%s\nwant:\n%s", got, want)
		}
		stdout.Reset()
		if code := run([]string{"bindings", "--all", "--json", "--nats", srv.URL()}, &stdout, &stderr); code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		var got []kvbinding.Binding
		if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || len(got) != 5 || got[2].State != kvbinding.StateDeadLettered || got[2].ThroughSeq != 5 {
			t.Errorf("--all --json: %v: %s", err, stdout.String())
		}
	})

	t.Run("json", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"bindings", "--json", "--nats", srv.URL()}, &stdout, &stderr); code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		var got []struct {
			Group      string    `json:"group"`
			State      string    `json:"state"`
			Node       string    `json:"node"`
			FromSeq    uint64    `json:"from_seq"`
			DecidedAt  time.Time `json:"decided_at"`
			DecidedBy  string    `json:"decided_by"`
			ProposedBy string    `json:"proposed_by"`
			Revision   uint64    `json:"revision"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
			t.Fatalf("%v in %s", err, stdout.String())
		}
		if len(got) != 3 {
			t.Fatalf("%d bindings, want 3: %s", len(got), stdout.String())
		}
		wantGroups := []string{"", "Bestellung für Zürich 7", "orders-42"}
		wantRevs := []uint64{revs[2], revs[1], revs[0]}
		for i, b := range got {
			if b.Group != wantGroups[i] || b.Revision != wantRevs[i] || b.Revision == 0 || b.State != "bound" || !b.DecidedAt.Equal(at) {
				t.Errorf("binding %d = %+v, want group %q revision %d", i, b, wantGroups[i], wantRevs[i])
			}
		}
		if got[2].Node != "node-b" || got[2].FromSeq != 17 || got[2].ProposedBy != "node-b" || got[2].DecidedBy != "gh/node-a" {
			t.Errorf("orders-42 = %+v", got[2])
		}
		if !strings.Contains(stdout.String(), "für Zürich") {
			t.Errorf("UTF-8 escaped in JSON output: %s", stdout.String())
		}
	})
}

func TestBindingsEmptyBucket(t *testing.T) {
	srv := natstest.RunServer(t)
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kvbinding.OpenStore(ctx, js, kvbinding.StoreConfig{}); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"bindings", "--json", "--nats", srv.URL()}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if got := strings.TrimSpace(stdout.String()); got != "[]" {
		t.Errorf("got %q, want []", got)
	}
}

func TestBindingsNoBucket(t *testing.T) {
	srv := natstest.RunServer(t)
	var stdout, stderr bytes.Buffer
	code := run([]string{"bindings", "--nats", srv.URL()}, &stdout, &stderr)
	if code != exitFailure {
		t.Errorf("exit %d, want %d", code, exitFailure)
	}
	if got := stderr.String(); !strings.HasPrefix(got, "grouprouter: no bindings yet: is a grouprouter node running?") || strings.Count(got, "\n") != 1 {
		t.Errorf("stderr %q", got)
	}
	// Listing must not create the bucket.
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.KeyValue(ctx, kvbinding.DefaultBucket); err == nil {
		t.Error("bindings created the bucket")
	}
}

func TestBindingsCannotConnect(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"bindings", "--nats", "nats://user:secret@127.0.0.1:1"}, &stdout, &stderr)
	if code != exitFailure {
		t.Errorf("exit %d, want %d", code, exitFailure)
	}
	got := stderr.String()
	if !strings.HasPrefix(got, "grouprouter: cannot reach NATS at nats://user:xxxxx@127.0.0.1:1") || strings.Contains(got, "secret") {
		t.Errorf("stderr %q", got)
	}
}

func TestDisplayGroup(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "(ungrouped)"},
		{"orders-42", "orders-42"},
		{"ünïcödé", "ünïcödé"},
		{"a b", `"a b"`},
		{"tab\there", `"tab\there"`},
		{"bell\a", `"bell\a"`},
		{"nbsp\u00a0x", `"nbsp\u00a0x"`},
		{"(ungrouped)", `"(ungrouped)"`},
		{`"quoted"`, `"\"quoted\""`},
	}
	for _, tt := range tests {
		if got := displayGroup(tt.in); got != tt.want {
			t.Errorf("displayGroup(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// TestWriteBindingsJSONSameAsWholeArray: written an element at a time, the
// output is what encoding the whole array at once printed.
func TestWriteBindingsJSONSameAsWholeArray(t *testing.T) {
	for _, list := range [][]kvbinding.Binding{nil, {{Group: "a<b>&", Node: "n1", State: kvbinding.StateBound, FromSeq: 3, DecidedAt: time.Unix(5, 0).UTC(), Revision: 7}},
		{{Group: "a", Node: "n1", State: kvbinding.StateBound}, {Group: "b", State: kvbinding.StateMoving, Drain: []string{"n2", "n0"}}}} {
		var got, want bytes.Buffer
		if err := writeBindingsJSON(&got, list); err != nil {
			t.Fatal(err)
		}
		out := make([]bindingJSON, 0, len(list))
		for _, b := range list {
			out = append(out, bindingJSON{Binding: b, Revision: b.Revision})
		}
		enc := json.NewEncoder(&want)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		_ = enc.Encode(out)
		if got.String() != want.String() {
			t.Errorf("got\n%s\nwant\n%s", got.String(), want.String())
		}
	}
}
