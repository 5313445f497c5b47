package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"grouprouter/internal/natstest"
	"grouprouter/kvbinding"
	"grouprouter/router"
)

// testConfig returns a node configuration with short timings for tests.
func testConfig(node string, typ router.HandlerType) router.Config {
	cfg := router.Config{
		Name:               "my-grouping-handler",
		Type:               typ,
		Address:            "jms",
		Timeout:            time.Second,
		Node:               node,
		Heartbeat:          100 * time.Millisecond,
		LeaseTTL:           time.Second,
		CheckpointInterval: 200 * time.Millisecond,
		PinnedTTL:          time.Second,
	}
	if os.Getenv("GROUPROUTER_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg
}

// node is a router node running in the test.
type node struct {
	t      testing.TB
	id     string
	cfg    router.Config
	url    string
	nc     *nats.Conn
	r      *router.Router
	cancel context.CancelFunc
	done   chan error
}

// startNode starts a router node connected to url and waits until it routes.
func startNode(t testing.TB, url string, cfg router.Config) *node {
	t.Helper()
	n := &node{t: t, id: cfg.Node, cfg: cfg, url: url}
	n.start()
	t.Cleanup(n.stop)
	return n
}

func (n *node) start() {
	n.t.Helper()
	n.nc = natstest.Connect(n.t, n.url, nats.Name("node-"+n.id))
	r, err := router.New(n.nc, n.cfg)
	if err != nil {
		n.t.Fatalf("router.New(%s): %v", n.id, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.r, n.cancel, n.done = r, cancel, make(chan error, 1)
	go func() { n.done <- r.Run(ctx) }()
	select {
	case <-r.Ready():
	case err := <-n.done:
		n.t.Fatalf("node %s stopped during start: %v", n.id, err)
	case <-time.After(30 * time.Second):
		n.t.Fatalf("node %s not ready", n.id)
	}
}

// stop stops the node gracefully and waits for it.
func (n *node) stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	select {
	case err := <-n.done:
		if err != nil {
			n.t.Errorf("node %s: Run: %v", n.id, err)
		}
	case <-time.After(30 * time.Second):
		n.t.Errorf("node %s did not stop", n.id)
	}
	n.nc.Close()
	n.cancel = nil
}

// kill simulates a crash: the connection dies first, so nothing is
// released or withdrawn; then the goroutines are stopped.
func (n *node) kill() {
	if n.cancel == nil {
		return
	}
	n.nc.Close()
	n.cancel()
	<-n.done
	n.cancel = nil
}

// restart starts a stopped node again with the same configuration.
func (n *node) restart() { n.start() }

// received is one message a consumer got.
type received struct {
	node    string // whose queue it came from
	group   string
	body    string
	subject string
	seq     uint64 // ingress sequence
}

// collector gathers what consumers receive.
type collector struct {
	mu  sync.Mutex
	got []received
}

func (c *collector) add(r received) {
	c.mu.Lock()
	c.got = append(c.got, r)
	c.mu.Unlock()
}

func (c *collector) all() []received {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]received(nil), c.got...)
}

// waitCount waits until at least n messages were received.
func (c *collector) waitCount(t testing.TB, n int, d time.Duration) []received {
	t.Helper()
	natstest.Eventually(t, d, func() error {
		if got := len(c.all()); got < n {
			return fmt.Errorf("received %d of %d messages", got, n)
		}
		return nil
	})
	return c.all()
}

// startConsumer consumes node's queue as an application would: the
// documented durable consumer, pulled with the priority group.
func startConsumer(t testing.TB, url, nodeID string, c *collector) (stop func()) {
	t.Helper()
	nc := natstest.Connect(t, url, nats.Name("consumer-"+nodeID))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, router.QueueStream, router.QueueConsumer(nodeID))
	if err != nil {
		t.Fatalf("consumer of %s: %v", nodeID, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		seq, _ := strconv.ParseUint(m.Headers().Get(router.HeaderIngressSeq), 10, 64)
		c.add(received{node: nodeID, group: m.Headers().Get("Group-Id"), body: string(m.Data()), subject: m.Subject(), seq: seq})
		_ = m.Ack()
	}, jetstream.PullPriorityGroup(router.PriorityGroup), jetstream.PullExpiry(2*time.Second))
	if err != nil {
		t.Fatalf("consume %s: %v", nodeID, err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cc.Stop()
			nc.Close()
		}
	}
	t.Cleanup(stop)
	return stop
}

// waitEligible waits until the registry shows exactly the given nodes
// with a queue consumer (and every node in live alive).
func waitEligible(t testing.TB, nc *nats.Conn, live []string, withConsumer []string) {
	t.Helper()
	js, _ := jetstream.New(nc)
	reg, err := kvbinding.OpenRegistry(context.Background(), js, kvbinding.RegistryConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, n := range withConsumer {
		want[n] = true
	}
	natstest.Eventually(t, 20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		nodes, err := reg.ListNodes(ctx)
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, info := range nodes {
			seen[info.Node] = true
			if info.HasConsumer != want[info.Node] {
				return fmt.Errorf("node %s has_consumer=%v, want %v", info.Node, info.HasConsumer, want[info.Node])
			}
		}
		for _, n := range live {
			if !seen[n] {
				return fmt.Errorf("node %s not announced", n)
			}
		}
		return nil
	})
}

// publish stores messages of a group on the ingress (synchronously: the
// PubAck means the message is safe).
func publish(t testing.TB, js jetstream.JetStream, subject, group string, bodies ...string) {
	t.Helper()
	for _, b := range bodies {
		m := nats.NewMsg(subject)
		if group != "" {
			m.Header.Set("Group-Id", group)
		}
		m.Data = []byte(b)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := js.PublishMsg(ctx, m)
		cancel()
		if err != nil {
			t.Fatalf("publish %s/%s: %v", group, b, err)
		}
	}
}

func bodies(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

// checkGrouping asserts that every group arrived at exactly one node, in
// ingress order, with no message missing or duplicated, and returns the
// node of each group.
func checkGrouping(t testing.TB, got []received, want map[string][]string) map[string]string {
	t.Helper()
	byGroup := map[string][]received{}
	for _, r := range got {
		byGroup[r.group] = append(byGroup[r.group], r)
	}
	where := map[string]string{}
	for g, wantBodies := range want {
		rs := byGroup[g]
		if len(rs) != len(wantBodies) {
			t.Errorf("group %q: received %d messages, want %d", g, len(rs), len(wantBodies))
			continue
		}
		for i, r := range rs {
			if r.node != rs[0].node {
				t.Errorf("group %q split: message %d on %s, first on %s", g, i, r.node, rs[0].node)
			}
			if r.body != wantBodies[i] {
				t.Errorf("group %q: message %d is %q, want %q (order broken)", g, i, r.body, wantBodies[i])
			}
		}
		if len(rs) > 0 {
			where[g] = rs[0].node
		}
	}
	for g := range byGroup {
		if _, ok := want[g]; !ok {
			t.Errorf("unexpected group %q received", g)
		}
	}
	return where
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
