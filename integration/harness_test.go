package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
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
		// Rebalancing off: these tests check where groups stay; the
		// rebalancing tests turn it on (rebalanceConfig).
		Rebalance: &proposals.RebalanceConfig{},
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
	opts   []nats.Option // of its connection, after the defaults
	nc     *nats.Conn
	r      *router.Router
	cancel context.CancelFunc
	done   chan error
	// log keeps the node's recent INFO and WARN lines (across restarts)
	// when its configuration gives no logger: a start that does not
	// become ready prints them.
	log *recentLog
}

// startNode starts a router node connected to url and waits until it routes.
func startNode(t testing.TB, url string, cfg router.Config) *node {
	t.Helper()
	n := &node{t: t, id: cfg.Node, cfg: cfg, url: url}
	n.start()
	return n
}

func (n *node) start() {
	n.t.Helper()
	n.launch()
	// A deadline, not a measure: beside another test and two busy loops,
	// a fresh cluster's JetStream can take most of 30 s to answer a
	// node's first announcement.
	n.waitReady(time.Minute)
}

// launch starts the node without waiting for it to route.
func (n *node) launch() {
	n.t.Helper()
	n.nc = natstest.Connect(n.t, n.url, append([]nats.Option{nats.Name("node-" + n.id)}, n.opts...)...)
	// Registered after the connection's cleanup, so it runs before it: the
	// node stops gracefully, not with its connection already closed.
	n.t.Cleanup(n.stop)
	cfg := n.cfg
	if cfg.Logger == nil {
		if n.log == nil {
			n.log = &recentLog{}
		}
		cfg.Logger = slog.New(slog.NewTextHandler(n.log, nil))
	}
	r, err := router.New(n.nc, cfg)
	if err != nil {
		n.t.Fatalf("router.New(%s): %v", n.id, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// done is this run's own channel: a crashed run still finishing (see
	// crash in faults_test.go) must not report into its restart's.
	done := make(chan error, 1)
	n.r, n.cancel, n.done = r, cancel, done
	go func() { done <- r.Run(ctx) }()
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
	subject string // the producer's
	seq     uint64 // ingress sequence
	at      time.Time
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

// waitGroup waits until at least n messages of group were received and
// returns them.
func (c *collector) waitGroup(t testing.TB, group string, n int, d time.Duration) []received {
	t.Helper()
	var rs []received
	natstest.Eventually(t, d, func() error {
		rs = rs[:0]
		for _, r := range c.all() {
			if r.group == group {
				rs = append(rs, r)
			}
		}
		if len(rs) < n {
			return fmt.Errorf("received %d of %d messages of group %q", len(rs), n, group)
		}
		return nil
	})
	return rs
}

// startConsumer consumes node's queue as an application would, with
// package consumer (each group in order, redeliveries held in place),
// recording every message with its headers' group and ingress sequence.
func startConsumer(t testing.TB, url, nodeID string, c *collector) (stop func()) {
	t.Helper()
	nc := natstest.Connect(t, url, nats.Name("consumer-"+nodeID))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// Consume needs the node's queue consumer (its router creates it). A
	// lookup can go unanswered while the cluster elects the consumer's
	// leader: each try has its own deadline.
	natstest.Eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := js.Consumer(ctx, router.QueueStream, router.QueueConsumer(nodeID)); err != nil {
			return fmt.Errorf("consumer of %s: %w", nodeID, err)
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- consumer.Consume(ctx, js, nodeID, func(_ context.Context, m *consumer.Message) error {
			c.add(received{node: nodeID, group: m.Header.Get("Group-Id"), body: string(m.Data), subject: m.Subject, seq: m.IngressSeq, at: time.Now()})
			return nil
		}, consumer.WithDrainTimeout(5*time.Second))
	}()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("consumer of %s: %v", nodeID, err)
			}
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
	if err := tryPublish(js, subject, group, bodies...); err != nil {
		t.Fatal(err)
	}
}

// tryPublish is publish for goroutines other than the test's: it returns
// the first error instead of failing the test.
func tryPublish(js jetstream.JetStream, subject, group string, bodies ...string) error {
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
			return fmt.Errorf("publish %s/%s: %w", group, b, err)
		}
	}
	return nil
}

// publishPipelined publishes bodies of group on subject through js with
// their publishes in flight together, in order (one connection), and waits
// for every acknowledgement: a backlog that must be stored within a
// deadline, not at one round trip a message.
func publishPipelined(t testing.TB, js jetstream.JetStream, subject, group string, bodies ...string) {
	t.Helper()
	acks := make([]jetstream.PubAckFuture, 0, len(bodies))
	for _, b := range bodies {
		m := nats.NewMsg(subject)
		m.Header.Set("Group-Id", group)
		m.Data = []byte(b)
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			t.Fatalf("publish %s/%s: %v", group, b, err)
		}
		acks = append(acks, f)
	}
	timeout := time.After(30 * time.Second)
	for i, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatalf("publish %s/%s: %v", group, bodies[i], err)
		case <-timeout:
			t.Fatalf("publish %s: %d of %d acknowledged after 30 s", group, i, len(acks))
		}
	}
}

// jetStream returns a JetStream context on a new connection to url.
func jetStream(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// sendBatch publishes n messages of group on jms.orders through js, with
// bodies "<group>/<tag>-000" onward, and appends them to want[group].
func sendBatch(t testing.TB, js jetstream.JetStream, group, tag string, n int, want map[string][]string) {
	t.Helper()
	b := bodies(group+"/"+tag, n)
	publish(t, js, "jms.orders", group, b...)
	want[group] = append(want[group], b...)
}

// checkQueuedOnce asserts that the queue stream has stored exactly n
// messages since it was created: with checkGrouping's counts, no message
// was queued twice, not even one still waiting for a consumer.
func checkQueuedOnce(t testing.TB, js jetstream.JetStream, n int) {
	t.Helper()
	if st := streamState(t, js, router.QueueStream); st.LastSeq != uint64(n) {
		t.Errorf("queue stream stored %d messages, want %d", st.LastSeq, n)
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

// openStore opens the bindings bucket as an operator would, to inspect it.
func openStore(t testing.TB, nc *nats.Conn) *kvbinding.Store {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := kvbinding.OpenStore(ctx, js, kvbinding.StoreConfig{})
	if err != nil {
		t.Fatalf("open bindings store: %v", err)
	}
	return st
}

// listBindings returns every binding in the store by group id.
func listBindings(t testing.TB, st *kvbinding.Store) map[string]kvbinding.Binding {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bs, err := st.List(ctx)
	if err != nil {
		t.Fatalf("list bindings: %v", err)
	}
	out := make(map[string]kvbinding.Binding, len(bs))
	for _, b := range bs {
		out[b.Group] = b
	}
	return out
}

// waitBound waits until group has a bound (not dead-lettered) binding and
// returns it.
func waitBound(t testing.TB, st *kvbinding.Store, group string, d time.Duration) kvbinding.Binding {
	t.Helper()
	var b kvbinding.Binding
	natstest.Eventually(t, d, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var err error
		if b, err = st.Get(ctx, group); err != nil {
			return err
		}
		if b.State != kvbinding.StateBound {
			return fmt.Errorf("group %q is %s", group, b.State)
		}
		return nil
	})
	return b
}

// streamState returns the current state of a stream.
func streamState(t testing.TB, js jetstream.JetStream, stream string) jetstream.StreamState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("stream %s info: %v", stream, err)
	}
	return info.State
}

// waitStreamMsgs waits until a stream holds at least n messages and
// returns all of them in stream order.
func waitStreamMsgs(t testing.TB, js jetstream.JetStream, stream string, n int, d time.Duration) []*jetstream.RawStreamMsg {
	t.Helper()
	natstest.Eventually(t, d, func() error {
		if got := streamState(t, js, stream).Msgs; got < uint64(n) {
			return fmt.Errorf("stream %s holds %d of %d messages", stream, got, n)
		}
		return nil
	})
	st := streamState(t, js, stream)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := st.FirstSeq; seq <= st.LastSeq && seq > 0; seq++ {
		// A deadline per read, not one for them all: on a loaded machine
		// an R3 stream's reads of 70 messages one by one took more than
		// 10 s (CI, TestGroupLimit).
		mctx, mcancel := context.WithTimeout(context.Background(), 10*time.Second)
		m, err := s.GetMsg(mctx, seq)
		mcancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("stream %s message %d: %v", stream, seq, err)
		}
		out = append(out, m)
	}
	return out
}

// eventLog records the events of one kind published on grouping.events.
type eventLog struct {
	mu  sync.Mutex
	evs []proposals.Event
}

// watchEvents subscribes to events of kind on nc (before anything that
// may publish them) and records them until the test ends.
func watchEvents(t testing.TB, nc *nats.Conn, kind string) *eventLog {
	t.Helper()
	l := &eventLog{}
	sub, err := nc.Subscribe(proposals.SubjectEventsPrefix+kind, func(m *nats.Msg) {
		var e proposals.Event
		if json.Unmarshal(m.Data, &e) == nil {
			l.mu.Lock()
			l.evs = append(l.evs, e)
			l.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return l
}

// waitGroup waits for an event about group and returns the first one.
func (l *eventLog) waitGroup(t testing.TB, group string, d time.Duration) proposals.Event {
	t.Helper()
	var ev proposals.Event
	natstest.Eventually(t, d, func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, e := range l.evs {
			if e.Group == group {
				ev = e
				return nil
			}
		}
		return fmt.Errorf("no event about group %q among %d", group, len(l.evs))
	})
	return ev
}

// waitActiveHandler waits until exactly one of the nodes runs the active
// LOCAL handler and returns it.
func waitActiveHandler(t testing.TB, d time.Duration, nodes ...*node) *node {
	t.Helper()
	var active *node
	natstest.Eventually(t, d, func() error {
		var on []string
		active = nil
		for _, n := range nodes {
			if n.cancel != nil && n.r.HandlerActive() {
				on = append(on, n.id)
				active = n
			}
		}
		if len(on) != 1 {
			return fmt.Errorf("active handlers: %v, want exactly one", on)
		}
		return nil
	})
	return active
}

// recentLog keeps the last 64 to 128 KiB written to it; safe for
// concurrent writers.
type recentLog struct {
	mu  sync.Mutex
	buf []byte
}

func (l *recentLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf)+len(p) > 128<<10 {
		l.buf = append(l.buf[:0], l.buf[len(l.buf)-min(len(l.buf), 64<<10):]...)
	}
	l.buf = append(l.buf, p...)
	return len(p), nil
}

// tail returns up to the last n bytes written ("" for a nil log).
func (l *recentLog) tail(n int) string {
	if l == nil {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return tail(string(l.buf), n)
}
