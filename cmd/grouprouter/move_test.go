package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

func TestMoveUsage(t *testing.T) {
	const nowhere = "nats://127.0.0.1:1" // a connection attempt would fail with exit 1
	for _, tt := range []struct {
		args []string
		code int
		out  string // on stdout for 0, else the whole stderr line
	}{
		{[]string{"move", "-h"}, exitOK, "Usage: grouprouter move [flags] GROUP NODE"},
		{[]string{"unbind", "--help"}, exitOK, "Usage: grouprouter unbind [flags] GROUP"},
		{[]string{"move", "--nats", nowhere}, exitUsage,
			"grouprouter move: want GROUP NODE, got 0 arguments (see 'grouprouter move -h')"},
		{[]string{"move", "--nats", nowhere, "g"}, exitUsage,
			"grouprouter move: want GROUP NODE, got 1 argument (see 'grouprouter move -h')"},
		{[]string{"move", "--nats", nowhere, "g", "n1", "n2"}, exitUsage,
			"grouprouter move: want GROUP NODE, got 3 arguments (see 'grouprouter move -h')"},
		{[]string{"move", "--nats", nowhere, "g", "n1", "--wait"}, exitUsage,
			"grouprouter move: flag --wait must come before GROUP NODE (see 'grouprouter move -h')"},
		{[]string{"unbind", "--nats", nowhere}, exitUsage,
			"grouprouter unbind: want GROUP, got 0 arguments (see 'grouprouter unbind -h')"},
		{[]string{"unbind", "--nats", nowhere, "g", "n1"}, exitUsage,
			"grouprouter unbind: want GROUP, got 2 arguments (see 'grouprouter unbind -h')"},
		{[]string{"unbind", "--nats", nowhere, "g", "--timeout=1s"}, exitUsage,
			"grouprouter unbind: flag --timeout=1s must come before GROUP (see 'grouprouter unbind -h')"},
		{[]string{"move", "--nats", nowhere, "g", "a.b"}, exitUsage,
			`grouprouter move: invalid NODE: node id "a.b" has '.': only letters, digits, '-' and '_' are allowed (see 'grouprouter move -h')`},
		{[]string{"move", "--nats", nowhere, "", "n1"}, exitUsage,
			`grouprouter move: invalid GROUP "": empty (see 'grouprouter move -h')`},
		{[]string{"unbind", "--nats", nowhere, "a\xffb"}, exitUsage,
			`grouprouter unbind: invalid GROUP "a\xffb": not valid UTF-8 (see 'grouprouter unbind -h')`},
		{[]string{"unbind", "--nats", nowhere, strings.Repeat("x", kvbinding.MaxGroupIDLen+1)}, exitUsage,
			"bytes, at most 1024 allowed (see 'grouprouter unbind -h')"},
		{[]string{"move", "--bogus", "g", "n1"}, exitUsage,
			"grouprouter move: flag provided but not defined: -bogus (see 'grouprouter move -h')"},
		{[]string{"move", "--timeout", "soon", "g", "n1"}, exitUsage,
			`grouprouter move: invalid value "soon" for flag -timeout: want a duration like 5s or a number of milliseconds like 5000 (see 'grouprouter move -h')`},
		{[]string{"move", "--nats", nowhere, "--timeout", "0", "g", "n1"}, exitUsage,
			"grouprouter: invalid configuration: --timeout must be > 0, got 0s"},
		{[]string{"unbind", "--nats", " ", "g"}, exitUsage,
			"grouprouter: invalid configuration: --nats is empty"},
		{[]string{"move", "--nats", nowhere, "g", "n1"}, exitFailure,
			"grouprouter: cannot reach NATS at " + nowhere},
	} {
		code, stdout, stderr := runCommand(t, tt.args...)
		if code != tt.code {
			t.Errorf("%q: exit %d, want %d (stderr %q)", tt.args, code, tt.code, stderr)
		}
		if tt.code == exitOK {
			if !strings.Contains(stdout, tt.out) || stderr != "" {
				t.Errorf("%q: stdout %q does not contain %q, or stderr %q", tt.args, stdout, tt.out, stderr)
			}
			continue
		}
		if stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.out) {
			t.Errorf("%q: stdout %q, stderr\n got %q\nwant one line with %q", tt.args, stdout, stderr, tt.out)
		}
	}
}

func TestMoveNoHandler(t *testing.T) {
	srv := natstest.RunServer(t)
	for _, args := range [][]string{
		{"move", "--nats", srv.URL(), "g", "n1"},
		{"unbind", "--nats", srv.URL(), "--wait", "g"},
	} {
		code, stdout, stderr := runCommand(t, args...)
		want := fmt.Sprintf("grouprouter: %s \"g\": no LOCAL grouping handler is answering at %s: is a LOCAL node running?\n", args[0], srv.URL())
		if code != exitFailure || stdout != "" || stderr != want {
			t.Errorf("%q: exit %d, stdout %q, stderr\n got %q\nwant %q", args, code, stdout, stderr, want)
		}
	}
}

// startRouterNode runs a router node in-process until the test ends and
// waits until it routes. All nodes share handler name "h" and address jms.
func startRouterNode(t *testing.T, srv *natstest.Server, node string, typ router.HandlerType) {
	t.Helper()
	runTestRouter(t, srv, router.Config{
		Name: "h", Type: typ, Address: "jms", Timeout: time.Second, Node: node,
		Heartbeat: 100 * time.Millisecond, LeaseTTL: time.Second,
		// Off: these tests count the moves they make themselves (a
		// rebalancing move of a group bound before the second node
		// announced itself made TestEventsStream see two).
		Rebalance: &proposals.RebalanceConfig{},
	})
}

// startQueueConsumer pulls node's queue with the priority group and acks
// every message, until the test ends.
func startQueueConsumer(t *testing.T, srv *natstest.Server, node string) {
	t.Helper()
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, router.QueueStream, router.QueueConsumer(node))
	if err != nil {
		t.Fatalf("consumer of %s: %v", node, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { _ = m.Ack() },
		jetstream.PullPriorityGroup(router.PriorityGroup), jetstream.PullExpiry(2*time.Second))
	if err != nil {
		t.Fatalf("consume %s: %v", node, err)
	}
	t.Cleanup(cc.Stop)
}

// bindingOf returns the group's record as 'bindings --json' lists it, or
// an error while it is not bound with the hand-over done.
func bindingOf(t *testing.T, url, group string) (kvbinding.Binding, error) {
	t.Helper()
	code, stdout, stderr := runCommand(t, "bindings", "--json", "--nats", url)
	if code != exitOK {
		return kvbinding.Binding{}, fmt.Errorf("bindings: exit %d: %s", code, stderr)
	}
	var list []kvbinding.Binding
	if err := json.Unmarshal([]byte(stdout), &list); err != nil {
		t.Fatalf("bindings --json: %v in %s", err, stdout)
	}
	for _, b := range list {
		if b.Group == group {
			if !b.Settled() {
				return b, fmt.Errorf("%q is %s (step %q)", group, b.State, b.Step)
			}
			return b, nil
		}
	}
	return kvbinding.Binding{}, fmt.Errorf("%q not bound yet", group)
}

func TestMove(t *testing.T) {
	srv := natstest.RunServer(t)
	url := srv.URL()
	startRouterNode(t, srv, "n0", router.Local)
	startRouterNode(t, srv, "n1", router.Remote)
	startQueueConsumer(t, srv, "n0")
	startQueueConsumer(t, srv, "n1")

	// Both nodes are eligible once they announce a consumer.
	natstest.Eventually(t, 30*time.Second, func() error {
		code, stdout, stderr := runCommand(t, "nodes", "--json", "--nats", url, "--name", "h")
		if code != exitOK {
			return fmt.Errorf("nodes: exit %d: %s", code, stderr)
		}
		var got nodesJSON
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatalf("nodes --json: %v in %s", err, stdout)
		}
		withConsumer := 0
		for _, n := range got.Nodes {
			if n.HasConsumer {
				withConsumer++
			}
		}
		if withConsumer != 2 || got.Handler == nil || got.Handler.Holder != "h/n0" {
			return fmt.Errorf("not both nodes with a consumer and n0 handling yet:\n%s", stdout)
		}
		return nil
	})

	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	const spaced = "order 42.eu/ü" // taken verbatim
	publish(t, js, "jms.orders", []byte("first"), "Group-Id", "g")
	publish(t, js, "jms.orders", []byte("second"), "Group-Id", spaced)
	var bound kvbinding.Binding
	natstest.Eventually(t, 30*time.Second, func() (err error) {
		if _, err := bindingOf(t, url, spaced); err != nil {
			return err
		}
		bound, err = bindingOf(t, url, "g")
		return err
	})
	other := map[string]string{"n0": "n1", "n1": "n0"}[bound.Node]
	if other == "" {
		t.Fatalf("g bound to %q", bound.Node)
	}

	// move --wait: done once the other node has taken the group over. The
	// handler may not have seen both consumers yet: retry while it says so.
	var code int
	var stdout, stderr string
	natstest.Eventually(t, 30*time.Second, func() error {
		code, stdout, stderr = runCommand(t, "move", "--wait", "--json", "--nats", url, "g", other)
		if code == exitFailure && strings.Contains(stderr, "has no queue consumer") {
			return errors.New(stderr)
		}
		return nil
	})
	if code != exitOK || stderr != "" {
		t.Fatalf("move --wait: exit %d, stderr %q, stdout %s", code, stderr, stdout)
	}
	var moved struct {
		kvbinding.Binding
		Revision uint64 `json:"revision"`
	}
	if err := json.Unmarshal([]byte(stdout), &moved); err != nil {
		t.Fatalf("move --json: %v in %s", err, stdout)
	}
	if moved.Group != "g" || !moved.Settled() || moved.Node != other || moved.Revision <= bound.Revision {
		t.Errorf("final record %+v", moved)
	}
	if b, err := bindingOf(t, url, "g"); err != nil || b.Node != other {
		t.Errorf("bindings after the move: %+v, %v", b, err)
	}

	// Moving it where it is: nothing to do.
	code, stdout, stderr = runCommand(t, "move", "--nats", url, "g", other)
	if code != exitOK || !strings.Contains(stdout, fmt.Sprintf("Group \"g\" is bound to %s already: nothing to move.", other)) {
		t.Errorf("move to the same node: exit %d, stderr %q, stdout %s", code, stderr, stdout)
	}

	// Without --wait: the moving record, and what happens next.
	code, stdout, stderr = runCommand(t, "move", "--nats", url, "g", bound.Node)
	if code != exitOK || stderr != "" {
		t.Fatalf("move: exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{
		"GROUP", "moving",
		fmt.Sprintf("Group \"g\" is moving from %s to %s: %s hands it over with its waiting messages, in order.", other, bound.Node, other),
		"'grouprouter bindings' shows when it is done",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("move output lacks %q:\n%s", want, stdout)
		}
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		b, err := bindingOf(t, url, "g")
		if err == nil && b.Node != bound.Node {
			return fmt.Errorf("g bound to %s", b.Node)
		}
		return err
	})

	// Refusals: exit 1, one line.
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"move", "--nats", url, "nope", "n1"}, `grouprouter: move "nope": group is not bound`},
		{[]string{"unbind", "--nats", url, "nope"}, `grouprouter: unbind "nope": group is not bound`},
		{[]string{"move", "--nats", url, "g", "n9"}, `grouprouter: move "g": node n9 is not alive`},
	} {
		code, stdout, stderr := runCommand(t, tt.args...)
		if code != exitFailure || stdout != "" || stderr != tt.want+"\n" {
			t.Errorf("%q: exit %d, stdout %q, stderr\n got %q\nwant %q", tt.args, code, stdout, stderr, tt.want+"\n")
		}
	}

	// unbind --wait: done once the node has released the group.
	code, stdout, stderr = runCommand(t, "unbind", "--wait", "--nats", url, "g")
	if code != exitOK || stderr != "" || !strings.Contains(stdout, `Group "g" is released: the unbind is done`) {
		t.Errorf("unbind --wait: exit %d, stderr %q, stdout:\n%s", code, stderr, stdout)
	}
	code, stdout, stderr = runCommand(t, "unbind", "--wait", "--json", "--nats", url, "--", spaced)
	if code != exitOK || stderr != "" {
		t.Fatalf("unbind --wait %q: exit %d, stderr %q", spaced, code, stderr)
	}
	var released kvbinding.Binding
	if err := json.Unmarshal([]byte(stdout), &released); err != nil {
		t.Fatalf("unbind --json: %v in %s", err, stdout)
	}
	if released.Group != spaced || released.State != kvbinding.StateReleased {
		t.Errorf("unbind %q: final record %+v", spaced, released)
	}
}
