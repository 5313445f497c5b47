package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// groupJSON is a row of 'groups --json' and the body of 'where --json'.
type groupJSON struct {
	kvbinding.Binding
	Revision uint64     `json:"revision"`
	Waiting  int        `json:"waiting"`
	Unacked  int        `json:"unacked"`
	Oldest   *time.Time `json:"oldest"`
	Held     int        `json:"held"`
	Queues   []struct {
		Node    string     `json:"node"`
		Waiting int        `json:"waiting"`
		Unacked int        `json:"unacked"`
		Oldest  *time.Time `json:"oldest"`
	} `json:"queues"`
	HeldOn []struct {
		Node      string    `json:"node"`
		Count     int       `json:"count"`
		OldestSeq uint64    `json:"oldest_seq"`
		Since     time.Time `json:"since"`
	} `json:"held_on"`
}

func groupsJSON(t *testing.T, url string, args ...string) map[string]groupJSON {
	t.Helper()
	code, stdout, stderr := runCommand(t, append([]string{"groups", "--json", "--nats", url}, args...)...)
	if code != exitOK || stderr != "" {
		t.Fatalf("groups %q: exit %d: %s", args, code, stderr)
	}
	var list []groupJSON
	if err := json.Unmarshal([]byte(stdout), &list); err != nil {
		t.Fatalf("groups %q: %v in %s", args, err, stdout)
	}
	out := make(map[string]groupJSON, len(list))
	for _, g := range list {
		if _, dup := out[g.Group]; dup {
			t.Errorf("groups %q: %q listed twice", args, g.Group)
		}
		out[g.Group] = g
	}
	return out
}

func whereJSON(t *testing.T, url, group string) groupJSON {
	t.Helper()
	code, stdout, stderr := runCommand(t, "where", "--json", "--nats", url, group)
	if code != exitOK || stderr != "" {
		t.Fatalf("where %q: exit %d: %s", group, code, stderr)
	}
	var g groupJSON
	if err := json.Unmarshal([]byte(stdout), &g); err != nil {
		t.Fatalf("where %q: %v in %s", group, err, stdout)
	}
	return g
}

// runStoppableRouter runs a router node until the returned stop is called
// (or the test ends) and waits until it routes.
func runStoppableRouter(t *testing.T, srv *natstest.Server, cfg router.Config) (stop func()) {
	t.Helper()
	r, err := router.New(srv.Connect(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("router %s: %v", cfg.Node, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("router %s did not stop", cfg.Node)
		}
	}
	t.Cleanup(stop)
	select {
	case <-r.Ready():
	case err := <-done:
		t.Fatalf("router %s stopped before it was ready: %v", cfg.Node, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("router %s not ready", cfg.Node)
	}
	return stop
}

// TestGroupsAndWhere: a group waiting on a queue nobody pulls, one
// delivered without acks, one held undecided (no LOCAL handler runs any
// more), and one released.
func TestGroupsAndWhere(t *testing.T) {
	srv := natstest.RunServer(t)
	code, _, stderr := runCommand(t, "groups", "--nats", srv.URL())
	if code != exitFailure || !strings.HasPrefix(stderr, "grouprouter: no bindings yet: is a grouprouter node running?") {
		t.Errorf("before any node: exit %d, stderr %q", code, stderr)
	}

	stopN1 := runStoppableRouter(t, srv, router.Config{
		Name: "h", Type: router.Local, Address: "jms", Timeout: time.Second, Node: "n1",
		Heartbeat: 100 * time.Millisecond, QueueMode: router.QueuePlain,
	})
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, router.QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	queued := func(n uint64) {
		t.Helper()
		natstest.Eventually(t, 30*time.Second, func() error {
			info, err := stream.Info(ctx)
			if err != nil {
				return err
			}
			if info.State.Msgs != n {
				return fmt.Errorf("%d messages on the queue, want %d", info.State.Msgs, n)
			}
			return nil
		})
	}
	for range 2 {
		publish(t, js, "jms.orders", []byte("a"), "Group-Id", "acked-not")
	}
	queued(2)
	// A consumer takes them and does not ack them.
	cons, err := js.Consumer(ctx, router.QueueStream, router.QueueConsumer("n1"))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	fetched := 0
	for range batch.Messages() {
		fetched++
	}
	if fetched != 2 {
		t.Fatalf("fetched %d messages, want 2", fetched)
	}
	for range 3 {
		publish(t, js, "jms.orders", []byte("w"), "Group-Id", "waits")
	}
	publish(t, js, "jms.orders", []byte("c"), "Group-Id", "closed", "Group-Seq", "-1")
	queued(6)
	// "closed" is released once its close marker is routed.
	natstest.Eventually(t, 30*time.Second, func() error {
		if g := groupsJSON(t, srv.URL(), "--state", "released")["closed"]; g.State != kvbinding.StateReleased {
			return fmt.Errorf("closed: %+v", g)
		}
		return nil
	})

	// Without a LOCAL handler, a new group's messages are held undecided.
	stopN1()
	runTestRouter(t, srv, router.Config{
		Name: "h", Type: router.Remote, Address: "jms", Timeout: 200 * time.Millisecond, Node: "n2",
		Heartbeat: 100 * time.Millisecond,
	})
	publish(t, js, "jms.orders", []byte("h1"), "Group-Id", "held up")
	publish(t, js, "jms.orders", []byte("h2"), "Group-Id", "held up")
	var heldUp groupJSON
	natstest.Eventually(t, 30*time.Second, func() error {
		heldUp = whereJSON(t, srv.URL(), "held up")
		if heldUp.Held != 2 {
			return fmt.Errorf("held up: %+v", heldUp)
		}
		return nil
	})
	if heldUp.State != stateUnbound || len(heldUp.HeldOn) != 1 || heldUp.HeldOn[0].Node != "n2" || heldUp.HeldOn[0].Count != 2 ||
		heldUp.HeldOn[0].OldestSeq != 7 || heldUp.HeldOn[0].Since.IsZero() || heldUp.Waiting != 0 || len(heldUp.Queues) != 0 {
		t.Errorf("where 'held up': %+v", heldUp)
	}

	t.Run("groups json", func(t *testing.T) {
		got := groupsJSON(t, srv.URL())
		// The released group is listed: its last message waits.
		if c := got["closed"]; len(got) != 4 || c.State != kvbinding.StateReleased || c.PrevNode != "n1" || c.ThroughSeq != 6 || c.Waiting != 1 {
			t.Errorf("%d groups, want acked-not, waits, held up and closed (released, its message waiting): %+v", len(got), got)
		}
		a, w, h := got["acked-not"], got["waits"], got["held up"]
		if a.State != kvbinding.StateBound || a.Node != "n1" || a.FromSeq != 1 || a.DecidedBy != "h/n1" || a.ProposedBy != "n1" ||
			a.Revision == 0 || a.DecidedAt.IsZero() || a.Waiting != 0 || a.Unacked != 2 || a.Oldest == nil || a.Held != 0 {
			t.Errorf("acked-not: %+v", a)
		}
		if w.State != kvbinding.StateBound || w.Node != "n1" || w.FromSeq != 3 || w.Waiting != 3 || w.Unacked != 0 || w.Oldest == nil || w.Held != 0 {
			t.Errorf("waits: %+v", w)
		}
		if a.Oldest != nil && w.Oldest != nil && w.Oldest.Before(*a.Oldest) {
			t.Errorf("waits' oldest %v before acked-not's %v", w.Oldest, a.Oldest)
		}
		if h.State != stateUnbound || h.Node != "" || h.Held != 2 || h.Waiting != 0 || h.Oldest != nil {
			t.Errorf("held up: %+v", h)
		}
		if all := groupsJSON(t, srv.URL(), "--state", "all"); len(all) != 4 {
			t.Errorf("--state all: %+v", all)
		}
		if got := groupsJSON(t, srv.URL(), "--state", "released"); len(got) != 1 || got["closed"].Waiting != 1 {
			t.Errorf("--state released: %+v", got)
		}
		// The released group is n1's by the message on its queue.
		if got := groupsJSON(t, srv.URL(), "--node", "n1"); len(got) != 3 || got["waits"].Waiting != 3 || got["acked-not"].Unacked != 2 || got["closed"].Waiting != 1 {
			t.Errorf("--node n1: %+v", got)
		}
		if got := groupsJSON(t, srv.URL(), "--node", "n2"); len(got) != 0 {
			t.Errorf("--node n2: %+v", got)
		}
		if got := groupsJSON(t, srv.URL(), "--state", "unbound"); len(got) != 1 || got["held up"].Held != 2 {
			t.Errorf("--state unbound: %+v", got)
		}
		if got := groupsJSON(t, srv.URL(), "--state", "bound"); len(got) != 2 {
			t.Errorf("--state bound: %+v", got)
		}
	})

	t.Run("groups table", func(t *testing.T) {
		code, stdout, stderr := runCommand(t, "groups", "--nats", srv.URL())
		if code != exitOK || stderr != "" {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
		if len(lines) != 5 || strings.Join(strings.Fields(lines[0]), " ") != "GROUP NODE STATE SINCE WAITING UNACKED OLDEST HELD HELD-BACK DECIDED-BY WHY" {
			t.Fatalf("table:\n%s", stdout)
		}
		rows := map[string][]string{}
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, `"held up"`) {
				rows["held up"] = strings.Fields(strings.TrimPrefix(l, `"held up"`))
				continue
			}
			f := strings.Fields(l)
			rows[f[0]] = f[1:]
		}
		// NODE STATE SINCE WAITING UNACKED OLDEST HELD HELD-BACK DECIDED-BY WHY...
		if r := rows["waits"]; len(r) < 10 || r[0] != "n1" || r[1] != "bound" || r[3] != "3" || r[4] != "0" || r[5] == "-" || r[6] != "0" ||
			r[7] != "0" || r[8] != "h/n1" || strings.Join(r[9:], " ") != "proposed by n1" {
			t.Errorf("waits: %q", r)
		} else if _, err := time.Parse(timeLayout, r[2]); err != nil {
			t.Errorf("waits: since %q: %v", r[2], err)
		}
		if r := rows["acked-not"]; len(r) < 8 || r[3] != "0" || r[4] != "2" {
			t.Errorf("acked-not: %q", r)
		}
		if r := rows["held up"]; strings.Join(r, " ") != "- unbound - 0 0 - 2 0 - -" {
			t.Errorf("held up: %q", r)
		}
	})

	t.Run("where", func(t *testing.T) {
		w := whereJSON(t, srv.URL(), "waits")
		if w.State != kvbinding.StateBound || w.Node != "n1" || w.Waiting != 3 || w.Unacked != 0 || w.Oldest == nil ||
			len(w.Queues) != 1 || w.Queues[0].Node != "n1" || w.Queues[0].Waiting != 3 || len(w.HeldOn) != 0 {
			t.Errorf("where waits: %+v", w)
		}
		if a := whereJSON(t, srv.URL(), "acked-not"); a.Unacked != 2 || a.Waiting != 0 {
			t.Errorf("where acked-not: %+v", a)
		}
		if n := whereJSON(t, srv.URL(), "nowhere"); n.State != stateUnbound || n.Waiting+n.Unacked+n.Held != 0 || n.Queues == nil || n.HeldOn == nil {
			t.Errorf("where nowhere: %+v", n)
		}

		code, stdout, stderr := runCommand(t, "where", "--nats", srv.URL(), "waits")
		if code != exitOK || stderr != "" {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		for _, want := range []string{"group:", "waits", "state:", "bound", "node:", "n1", "since:", "decided by:", "h/n1, from seq 3",
			"why:", "proposed by n1", "waiting:", "3", "unacked:", "0", "oldest:", "queue n1:", "3 waiting, 0 unacked, oldest", "held:"} {
			if !strings.Contains(stdout, want) {
				t.Errorf("where waits: no %q in\n%s", want, stdout)
			}
		}
		code, stdout, _ = runCommand(t, "where", "--nats", srv.URL(), "held up")
		if code != exitOK || !strings.Contains(stdout, "held on n2:") || !strings.Contains(stdout, "2 from seq 7") ||
			!slices.Contains(strings.Fields(stdout), "unbound") {
			t.Errorf("where 'held up': exit %d\n%s", code, stdout)
		}
	})
}

func TestGroupsUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"groups", "-h"}, exitOK, "Usage: grouprouter groups [flags]"},
		{[]string{"where", "-h"}, exitOK, "Usage: grouprouter where [flags] GROUP"},
		{[]string{"groups", "--state", "lost"}, exitUsage, `grouprouter groups: unknown --state "lost"`},
		{[]string{"groups", "--node", "a.b"}, exitUsage, `grouprouter groups: invalid --node: node id "a.b" has '.'`},
		{[]string{"groups", "x"}, exitUsage, `grouprouter groups: unexpected argument "x"`},
		{[]string{"where"}, exitUsage, "grouprouter where: want GROUP, got 0 arguments"},
		{[]string{"where", "a", "b"}, exitUsage, "grouprouter where: want GROUP, got 2 arguments"},
		{[]string{"where", "a\xffb"}, exitUsage, `grouprouter where: invalid GROUP "a\xffb": not valid UTF-8`},
		{[]string{"where", "--nats", "nats://127.0.0.1:1", "g"}, exitFailure, "grouprouter: cannot reach NATS at nats://127.0.0.1:1"},
		{[]string{"groups", "--group-header", "a b"}, exitUsage, `grouprouter: invalid configuration: group header "a b" is not a valid header name`},
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

// TestGroupRowJSON: a row's hand-written JSON is what encoding/json reads
// back, for every kind of record.
func TestGroupRowJSON(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 123_000_000, time.UTC)
	oldest := at.Add(time.Minute)
	for _, r := range []groupRow{
		{b: kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n2", FromSeq: 17, PrevNode: "n1", DecidedAt: at,
			DecidedBy: "h/n0", ProposedBy: "n1", Reason: "operator move", Step: kvbinding.StepDrain, Drain: []string{"n1"}, Revision: 9},
			q: queueCount{waiting: 3, unacked: 1, oldest: oldest}, held: 0},
		{b: kvbinding.Binding{Group: "Zürich \"7\" <a>", State: kvbinding.StateMoving, PrevNode: "n1", FromSeq: 2, DecidedAt: at, DecidedBy: "h/n0", Revision: 3}},
		{b: kvbinding.Binding{Group: "u"}, held: 4},
	} {
		data := append(r.appendJSON(nil), '}')
		var got groupJSON
		if err := json.Unmarshal(data, &got); err != nil {
			t.Fatalf("%v in %s", err, data)
		}
		want := groupJSON{Binding: r.b, Revision: r.b.Revision, Waiting: r.q.waiting, Unacked: r.q.unacked, Held: r.held}
		want.Binding.Revision = 0
		if r.b.State == "" {
			want.State = stateUnbound
		}
		if !r.q.oldest.IsZero() {
			want.Oldest = &oldest
		}
		if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) || (got.Oldest != nil) != (want.Oldest != nil) ||
			(got.Oldest != nil && !got.Oldest.Equal(*want.Oldest)) {
			t.Errorf("%s\n got %+v\nwant %+v", data, got, want)
		}
	}
}

func TestGroupRowWhy(t *testing.T) {
	for _, tt := range []struct {
		b    kvbinding.Binding
		node string
		want string
	}{
		{kvbinding.Binding{State: kvbinding.StateBound, Node: "n1"}, "n1", "-"},
		{kvbinding.Binding{State: kvbinding.StateBound, Node: "n2", PrevNode: "n1", ProposedBy: "n3", Step: kvbinding.StepDrain, Drain: []string{"n1", "n0"}, Reason: "node n1 gone"},
			"n2", `proposed by n3; from n1; hand-over in progress, draining n1,n0; "node n1 gone"`},
		{kvbinding.Binding{State: kvbinding.StateMoving, Node: "n2", PrevNode: "n1", Reason: "operator move"}, "n1->n2", `moving: n1 hands it over; "operator move"`},
		{kvbinding.Binding{State: kvbinding.StateMoving, PrevNode: "n1"}, "n1->-", "unbinding: n1 hands it back"},
		{kvbinding.Binding{State: kvbinding.StateReleased, PrevNode: "n1", ThroughSeq: 40, Reason: "idle"}, "-", `released by n1 after seq 40; "idle"`},
		{kvbinding.Binding{State: kvbinding.StateDeadLettered, ThroughSeq: 5}, "-", "dead-lettered through seq 5"},
	} {
		r := groupRow{b: tt.b}
		if got := r.why(); got != tt.want {
			t.Errorf("why(%+v) = %q, want %q", tt.b, got, tt.want)
		}
		if got := r.nodeColumn(); got != tt.node {
			t.Errorf("nodeColumn(%+v) = %q, want %q", tt.b, got, tt.node)
		}
	}
}
