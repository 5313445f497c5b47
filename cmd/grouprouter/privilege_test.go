package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/cmd/grouprouter/internal/ops"
	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/permissions"
	"github.com/grouprouter/grouprouter/permissions/permtest"
	"github.com/grouprouter/grouprouter/router"
)

// TestCommandsUnderLeastPrivilege runs the commands themselves, not the
// library functions under them, with the users of the generated
// permissions block: the operator lists nodes, bindings and groups, looks a
// group up, reads the events, moves the group and unbinds it; a consumer
// consumes its node's queue; no command is refused anything, and nothing
// is lost.
func TestCommandsUnderLeastPrivilege(t *testing.T) {
	layout := permissions.Layout{Address: "jms", Nodes: []string{"n0", "n1"}, Handlers: []string{"n0"}, Name: "h"}
	auth := permtest.NewAuth(t, layout)
	pass := auth.Pass
	inbox := map[string]string{}
	for name, u := range auth.Users {
		inbox[name] = u.InboxPrefix
	}
	srv := natstest.RunServerWith(t, auth.Configure)
	url := srv.URL()
	connect := func(user string) *nats.Conn {
		return natstest.Connect(t, url, nats.UserInfo(user, pass[user]), nats.CustomInboxPrefix(inbox[user]))
	}
	for _, n := range []struct {
		id  string
		typ router.HandlerType
	}{{"n0", router.Local}, {"n1", router.Remote}} {
		user := "node-" + n.id
		runTestRouterOn(t, connect(user), router.Config{
			Name: "h", Type: n.typ, Address: "jms", Timeout: time.Second, Node: n.id,
			Heartbeat: 100 * time.Millisecond, LeaseTTL: time.Second, InboxPrefix: inbox[user],
		})
	}
	// The commands' connection flags, per user (as an operator types them).
	as := func(user string, args ...string) []string {
		conn := []string{args[0], "--nats", url, "--user", user, "--password", pass[user], "--inbox-prefix", inbox[user]}
		if p := auth.Users[user].APIPrefix; p != "" {
			conn = append(conn, "--js-api-prefix", p)
		}
		return append(conn, args[1:]...)
	}
	ok := func(args []string) string {
		t.Helper()
		code, stdout, stderr := runCommand(t, args...)
		if code != exitOK {
			t.Fatalf("%s: exit %d\nstdout %s\nstderr %s", args[0], code, stdout, stderr)
		}
		if strings.Contains(stderr, "ermission") {
			t.Errorf("%s: %s", args[0], stderr)
		}
		return stdout
	}

	// Both queues have a consumer (the consume command, as consumer-nX),
	// so that both nodes are eligible and the move has somewhere to go.
	consumed := make(chan string, 64)
	for _, node := range layout.Nodes {
		go func() {
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			var errOut bytes.Buffer
			args := as("consumer-"+node, "consume", "--node", node, "--json")
			if code := runContext(ctx, args, &lineWriter{prefix: node + " ", lines: consumed}, &errOut); code != exitOK && ctx.Err() == nil {
				t.Errorf("consume %s: exit %d: %s", node, code, errOut.String())
			}
		}()
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		var got nodesJSON
		if err := json.Unmarshal([]byte(ok(as("operator", "nodes", "--json", "--name", "h"))), &got); err != nil {
			return err
		}
		with := 0
		for _, n := range got.Nodes {
			if n.HasConsumer {
				with++
			}
		}
		if with != 2 {
			return fmt.Errorf("%d nodes with a consumer", with)
		}
		return nil
	})

	producer := connect("producer")
	js, err := jetstream.New(producer)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, js, "jms.orders", []byte("first"), "Group-Id", "g")
	var bound struct {
		Node string `json:"node"`
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		out := ok(as("operator", "where", "--json", "g"))
		if err := json.Unmarshal([]byte(out), &bound); err != nil || bound.Node == "" {
			return fmt.Errorf("where g: %v %s", err, out)
		}
		return nil
	})
	for _, args := range [][]string{
		as("operator", "bindings"), as("operator", "groups", "--json"), as("operator", "events", "--kind", "bind"),
	} {
		ok(args)
	}
	other := map[string]string{"n0": "n1", "n1": "n0"}[bound.Node]
	// An observer may not move a group: the command says so and fails.
	if code, _, stderr := runCommand(t, as("observer", "move", "--timeout", "1s", "g", other)...); code == exitOK || !strings.Contains(stderr, "ermission") {
		t.Errorf("move as observer: exit %d, stderr %q; want refused for permissions", code, stderr)
	}
	ok(as("operator", "move", "--wait", "g", other))
	publish(t, js, "jms.orders", []byte("second"), "Group-Id", "g")
	ok(as("operator", "unbind", "--wait", "g"))
	publish(t, js, "jms.orders", []byte("third"), "Group-Id", "g")
	var got []string
	for len(got) < 3 {
		select {
		case line := <-consumed:
			got = append(got, line)
		case <-time.After(30 * time.Second):
			t.Fatalf("consumed %d of 3: %q", len(got), got)
		}
	}
	t.Logf("consumed: %q", got)
	for i, want := range []string{"first", "second", "third"} {
		if !strings.Contains(got[i], `"`+want+`"`) && !strings.Contains(got[i], want) {
			t.Errorf("message %d: %s, want %q", i, got[i], want)
		}
	}
}

// lineWriter sends every complete line written to it, prefixed, on lines.
type lineWriter struct {
	prefix string
	buf    []byte
	lines  chan<- string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.lines <- w.prefix + string(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
}

// TestParkingUnderLeastPrivilege runs work as its node's generated
// consumer user and the parking commands as the operator: a message the
// script refuses (exit 65) parks its group, the operator lists it, looks
// it up, skips it and retries; nothing is refused, and the group's other
// messages are processed once, in order.
func TestParkingUnderLeastPrivilege(t *testing.T) {
	layout := permissions.Layout{Address: "jms", Nodes: []string{"n0"}, Handlers: []string{"n0"}, Name: "h"}
	auth := permtest.NewAuth(t, layout)
	pass := auth.Pass
	inbox := map[string]string{}
	for name, u := range auth.Users {
		inbox[name] = u.InboxPrefix
	}
	srv := natstest.RunServerWith(t, auth.Configure)
	url := srv.URL()
	connect := func(user string) *nats.Conn {
		return natstest.Connect(t, url, nats.UserInfo(user, pass[user]), nats.CustomInboxPrefix(inbox[user]))
	}
	nodeConn := connect("node-n0")
	node := runTestRouterOn(t, nodeConn, router.Config{
		Name: "h", Type: router.Local, Address: "jms", Timeout: time.Second, Node: "n0",
		Heartbeat: 100 * time.Millisecond, LeaseTTL: time.Second, InboxPrefix: inbox["node-n0"],
	})
	as := func(user string, args ...string) []string {
		conn := []string{args[0], "--nats", url, "--user", user, "--password", pass[user], "--inbox-prefix", inbox[user]}
		if p := auth.Users[user].APIPrefix; p != "" {
			conn = append(conn, "--js-api-prefix", p)
		}
		return append(conn, args[1:]...)
	}
	ok := func(args []string) string {
		t.Helper()
		code, stdout, stderr := runCommand(t, args...)
		if code != exitOK || strings.Contains(stderr, "ermission") {
			t.Fatalf("%s: exit %d\nstdout %s\nstderr %s", args[0], code, stdout, stderr)
		}
		return stdout
	}
	dir := t.TempDir()
	script, out := dir+"/work.sh", dir+"/out"
	if err := os.WriteFile(script, []byte("body=$(cat)\n[ \"$body\" = fatal ] && exit 65\necho \"$body\" >> \""+out+"\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var workErr lockedWriter
	var errBuf bytes.Buffer
	workErr.w = &errBuf
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- runContext(ctx, as("consumer-n0", "work", "--node", "n0", "--max-attempts", "1", "--", "sh", script), &bytes.Buffer{}, &workErr)
	}()
	defer func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("work: exit %d", code)
		}
		workErr.mu.Lock()
		defer workErr.mu.Unlock()
		if strings.Contains(errBuf.String(), "ermission") || strings.Contains(errBuf.String(), "level=WARN") && !strings.Contains(errBuf.String(), "parking a group") {
			t.Errorf("work as consumer-n0 logged:\n%s", errBuf.String())
		}
	}()

	producer := connect("producer")
	js, err := jetstream.New(producer)
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"one", "fatal", "two", "three"} {
		publish(t, js, "jms.orders", []byte(body), "Group-Id", "g")
	}
	var pl struct {
		Parked []parkedJSON `json:"parked"`
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		if err := json.Unmarshal([]byte(ok(as("operator", "parked", "--json"))), &pl); err != nil {
			return err
		}
		if len(pl.Parked) != 1 || pl.Parked[0].Messages != 3 {
			return fmt.Errorf("parked %+v", pl.Parked)
		}
		return nil
	})
	// The node's status page lists the group, read with the node's own
	// rights (issue 31: it showed parked groups only as events).
	page, err := ops.New(ops.Config{Node: node, Conn: nodeConn})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(page.Handler())
	defer hs.Close()
	natstest.Eventually(t, 30*time.Second, func() error {
		resp, err := http.Get(hs.URL + "/status.json")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var v struct {
			Parked struct {
				Total  int
				Error  string
				Groups []struct{ Group, Node, Reason string }
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			return err
		}
		if p := v.Parked; p.Error != "" || p.Total != 1 || len(p.Groups) != 1 || p.Groups[0].Group != "g" || p.Groups[0].Node != "n0" ||
			!strings.Contains(p.Groups[0].Reason, "65") {
			return fmt.Errorf("node n0's status page, as node-n0: parked %+v", p)
		}
		return nil
	})
	if where := ok(as("operator", "where", "g")); !strings.Contains(where, "parked:") {
		t.Errorf("where g:\n%s", where)
	}
	ok(as("operator", "skip", "g"))
	natstest.Eventually(t, 30*time.Second, func() error {
		data, _ := os.ReadFile(out)
		if string(data) != "one\ntwo\nthree\n" {
			return fmt.Errorf("processed %q", data)
		}
		if !strings.Contains(ok(as("operator", "parked")), "(no parked group)") {
			return errors.New("still parked")
		}
		return nil
	})
	// A retry of a group not parked is an error, not a refusal.
	if code, _, stderr := runCommand(t, as("operator", "retry", "g")...); code != exitFailure || strings.Contains(stderr, "ermission") {
		t.Errorf("retry: exit %d, %s", code, stderr)
	}
	// The observer may not ask for a replay.
	if code, _, stderr := runCommand(t, as("observer", "parked")...); code == exitOK || !strings.Contains(stderr, "ermission") {
		t.Errorf("parked as observer: exit %d, %q; want refused", code, stderr)
	}
}
