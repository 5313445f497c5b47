package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// readEvents runs 'events --json' with args and decodes its lines.
func readEvents(t *testing.T, url string, args ...string) []proposals.Event {
	t.Helper()
	code, stdout, stderr := runCommand(t, append([]string{"events", "--json", "--nats", url}, args...)...)
	if code != exitOK || stderr != "" {
		t.Fatalf("events %q: exit %d, stderr %q", args, code, stderr)
	}
	var out []proposals.Event
	for _, line := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
		if line == "" {
			continue
		}
		var e proposals.Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events %q: line %q: %v", args, line, err)
		}
		out = append(out, e)
	}
	return out
}

func kindsOf(events []proposals.Event) []string {
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Kind)
	}
	return kinds
}

// TestEventsStream binds groups on a real node, moves one, and reads the
// events back from GROUPING_EVENTS.
func TestEventsStream(t *testing.T) {
	srv := natstest.RunServer(t)
	code, _, stderr := runCommand(t, "events", "--nats", srv.URL())
	if want := fmt.Sprintf("grouprouter: no events yet: is a grouprouter node running? (no stream %q at %s)\n", router.EventsStream, srv.URL()); code != exitFailure || stderr != want {
		t.Errorf("before any node: exit %d, stderr\n got %q\nwant %q", code, stderr, want)
	}

	startRouterNode(t, srv, "n1", router.Local)
	startRouterNode(t, srv, "n2", router.Remote)
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	groups := []string{"g1", "g2", "order 7"}
	for _, g := range groups {
		publish(t, js, "jms.orders", []byte("m"), "Group-Id", g)
	}
	var from string
	natstest.Eventually(t, 30*time.Second, func() error {
		b, err := bindingOf(t, srv.URL(), "g1")
		from = b.Node
		return err
	})
	to := map[string]string{"n1": "n2", "n2": "n1"}[from]
	if code, _, stderr := runCommand(t, "move", "--wait", "--nats", srv.URL(), "g1", to); code != exitOK {
		t.Fatalf("move: exit %d: %s", code, stderr)
	}

	// The stream keeps them all; the hand-over's event follows the move.
	var events []proposals.Event
	natstest.Eventually(t, 30*time.Second, func() error {
		events = readEvents(t, srv.URL())
		kinds := kindsOf(events)
		if !slices.Contains(kinds, proposals.EventHandoff) || len(kinds) < 6 {
			return fmt.Errorf("kinds %v", kinds)
		}
		return nil
	})
	ids := make(map[string]bool)
	var prev proposals.Event
	count := make(map[string]int)
	for i, e := range events {
		id, err := uuid.Parse(e.ID)
		if err != nil || id.Version() != 7 || id.String() != e.ID {
			t.Errorf("event %d %+v: id %q is not a UUIDv7 (%v)", i, e, e.ID, err)
		}
		if ids[e.ID] {
			t.Errorf("event %d %+v: id %q seen before", i, e, e.ID)
		}
		ids[e.ID] = true
		if i > 0 && e.At.Before(prev.At) {
			t.Errorf("event %d at %v before the previous one at %v", i, e.At, prev.At)
		}
		prev = e
		count[e.Kind]++
	}
	// (Both nodes may propose a group, the loser's proposal is rejected.)
	if count[proposals.EventHandlerTakeover] != 1 || count[proposals.EventBind] != 3 || count[proposals.EventMove] != 1 ||
		count[proposals.EventHandoff] != 1 || len(events) != 6+count[proposals.EventReject] {
		t.Errorf("events by kind %v, want handler 1, bind 3, move 1, handoff 1 (and rejects): %+v", count, events)
	}
	for _, e := range events {
		switch e.Kind {
		case proposals.EventBind:
			if !slices.Contains(groups, e.Group) || e.Node == "" || e.By != "h/n1" {
				t.Errorf("bind event %+v", e)
			}
		case proposals.EventMove, proposals.EventHandoff:
			if e.Group != "g1" || e.Node != to || e.PrevNode != from {
				t.Errorf("%s event %+v, want g1 %s -> %s", e.Kind, e, from, to)
			}
		}
	}

	t.Run("filters", func(t *testing.T) {
		if got := kindsOf(readEvents(t, srv.URL(), "--kind", "move")); !slices.Equal(got, []string{"move"}) {
			t.Errorf("--kind move: %v", got)
		}
		got := readEvents(t, srv.URL(), "--group", "g1")
		kinds := slices.DeleteFunc(kindsOf(got), func(k string) bool { return k == proposals.EventReject })
		if !slices.Equal(kinds, []string{"bind", "move", "handoff"}) {
			t.Errorf("--group g1: %v", kindsOf(got))
		}
		if got := readEvents(t, srv.URL(), "--group", "order 7", "--kind", "bind"); len(got) != 1 || got[0].Group != "order 7" {
			t.Errorf("--group 'order 7' --kind bind: %+v", got)
		}
		if got := readEvents(t, srv.URL(), "--since", "1h"); len(got) != len(events) {
			t.Errorf("--since 1h: %d events, want %d", len(got), len(events))
		}
		// Every event was stored before the command started.
		if got := readEvents(t, srv.URL(), "--since", "1ns"); len(got) != 0 {
			t.Errorf("--since 1ns: %+v", got)
		}
	})

	t.Run("table", func(t *testing.T) {
		code, stdout, stderr := runCommand(t, "events", "--nats", srv.URL(), "--group", "g1")
		if code != exitOK || stderr != "" {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		lines := slices.DeleteFunc(strings.Split(strings.TrimSuffix(stdout, "\n"), "\n"), func(l string) bool {
			return strings.Contains(l, "  reject  ")
		})
		if len(lines) != 4 || strings.Join(strings.Fields(lines[0]), " ") != "TIME KIND GROUP NODE DETAILS" {
			t.Fatalf("table:\n%s", stdout)
		}
		for i, want := range [][]string{
			{"bind", "g1", from, "seq=1", "by=h/n1"},
			{"move", "g1", from + "->" + to, "by=h/n1", `reason="operator move"`},
			{"handoff", "g1", from + "->" + to, "by=h/n1"},
		} {
			f := strings.Fields(lines[i+1])
			if _, err := time.Parse(timeLayout, f[0]); err != nil {
				t.Errorf("line %q: time: %v", lines[i+1], err)
			}
			for _, w := range want {
				if !slices.Contains(f[1:], w) && !strings.Contains(lines[i+1], " "+w) {
					t.Errorf("line %q has no %q", lines[i+1], w)
				}
			}
		}
	})

	t.Run("follow", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var out natstest.Buffer
		done := make(chan int, 1)
		go func() {
			var errOut bytes.Buffer
			done <- runContext(ctx, []string{"events", "--follow", "--json", "--kind", "bind", "--nats", srv.URL()}, &out, &errOut)
		}()
		publish(t, js, "jms.orders", []byte("m"), "Group-Id", "late")
		natstest.Eventually(t, 30*time.Second, func() error {
			if !strings.Contains(out.String(), `"group":"late"`) {
				return fmt.Errorf("not followed yet: %s", out.String())
			}
			return nil
		})
		if n := strings.Count(out.String(), "\n"); n != 4 {
			t.Errorf("%d lines, want the 3 earlier bind events and the new one:\n%s", n, out.String())
		}
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Errorf("exit %d after interrupt", code)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("events --follow did not stop")
		}
	})
}

func TestEventsUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"events", "-h"}, exitOK, "Usage: grouprouter events [flags]"},
		{[]string{"events", "--kind", "bogus"}, exitUsage, `grouprouter events: unknown kind "bogus" (want one of bind, reject,`},
		{[]string{"events", "--since", "-1m"}, exitUsage, "grouprouter events: --since must be > 0, got -1m0s"},
		{[]string{"events", "extra"}, exitUsage, `grouprouter events: unexpected argument "extra"`},
		{[]string{"events", "--nats", "nats://127.0.0.1:1"}, exitFailure, "grouprouter: cannot reach NATS at nats://127.0.0.1:1"},
	} {
		code, stdout, stderr := runCommand(t, tt.args...)
		got := stderr
		if tt.code == exitOK {
			got = stdout
		} else if strings.Count(stderr, "\n") != 1 || stdout != "" {
			t.Errorf("%q: stdout %q, stderr %q: want one line on stderr", tt.args, stdout, stderr)
		}
		if code != tt.code || !strings.HasPrefix(got, tt.out) {
			t.Errorf("%q: exit %d, output %q; want %d, %q", tt.args, code, got, tt.code, tt.out)
		}
	}
}

func TestAppendEventLine(t *testing.T) {
	at := time.Date(2026, 11, 30, 5, 31, 14, 314_000_000, time.UTC)
	for _, tt := range []struct {
		e    proposals.Event
		want string
	}{
		{proposals.Event{Kind: "bind", Group: "order-42", Node: "n1", FromSeq: 17, By: "h/n0", At: at},
			"2026-11-30T05:31:14.314Z  bind        order-42              n1              seq=17 by=h/n0\n"},
		{proposals.Event{Kind: "move", Group: "a b", Node: "n2", PrevNode: "n1", By: "h/n0", At: at, Reason: "operator"},
			`2026-11-30T05:31:14.314Z  move        "a b"                 n1->n2          by=h/n0 reason="operator"` + "\n"},
		{proposals.Event{Kind: "handler", By: "h/n0", At: at, Reason: "lease acquired"},
			`2026-11-30T05:31:14.314Z  handler     -                     -               by=h/n0 reason="lease acquired"` + "\n"},
		{proposals.Event{Kind: "timeout", Group: "", Node: "n3", Attempt: 2, Count: 5, At: at},
			"2026-11-30T05:31:14.314Z  timeout     (ungrouped)           n3              count=5 attempt=2\n"},
		{proposals.Event{Kind: "expire", Group: "g", PrevNode: "n1", FromSeq: 9},
			"-                         expire      g                     n1->-           seq=9\n"},
		{proposals.Event{Kind: "progress", Group: "g", Node: "n2", PrevNode: "n1", By: "n2", At: at, Step: "drain", Count: 120, Total: 400, Groups: 1},
			"2026-11-30T05:31:14.314Z  progress    g                     n1->n2          step=drain count=120 total=400 groups=1 by=n2\n"},
		{proposals.Event{Kind: "progress", Node: "n0", By: "n0", At: at, Step: "catchup", Count: 3000, Total: 3000, Groups: 66, Reason: "done"},
			`2026-11-30T05:31:14.314Z  progress    (66 groups)           n0              step=catchup count=3000 total=3000 groups=66 by=n0 reason="done"` + "\n"},
		{proposals.Event{Kind: "gap", Node: "n0", By: "n0", At: at, FromSeq: 91, Count: 10, Reason: "ingress sequences 91-100 missing"},
			`2026-11-30T05:31:14.314Z  gap         -                     n0              seq=91 count=10 by=n0 reason="ingress sequences 91-100 missing"` + "\n"},
	} {
		if got := string(appendEventLine(nil, tt.e)); got != tt.want {
			t.Errorf("%+v:\n got %q\nwant %q", tt.e, got, tt.want)
		}
	}
}
