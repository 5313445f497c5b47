package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/router"
)

// workScript appends "<group> <ingress seq> <body> <attempt> <fence>" to
// $OUT for each message; while $FAULT exists it fails (exit 3) on a body
// "poison", and it always exits 65 (terminal) on a body "fatal".
const workScript = `#!/bin/sh
body=$(cat)
if [ "$body" = fatal ]; then echo "cannot parse $GROUPING_INGRESS_SEQ" >&2; exit 65; fi
if [ "$body" = poison ] && [ -e "$FAULT" ]; then echo "store down" >&2; exit 3; fi
echo "$GROUPING_GROUP $GROUPING_INGRESS_SEQ $body $GROUPING_ATTEMPT $GROUPING_FENCE $GROUPING_HEADER_GROUP_ID" >> "$OUT"
`

// TestWorkParksAndRetries: work runs a shell script per message: every
// group in order; a group whose message fails is parked (after 2 runs)
// while the others flow, and one whose script exits 65 at once; parked and
// where show them; after retry (the fault removed) and skip, every
// message is processed once, in order, except the skipped one.
func TestWorkParksAndRetries(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Fatalf("no sh: %v", err)
	}
	srv := natstest.RunServer(t)
	startRouter(t, srv, router.QueuePinned)
	dir := t.TempDir()
	script, out, fault := filepath.Join(dir, "work.sh"), filepath.Join(dir, "out"), filepath.Join(dir, "fault")
	for name, body := range map[string]string{script: workScript, fault: ""} {
		if err := os.WriteFile(name, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("OUT", out)
	t.Setenv("FAULT", fault)

	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[string][]string{}
	for i := range 8 {
		for _, g := range []string{"a", "b", "bad", "term"} {
			body := g + "-" + strconv.Itoa(i)
			switch {
			case g == "bad" && i == 2:
				body = "poison"
			case g == "term" && i == 1:
				body = "fatal"
			}
			bodies[g] = append(bodies[g], body)
			publish(t, js, "jms.orders", []byte(body), "Group-Id", g)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- runContext(ctx, []string{"work", "--nats", srv.URL(), "--node", "n1", "--concurrency", "4",
			"--max-attempts", "2", "--backoff", "10ms", "--", "sh", script}, &bytes.Buffer{}, &lockedWriter{w: &stderr})
	}()
	defer func() {
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Errorf("work: exit %d", code)
			}
		case <-time.After(60 * time.Second):
			t.Error("work did not stop")
		}
	}()

	lines := func() map[string][]string {
		data, _ := os.ReadFile(out)
		got := map[string][]string{}
		for l := range strings.Lines(string(data)) {
			f := strings.Fields(l)
			if len(f) < 6 {
				continue
			}
			if f[0] != f[5] {
				t.Errorf("GROUPING_GROUP %q, header Group-Id %q", f[0], f[5])
			}
			got[f[0]] = append(got[f[0]], f[2])
		}
		return got
	}
	type parkedList struct {
		Parked []parkedJSON `json:"parked"`
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		got := lines()
		if len(got["a"]) != 8 || len(got["b"]) != 8 {
			return fmt.Errorf("a %d, b %d of 8", len(got["a"]), len(got["b"]))
		}
		code, stdout, stderr := runCommand(t, "parked", "--nats", srv.URL(), "--json")
		if code != exitOK {
			return fmt.Errorf("parked: exit %d %s", code, stderr)
		}
		var pl parkedList
		if err := json.Unmarshal([]byte(stdout), &pl); err != nil {
			return err
		}
		if len(pl.Parked) != 2 || pl.Parked[0].Messages != 6 || pl.Parked[1].Messages != 7 {
			return fmt.Errorf("parked %+v", pl.Parked)
		}
		return nil
	})
	_, stdout, _ := runCommand(t, "parked", "--nats", srv.URL(), "--json")
	var pl parkedList
	_ = json.Unmarshal([]byte(stdout), &pl)
	bad, term := pl.Parked[0], pl.Parked[1]
	if bad.Group != "bad" || bad.Attempts != 2 || bad.Node != "n1" || !strings.Contains(bad.Reason, "store down") || bad.Head != bad.FirstSeq {
		t.Errorf("parked bad: %+v", bad)
	}
	if term.Group != "term" || term.Attempts != 1 || !strings.Contains(term.Reason, "cannot parse") {
		t.Errorf("parked term: %+v (exit 65 parks at once)", term)
	}
	if got := lines(); !slices.Equal(got["bad"], bodies["bad"][:2]) || !slices.Equal(got["term"], bodies["term"][:1]) {
		t.Errorf("before retry: bad %v, term %v", got["bad"], got["term"])
	}
	code, stdout, stderrOut := runCommand(t, "parked", "--nats", srv.URL())
	if code != exitOK || !strings.Contains(stdout, "bad") || !strings.Contains(stdout, "store down") {
		t.Errorf("parked: exit %d\n%s%s", code, stdout, stderrOut)
	}
	t.Logf("grouprouter parked:\n%s", stdout)
	code, stdout, _ = runCommand(t, "where", "--nats", srv.URL(), "bad")
	if code != exitOK || !strings.Contains(stdout, "parked:") || !strings.Contains(stdout, "store down") {
		t.Errorf("where bad: exit %d\n%s", code, stdout)
	}
	t.Logf("grouprouter where bad:\n%s", stdout)

	// Later messages of a parked group follow it.
	publish(t, js, "jms.orders", []byte("bad-8"), "Group-Id", "bad")
	bodies["bad"] = append(bodies["bad"], "bad-8")

	if err := os.Remove(fault); err != nil {
		t.Fatal(err)
	}
	// bad-2 .. bad-8 parked (7), before retry counts them.
	natstest.Eventually(t, 30*time.Second, func() error {
		_, stdout, _ := runCommand(t, "parked", "--nats", srv.URL(), "--json")
		var pl parkedList
		if err := json.Unmarshal([]byte(stdout), &pl); err != nil {
			return err
		}
		if len(pl.Parked) == 0 || pl.Parked[0].Group != "bad" || pl.Parked[0].Messages != 7 {
			return fmt.Errorf("parked %+v, want bad with 7 messages", pl.Parked)
		}
		return nil
	})
	wantRetry := fmt.Sprintf("retry bad: node n1 replays 7 parked message(s) from ingress seq %d\n", bad.FirstSeq)
	if code, stdout, stderr := runCommand(t, "retry", "--nats", srv.URL(), "bad"); code != exitOK || stdout != wantRetry {
		t.Fatalf("retry: exit %d %q %s; want %q", code, stdout, stderr, wantRetry)
	}
	code, stdout, stderrOut = runCommand(t, "skip", "--nats", srv.URL(), "term")
	wantSkip := fmt.Sprintf("skip term: node n1 drops the parked message at ingress seq %d unhandled, then replays the 6 after it\n", term.FirstSeq)
	if code != exitOK || !strings.Contains(stderrOut, "ingress_seq="+strconv.FormatUint(term.FirstSeq, 10)) || stdout != wantSkip {
		t.Fatalf("skip: exit %d %q %s; want %q", code, stdout, stderrOut, wantSkip)
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		got := lines()
		if len(got["bad"]) < len(bodies["bad"]) || len(got["term"]) < 7 {
			return fmt.Errorf("bad %d, term %d", len(got["bad"]), len(got["term"]))
		}
		if _, stdout, _ := runCommand(t, "parked", "--nats", srv.URL()); !strings.Contains(stdout, "(no parked group)") {
			return fmt.Errorf("still parked:\n%s", stdout)
		}
		return nil
	})
	got := lines()
	wantTerm := slices.Delete(slices.Clone(bodies["term"]), 1, 2)
	for g, want := range map[string][]string{"a": bodies["a"], "b": bodies["b"], "bad": bodies["bad"], "term": wantTerm} {
		if !slices.Equal(got[g], want) {
			t.Errorf("group %s processed %v, want %v once each, in order", g, got[g], want)
		}
	}
	if code, _, stderr := runCommand(t, "retry", "--nats", srv.URL(), "bad"); code != exitFailure || !strings.Contains(stderr, "not parked") {
		t.Errorf("retry of a group not parked: exit %d %s", code, stderr)
	}
}

func TestParseWorkArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		node    string
		argv    []string
		wantErr string
	}{
		{"defaults", []string{"--", "sh", "-c", "true"}, "web-1", []string{"sh", "-c", "true"}, ""},
		{"flags", []string{"--node", "n2", "--concurrency", "8", "--max-attempts", "1", "--", "./apply"}, "n2", []string{"./apply"}, ""},
		{"no command", []string{"--node", "n2"}, "", nil, "want -- CMD"},
		{"zero concurrency", []string{"--concurrency", "0", "--", "x"}, "", nil, "--concurrency must be >= 1"},
		{"zero attempts", []string{"--max-attempts", "0", "--", "x"}, "", nil, "--max-attempts must be >= 1"},
		{"bad timeout", []string{"--timeout", "0s", "--", "x"}, "", nil, "must be > 0"},
		{"bad node", []string{"--node", "a.b", "--", "x"}, "", nil, "node"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, _, err := parseCommand("work", tt.args, testEnv("web-1"))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o := a.(*workOptions); o.node != tt.node || !slices.Equal(o.argv, tt.argv) {
				t.Fatalf("got %+v", o)
			}
		})
	}
}

func TestWorkEnv(t *testing.T) {
	m := &consumer.Message{Subject: "jms.orders", Group: "g 1", IngressSeq: 42, Epoch: 7, Attempt: 2, Redelivered: true,
		Fence: consumer.Fence{Epoch: 7, IngressSeq: 42}, Header: nats.Header{"Group-Id": {"g 1"}, "x-trace.id": {"a", "b"}}}
	env := workEnv("n1", m)
	for _, want := range []string{"GROUPING_NODE=n1", "GROUPING_SUBJECT=jms.orders", "GROUPING_GROUP=g 1", "GROUPING_INGRESS_SEQ=42",
		"GROUPING_EPOCH=7", "GROUPING_FENCE=" + m.Fence.String(), "GROUPING_ATTEMPT=2", "GROUPING_REDELIVERED=true",
		"GROUPING_REPLAYED=false", "GROUPING_HEADER_GROUP_ID=g 1", "GROUPING_HEADER_X_TRACE_ID=a,b"} {
		if !slices.Contains(env, want) {
			t.Errorf("environment lacks %q: %q", want, env)
		}
	}
}

// TestWorkStartLine: work says on stderr that it starts, with its node,
// concurrency, command and the node's queue mode.
func TestWorkStartLine(t *testing.T) {
	for _, mode := range []router.QueueMode{router.QueuePinned, router.QueuePlain} {
		t.Run(string(mode), func(t *testing.T) {
			srv := natstest.RunServer(t)
			startRouter(t, srv, mode)
			stderr, stop := startCommand(t, "work", "--nats", srv.URL(), "--node", "n1", "--concurrency", "3", "--", "sh", "-c", "cat >/dev/null")
			want := `level=INFO msg="grouprouter work starting" node=n1 concurrency=3 max_attempts=` + strconv.Itoa(consumer.DefaultMaxAttempts) +
				` timeout=1m0s queue_mode=` + string(mode) + ` command="sh -c cat >/dev/null" version=`
			natstest.Eventually(t, 10*time.Second, func() error {
				if !strings.Contains(stderr.String(), want) {
					return fmt.Errorf("no start line %q:\n%s", want, stderr)
				}
				return nil
			})
			if code := stop(); code != exitOK {
				t.Errorf("work: exit %d\n%s", code, stderr)
			}
			if n := strings.Count(stderr.String(), "grouprouter work starting"); n != 1 {
				t.Errorf("%d start lines:\n%s", n, stderr)
			}
		})
	}
}

func TestReplayLine(t *testing.T) {
	rec := func(first, skip uint64) consumer.ParkRecord {
		return consumer.ParkRecord{Node: "n1", IngressSeq: first, SkipSeq: skip}
	}
	for _, tt := range []struct {
		cmd  string
		pg   consumer.ParkedGroup
		want string
	}{
		{"retry", consumer.ParkedGroup{Record: rec(11, 0), Messages: 10, Head: 11}, "retry g: node n1 replays 10 parked message(s) from ingress seq 11"},
		{"release", consumer.ParkedGroup{Record: rec(11, 0), Messages: 1, Head: 11}, "release g: node n1 replays 1 parked message(s) from ingress seq 11"},
		{"skip", consumer.ParkedGroup{Record: rec(11, 11), Messages: 7, Head: 11},
			"skip g: node n1 drops the parked message at ingress seq 11 unhandled, then replays the 6 after it"},
		{"skip", consumer.ParkedGroup{Record: rec(11, 12), Messages: 2, Head: 12},
			"skip g: node n1 drops the parked messages up to ingress seq 12 unhandled (with an earlier skip not yet done), then replays the rest: 2 parked in all"},
		{"retry", consumer.ParkedGroup{Record: rec(11, 11), Messages: 3, Head: 12},
			"retry g: node n1 drops the parked messages up to ingress seq 11 unhandled (a skip not yet done), then replays the rest from ingress seq 12: 3 parked in all"},
		{"retry", consumer.ParkedGroup{Record: rec(20, 11), Messages: 3, Head: 20}, "retry g: node n1 replays 3 parked message(s) from ingress seq 20"},
	} {
		if got := replayLine(tt.cmd, "g", tt.pg); got != tt.want {
			t.Errorf("%s %+v:\n got %q\nwant %q", tt.cmd, tt.pg, got, tt.want)
		}
	}
}

// TestWorkStartedBeforeItsNode: work started before the node's router
// (before its queue consumer exists) does not exit: it says once that it
// waits, then runs the script for every message, each group in order.
func TestWorkStartedBeforeItsNode(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Fatalf("no sh: %v", err)
	}
	srv := natstest.RunServer(t)
	dir := t.TempDir()
	script, out := filepath.Join(dir, "work.sh"), filepath.Join(dir, "out")
	if err := os.WriteFile(script, []byte(workScript), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OUT", out)
	t.Setenv("FAULT", filepath.Join(dir, "no-fault"))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	stderr := &natstest.Buffer{}
	go func() {
		done <- runContext(ctx, []string{"work", "--nats", srv.URL(), "--node", "n1", "--concurrency", "4", "--", "sh", script},
			&bytes.Buffer{}, stderr)
	}()
	defer func() {
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Errorf("work: exit %d, stderr %q", code, stderr.String())
			}
		case <-time.After(60 * time.Second):
			t.Error("work did not stop")
		}
	}()
	natstest.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(stderr.String(), "waiting for the node's queue consumer") {
			return natstest.ErrNotYet
		}
		return nil
	})
	t.Logf("work, before the node's router: %s", stderr.String())
	startRouter(t, srv, router.QueuePinned)
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	for i := range 10 {
		for _, g := range []string{"a", "b", "c"} {
			body := g + "-" + strconv.Itoa(i)
			want[g] = append(want[g], body)
			publish(t, js, "jms.orders", []byte(body), "Group-Id", g)
		}
	}
	got := map[string][]string{}
	natstest.Eventually(t, 30*time.Second, func() error {
		data, _ := os.ReadFile(out)
		got = map[string][]string{}
		n := 0
		for l := range strings.Lines(string(data)) {
			if f := strings.Fields(l); len(f) >= 3 {
				got[f[0]] = append(got[f[0]], f[2])
				n++
			}
		}
		if n < 30 {
			return fmt.Errorf("%d of 30 processed", n)
		}
		return nil
	})
	for g, w := range want {
		if !slices.Equal(got[g], w) {
			t.Errorf("group %s processed %v, want %v", g, got[g], w)
		}
	}
	if n := strings.Count(stderr.String(), "waiting for the node's queue consumer"); n != 1 {
		t.Errorf("work said %d times that it waits, want once; stderr:\n%s", n, stderr.String())
	}
}
