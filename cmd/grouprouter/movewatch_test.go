package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/router"
)

// ackingConsumer pulls node's queue with the priority group, acks every
// message and keeps the bodies of group g in the order received, until
// stop or the end of the test.
type ackingConsumer struct {
	mu  sync.Mutex
	got []string
	cc  jetstream.ConsumeContext
}

func startAckingConsumer(t *testing.T, srv *natstest.Server, node, group string) *ackingConsumer {
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
	c := &ackingConsumer{}
	c.cc, err = cons.Consume(func(m jetstream.Msg) {
		if m.Headers().Get("Group-Id") == group {
			c.mu.Lock()
			c.got = append(c.got, string(m.Data()))
			c.mu.Unlock()
		}
		_ = m.Ack()
	}, jetstream.PullPriorityGroup(router.PriorityGroup), jetstream.PullExpiry(time.Second))
	if err != nil {
		t.Fatalf("consume %s: %v", node, err)
	}
	t.Cleanup(c.cc.Stop)
	return c
}

func (c *ackingConsumer) bodies() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.got...)
}

// consumerInfo returns the info of node's queue consumer.
func consumerInfo(js jetstream.JetStream, node string) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, router.QueueStream, router.QueueConsumer(node))
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// move --wait of a group with hundreds of messages waiting on its old
// queue shows the hand-over's progress, as plain lines when stdout is not
// a terminal, then the final record; the messages arrive on the new
// node's queue, in order.
func TestMoveWaitShowsProgress(t *testing.T) {
	srv := natstest.RunServer(t)
	url := srv.URL()
	for _, n := range []struct {
		id  string
		typ router.HandlerType
	}{{"n0", router.Local}, {"n1", router.Remote}} {
		runTestRouter(t, srv, router.Config{
			Name: "h", Type: n.typ, Address: "jms", Timeout: time.Second, Node: n.id,
			Heartbeat: 100 * time.Millisecond, LeaseTTL: time.Second,
			RebindAfter: -1, // n1's groups stay on it without a consumer
		})
	}
	on0 := startAckingConsumer(t, srv, "n0", "g")
	on1 := startAckingConsumer(t, srv, "n1", "g")
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}

	// g is bound to n1 (moved there if it was bound to n0).
	publish(t, js, "jms.orders", []byte("000"), "Group-Id", "g")
	natstest.Eventually(t, 30*time.Second, func() error {
		b, err := bindingOf(t, url, "g")
		if err != nil || b.Node == "n1" {
			return err
		}
		code, _, stderr := runCommand(t, "move", "--wait", "--nats", url, "g", "n1")
		if code != exitOK {
			return fmt.Errorf("move to n1: %s", stderr)
		}
		return nil
	})
	natstest.Eventually(t, 30*time.Second, func() error {
		if got := len(on0.bodies()) + len(on1.bodies()); got != 1 {
			return fmt.Errorf("first message received %d times", got)
		}
		return nil
	})
	// n1's consumer goes away; its pull requests expire.
	on1.cc.Stop()
	natstest.Eventually(t, 30*time.Second, func() error {
		info, err := consumerInfo(js, "n1")
		if err != nil {
			return err
		}
		if info.NumWaiting != 0 || info.NumAckPending != 0 {
			return fmt.Errorf("n1's consumer: %d pull requests waiting, %d unacked", info.NumWaiting, info.NumAckPending)
		}
		return nil
	})

	// Hundreds of messages wait on n1's queue.
	const waiting = 400
	for i := 1; i <= waiting; i++ {
		publish(t, js, "jms.orders", fmt.Appendf(nil, "%03d", i), "Group-Id", "g")
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		info, err := consumerInfo(js, "n1")
		if err != nil {
			return err
		}
		if info.NumPending != waiting {
			return fmt.Errorf("%d messages waiting on n1's queue", info.NumPending)
		}
		return nil
	})

	code, stdout, stderr := runCommand(t, "move", "--wait", "--timeout", "60s", "--nats", url, "g", "n0")
	if code != exitOK || stderr != "" {
		t.Fatalf("move --wait: exit %d, stderr %q, stdout:\n%s", code, stderr, stdout)
	}
	t.Logf("move --wait printed:\n%s", stdout)
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	progress := regexp.MustCompile(`^move "g": drain: n0 moves the group's waiting messages off n1's queue: (\d+) of 400 messages moved$`)
	var counts []int
	settled := -1
	for i, l := range lines {
		if strings.Contains(l, "\r") || strings.Contains(l, "\x1b") {
			t.Errorf("line %d has terminal controls: %q", i+1, l)
		}
		if m := progress.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			counts = append(counts, n)
		}
		if strings.HasPrefix(l, `move "g": settled: bound to n0 after `) {
			settled = i
			if !strings.HasSuffix(l, "; 400 messages moved off n1's queue") {
				t.Errorf("last progress line %q does not say what was moved", l)
			}
		}
	}
	if len(counts) == 0 || counts[len(counts)-1] != waiting {
		t.Errorf("drain progress lines count %v, want some ending at %d", counts, waiting)
	}
	for i := 1; i < len(counts); i++ {
		if counts[i] < counts[i-1] {
			t.Errorf("drain progress goes back: %v", counts)
		}
	}
	if settled < 0 || settled+1 >= len(lines) || !strings.HasPrefix(lines[settled+1], "GROUP") {
		t.Errorf("no settled line followed by the final record")
	}
	if want := `Group "g" is bound to n0: the move is done.`; lines[len(lines)-1] != want {
		t.Errorf("last line %q, want %q", lines[len(lines)-1], want)
	}

	// Every waiting message reaches n0's consumer, once, in order.
	natstest.Eventually(t, 30*time.Second, func() error {
		if got := len(on0.bodies()) + len(on1.bodies()); got < waiting+1 {
			return fmt.Errorf("%d of %d messages received", got, waiting+1)
		}
		return nil
	})
	got := append(on1.bodies(), on0.bodies()...) // "000" on either
	for i, b := range got {
		if b != fmt.Sprintf("%03d", i) {
			t.Fatalf("message %d is %q: %v", i, b, got)
		}
	}
	if len(got) != waiting+1 {
		t.Errorf("%d messages received, want %d", len(got), waiting+1)
	}
}
