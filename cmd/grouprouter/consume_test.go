package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/router"
	"github.com/grouprouter/grouprouter/router/routertest"
)

// startRouter runs a LOCAL router node n1 on address jms in-process until
// the test ends and waits until it routes.
func startRouter(t *testing.T, srv *natstest.Server, mode router.QueueMode) *router.Router {
	t.Helper()
	return runTestRouter(t, srv, router.Config{
		Name: "h", Type: router.Local, Address: "jms", Timeout: time.Second,
		Node: "n1", Heartbeat: 100 * time.Millisecond, QueueMode: mode,
	})
}

// runTestRouter runs a router node with cfg in-process until the test ends
// and waits until it routes.
func runTestRouter(t *testing.T, srv *natstest.Server, cfg router.Config) *router.Router {
	t.Helper()
	return runTestRouterOn(t, srv.Connect(), cfg)
}

// runTestRouterOn is runTestRouter on connection nc.
func runTestRouterOn(t *testing.T, nc *nats.Conn, cfg router.Config) *router.Router {
	t.Helper()
	r, done := routertest.Launch(t, nc, cfg)
	routertest.WaitReady(t, r, done)
	return r
}

// publish publishes body on subject through JetStream with the given
// headers (name, value pairs).
func publish(t *testing.T, js jetstream.JetStream, subject string, body []byte, hdr ...string) {
	t.Helper()
	msg := nats.NewMsg(subject)
	msg.Data = body
	for i := 0; i+1 < len(hdr); i += 2 {
		msg.Header.Set(hdr[i], hdr[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
}

// runCommand runs the command line with a deadline and returns its exit
// code and output.
func runCommand(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code = runContext(ctx, args, &out, &errOut)
	if ctx.Err() != nil {
		t.Fatalf("%v did not finish: stdout %q stderr %q", args, out.String(), errOut.String())
	}
	return code, out.String(), errOut.String()
}

// queueConsumerInfo returns the info of n1's queue consumer.
func queueConsumerInfo(t *testing.T, js jetstream.JetStream) *jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, router.QueueStream, router.QueueConsumer("n1"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestConsume(t *testing.T) {
	for _, mode := range []router.QueueMode{router.QueuePinned, router.QueuePlain} {
		t.Run(string(mode), func(t *testing.T) {
			srv := natstest.RunServer(t)
			startRouter(t, srv, mode)
			js, err := jetstream.New(srv.Connect())
			if err != nil {
				t.Fatal(err)
			}
			if groups := queueConsumerInfo(t, js).Config.PriorityGroups; (mode == router.QueuePinned) != (len(groups) > 0) {
				t.Fatalf("queue mode %s made a consumer with priority groups %v", mode, groups)
			}

			for _, body := range []string{"order 1", "order 2", "order 3"} {
				publish(t, js, "jms.orders", []byte(body), "Group-Id", "g1")
			}
			code, stdout, stderr := runCommand(t, "consume", "--nats", srv.URL(), "--node", "n1", "--count", "3")
			if code != exitOK {
				t.Fatalf("exit %d; stderr: %s", code, stderr)
			}
			want := "1 g1 jms.orders order 1\n2 g1 jms.orders order 2\n3 g1 jms.orders order 3\n"
			if stdout != want {
				t.Errorf("stdout\n got %q\nwant %q", stdout, want)
			}
			if stderr != "" {
				t.Errorf("stderr: %s", stderr)
			}
			if info := queueConsumerInfo(t, js); info.NumAckPending != 0 || info.NumPending != 0 {
				t.Errorf("after consume: %d awaiting ack, %d pending; want all acknowledged", info.NumAckPending, info.NumPending)
			}

			// --json, a body that is not UTF-8, a message without a group,
			// --no-ack. A second consume right after the first also shows that
			// the first one left no pin behind.
			publish(t, js, "jms.orders.eu", []byte{0xff, 0x00, 'x'}, "Group-Id", "g1", "Trace", "t-1")
			natstest.Eventually(t, 30*time.Second, func() error {
				if info := queueConsumerInfo(t, js); info.NumPending < 1 {
					return natstest.ErrNotYet
				}
				return nil
			})
			publish(t, js, "jms.audit", []byte("line one\nline two"))
			start := time.Now()
			code, stdout, stderr = runCommand(t, "consume", "--nats", srv.URL(), "--node", "n1", "--count", "2", "--json", "--no-ack")
			if code != exitOK {
				t.Fatalf("exit %d; stderr: %s", code, stderr)
			}
			if d := time.Since(start); d > 4*time.Second {
				t.Errorf("second consume took %v: was the first one's pin released?", d)
			}
			lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
			if len(lines) != 2 {
				t.Fatalf("want 2 JSON lines, got %q", stdout)
			}
			type line struct {
				Subject      string              `json:"subject"`
				QueueSubject string              `json:"queue_subject"`
				Group        *string             `json:"group"`
				IngressSeq   *uint64             `json:"ingress_seq"`
				Headers      map[string][]string `json:"headers"`
				Body         *string             `json:"body"`
				BodyBase64   *string             `json:"body_base64"`
			}
			var got [2]line
			for i, l := range lines {
				if err := json.Unmarshal([]byte(l), &got[i]); err != nil {
					t.Fatalf("line %d %q: %v", i, l, err)
				}
			}
			bin := got[0]
			if bin.Subject != "jms.orders.eu" || bin.QueueSubject != "grouping.queue.n1.jms.orders.eu" ||
				bin.Group == nil || *bin.Group != "g1" || bin.IngressSeq == nil || *bin.IngressSeq != 4 {
				t.Errorf("first line %s", lines[0])
			}
			if bin.Body != nil || bin.BodyBase64 == nil || *bin.BodyBase64 != base64.StdEncoding.EncodeToString([]byte{0xff, 0x00, 'x'}) {
				t.Errorf("binary body not in body_base64: %s", lines[0])
			}
			if bin.Headers["Trace"][0] != "t-1" || bin.Headers[router.HeaderIngressSeq][0] != "4" || bin.Headers[pinIDHeader] != nil {
				t.Errorf("headers %v", bin.Headers)
			}
			text := got[1]
			if text.Subject != "jms.audit" || text.Group != nil || text.IngressSeq == nil || *text.IngressSeq != 5 ||
				text.Body == nil || *text.Body != "line one\nline two" || text.BodyBase64 != nil {
				t.Errorf("second line %s", lines[1])
			}
			if info := queueConsumerInfo(t, js); info.NumAckPending != 2 {
				t.Errorf("--no-ack: %d messages await their ack, want 2", info.NumAckPending)
			}
		})
	}
}

// TestConsumeStartedBeforeItsNode: consume started before the node's
// router (in a compose file or a unit, both start together) says once
// that it waits, and prints the node's first message once the router
// runs; with no router for its node it waits until interrupted (exit 0).
func TestConsumeStartedBeforeItsNode(t *testing.T) {
	srv := natstest.RunServer(t)
	waiting := func(node string) string {
		return "grouprouter consume: node " + node + " has no queue consumer yet: waiting for its router to create it (consumer " +
			router.QueueConsumer(node) + " on stream GROUPING_QUEUE at " + srv.URL() + ")\n"
	}
	out, errOut := &natstest.Buffer{}, &natstest.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- runContext(context.Background(), []string{"consume", "--nats", srv.URL(), "--node", "n1", "--count", "1"}, out, errOut)
	}()
	natstest.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(errOut.String(), waiting("n1")) {
			return natstest.ErrNotYet
		}
		return nil
	})
	time.Sleep(600 * time.Millisecond) // a few of its looks
	select {
	case code := <-done:
		t.Fatalf("consume exited %d before the node ran: %q", code, errOut.String())
	default:
	}
	startRouter(t, srv, router.QueuePinned)
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	publish(t, js, "jms.orders", []byte("hello"), "Group-Id", "g")
	select {
	case code := <-done:
		if code != exitOK || out.String() != "1 g jms.orders hello\n" || errOut.String() != waiting("n1") {
			t.Errorf("exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("consume did not print the message: stderr %q", errOut.String())
	}

	// A node whose router never runs: it waits until interrupted.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if code := runContext(ctx, []string{"consume", "--nats", srv.URL(), "--node", "n9"}, &stdout, &stderr); code != exitOK || stdout.Len() > 0 || stderr.String() != waiting("n9") {
		t.Errorf("consume of a node without a router, interrupted: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
}

// TestConsumeInterrupted: with --count 0 consume runs until its context
// ends, and exits 0.
func TestConsumeInterrupted(t *testing.T) {
	srv := natstest.RunServer(t)
	startRouter(t, srv, router.QueuePinned)
	ctx, cancel := context.WithCancel(context.Background())
	out := &natstest.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- runContext(ctx, []string{"consume", "--nats", srv.URL(), "--node", "n1"}, out, &bytes.Buffer{})
	}()
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	publish(t, js, "jms.orders", []byte("hello"), "Group-Id", "g 2")
	natstest.Eventually(t, 30*time.Second, func() error {
		if out.String() == "" {
			return natstest.ErrNotYet
		}
		return nil
	})
	if got, want := out.String(), "1 \"g 2\" jms.orders hello\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("exit %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("consume did not stop")
	}
}

// parseConsumeArgs parses consume's arguments.
func parseConsumeArgs(args []string, env environment) (consumeOptions, connSettings, error) {
	a, conn, err := parseCommand("consume", args, env)
	if err != nil {
		return consumeOptions{}, connSettings{}, err
	}
	return *a.(*consumeOptions), conn, nil
}

func TestParseConsumeArgs(t *testing.T) {
	o, conn, err := parseConsumeArgs(nil, testEnv("broker-1.example.com"))
	if err != nil {
		t.Fatal(err)
	}
	want := consumeOptions{node: "broker-1-example-com", groupHeader: "Group-Id"}
	wantConn := connSettings{URL: defaultNATSURL, urlSource: "default"}
	if o != want || conn != wantConn {
		t.Errorf("defaults\n got %+v %+v\nwant %+v %+v", o, conn, want, wantConn)
	}
	o, conn, err = parseConsumeArgs([]string{"--nats", " nats://a:1 ", "--node", "n2", "--count", "7", "--json", "--no-ack", "--group-header", "JMSXGroupID"}, testEnv("h"))
	if err != nil {
		t.Fatal(err)
	}
	want = consumeOptions{node: "n2", count: 7, asJSON: true, noAck: true, groupHeader: "JMSXGroupID"}
	wantConn = connSettings{URL: "nats://a:1", urlSource: "--nats"}
	if o != want || conn != wantConn {
		t.Errorf("flags\n got %+v %+v\nwant %+v %+v", o, conn, want, wantConn)
	}

	for _, tt := range []struct {
		args  []string
		usage bool
		want  string
	}{
		{[]string{"--count", "-1"}, false, "--count must be >= 0, got -1"},
		{[]string{"--count", "many"}, true, `invalid value "many" for flag -count`},
		{[]string{"--node", "a.b"}, false, "node: node id"},
		{[]string{"--group-header", "Group Id"}, false, `group header "Group Id" is not a valid header name`},
		{[]string{"--nats", ""}, false, "--nats is empty"},
		{[]string{"--bogus"}, true, "flag provided but not defined: -bogus"},
		{[]string{"n1"}, true, `unexpected argument "n1"`},
	} {
		_, _, err := parseConsumeArgs(tt.args, testEnv("h"))
		var ue *usageError
		switch {
		case err == nil:
			t.Errorf("%v accepted", tt.args)
		case tt.usage != errors.As(err, &ue):
			t.Errorf("%v: usage error = %v, want %v (%v)", tt.args, !tt.usage, tt.usage, err)
		case !tt.usage && !errors.Is(err, router.ErrConfig):
			t.Errorf("%v: %v does not wrap router.ErrConfig", tt.args, err)
		case !strings.Contains(err.Error(), tt.want):
			t.Errorf("%v: error %q does not contain %q", tt.args, err, tt.want)
		}
	}
	if _, _, err := parseConsumeArgs([]string{"-h"}, testEnv("h")); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestQuoteField(t *testing.T) {
	for _, tt := range []struct {
		in   string
		last bool
		want string
	}{
		{"g1", false, "g1"},
		{"g 1", false, `"g 1"`},
		{"g 1", true, "g 1"},
		{" g", true, `" g"`},
		{"", true, `""`},
		{"-", false, `"-"`},
		{`"x"`, true, `"\"x\""`},
		{"a\nb", true, `"a\nb"`},
		{"a\tb", true, `"a\tb"`},
		{"\xff", true, `"\xff"`},
		{"Zürich", false, "Zürich"},
	} {
		if got := quoteField(tt.in, tt.last); got != tt.want {
			t.Errorf("quoteField(%q, %v) = %s, want %s", tt.in, tt.last, got, tt.want)
		}
	}
}

// TestConsumeCountHandsBackTheRest: consume --count N on a queue that
// holds more than N messages acknowledges the N it printed and hands the
// rest it pulled back at once (issue 31: --count 120 of 200 left 61 to
// wait out their ack wait). Five runs of --count 40 print the 200
// messages once each, every group in order, on a queue whose ack wait
// (10 min) is far longer than the test may take.
func TestConsumeCountHandsBackTheRest(t *testing.T) {
	for _, mode := range []router.QueueMode{router.QueuePinned, router.QueuePlain} {
		t.Run(string(mode), func(t *testing.T) {
			srv := natstest.RunServer(t)
			runTestRouter(t, srv, router.Config{
				Name: "h", Type: router.Local, Address: "jms", Timeout: time.Second,
				Node: "n1", Heartbeat: 100 * time.Millisecond, QueueMode: mode, QueueAckWait: 10 * time.Minute,
			})
			js, err := jetstream.New(srv.Connect())
			if err != nil {
				t.Fatal(err)
			}
			for i := range 200 {
				publish(t, js, "jms.orders", []byte(strconv.Itoa(i)), "Group-Id", "g"+strconv.Itoa(i%20))
			}
			natstest.Eventually(t, 30*time.Second, func() error {
				if info := queueConsumerInfo(t, js); info.NumPending < 200 {
					return fmt.Errorf("%d of 200 on the queue", info.NumPending)
				}
				return nil
			})
			last := map[string]int{}
			printed := 0
			for round := range 5 {
				code, stdout, stderr := runCommand(t, "consume", "--nats", srv.URL(), "--node", "n1", "--count", "40")
				if code != exitOK {
					t.Fatalf("round %d: exit %d; stderr: %s", round, code, stderr)
				}
				for _, line := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
					f := strings.Fields(line) // seq group subject body
					if len(f) != 4 {
						t.Fatalf("round %d: line %q", round, line)
					}
					body, _ := strconv.Atoi(f[3])
					if prev, ok := last[f[1]]; ok && body != prev+20 {
						t.Errorf("round %d: group %s: %d after %d", round, f[1], body, prev)
					} else if !ok && body >= 20 {
						t.Errorf("round %d: group %s starts at %d", round, f[1], body)
					}
					last[f[1]] = body
					printed++
				}
			}
			if printed != 200 {
				t.Errorf("%d messages printed, want 200", printed)
			}
			if info := queueConsumerInfo(t, js); info.NumAckPending != 0 || info.NumPending != 0 {
				t.Errorf("after all: %d awaiting ack, %d pending", info.NumAckPending, info.NumPending)
			}
		})
	}
}
