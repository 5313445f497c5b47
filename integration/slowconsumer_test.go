package integration

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// A move while the old node's consumer is slow: 40 ms a message, pulled as
// the README shows (nats.go Consume with its default prefetch of 500), a
// backlog of 600 messages of one group. The group is moved by the
// operator, by a rebind (the consumer leaves) and by the loss of its node.
// Each time: no message is processed twice, the group is never worked on
// by two consumers at once, and it is processed in order, with epochs that
// never go down. Before the hand-over waited for the consumer, the
// operator's move had 195 of 600 processed twice and 385 overlapping
// starts.
func TestSlowConsumerMoves(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: takes ~2 min")
	}
	t.Parallel() // see doc.go
	for _, how := range []string{"operator", "rebind", "node-loss"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel() // each on its own cluster
			runSlowConsumerMove(t, how)
		})
	}
}

const (
	slowWork    = 40 * time.Millisecond
	slowBacklog = 600
)

func runSlowConsumerMove(t *testing.T, how string) {
	c := natstest.RunCluster(t, 3)
	nodes := map[string]*node{}
	for i, s := range c.Servers {
		// Every node LOCAL: whichever node is lost, a handler stays.
		cfg := testConfig(fmt.Sprintf("n%d", i), router.Local)
		cfg.NodeGrace = 2 * time.Second
		cfg.RebindAfter = 2 * time.Second
		// Heartbeats of 100 ms (liveness TTL 1 s) let a live node look
		// gone, and fence itself, on a loaded machine.
		cfg.Heartbeat = 500 * time.Millisecond
		nodes[cfg.Node] = startNode(t, s.URL(), cfg)
	}
	log := newProcessLog()
	consumers := map[string]*slowConsumer{}
	for i, id := range all3 {
		consumers[id] = startSlowConsumer(t, c.Servers[i].URL(), id, slowWork, log)
	}
	admin := natstest.Connect(t, c.URLs(), nats.Name("test-admin"))
	waitEligible(t, admin, all3, all3)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	st := openStore(t, admin)

	const group = "hot"
	// The consumers hold off while the backlog builds up: routing one
	// group runs at one publish per PubAck round trip, which a loaded
	// machine slows down to the consumer's pace.
	gate := make(chan struct{})
	for _, c := range consumers {
		c.mu.Lock()
		c.gate = gate
		c.mu.Unlock()
	}
	publish(t, js, "jms.orders", group, "m-0000")
	old := waitBound(t, st, group, 30*time.Second).Node
	for _, body := range bodies("m", slowBacklog)[1:] {
		m := nats.NewMsg("jms.orders")
		m.Header.Set("Group-Id", group)
		m.Data = []byte(body)
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatal("backlog not stored within a minute")
	}
	// The backlog is on the old node: its share of the queue window on
	// the queue, where its consumer has it in hand, and the rest held back
	// on the node's held subject (consuming.md, "A busy group"), so the
	// move takes both. (One group is routed at one publish per PubAck
	// round trip: on a loaded machine, under the race detector, 600 take
	// a minute or more.)
	natstest.Eventually(t, 3*time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		cons, err := js.Consumer(ctx, router.QueueStream, router.QueueConsumer(old))
		if err != nil {
			return err
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		stream, err := js.Stream(ctx, router.QueueStream)
		if err != nil {
			return err
		}
		held, err := stream.Info(ctx, jetstream.WithSubjectFilter(router.HeldFilter(old, "*.*")))
		if err != nil {
			return err
		}
		if backlog := info.NumPending + uint64(info.NumAckPending) + held.State.Msgs; backlog < slowBacklog {
			return fmt.Errorf("%d messages waiting, in hand or held back on %s (%d held back, %d processed)", backlog, old, held.State.Msgs, log.count())
		}
		return nil
	})
	close(gate)
	natstest.Eventually(t, 60*time.Second, func() error {
		if n := log.count(); n < 20 {
			return fmt.Errorf("%d processed", n)
		}
		return nil
	})
	target := ""
	for _, id := range all3 {
		if id != old {
			target = id
			break
		}
	}
	switch how {
	case "operator":
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := proposals.Move(ctx, admin, group, target, 10*time.Second)
		cancel()
		if err != nil {
			t.Fatalf("move %s to %s: %v", group, target, err)
		}
	case "rebind":
		// The old node's consumer leaves abruptly: what it had pulled and
		// not processed is neither processed nor acked.
		consumers[old].crash()
	case "node-loss":
		// The old node's router dies; its consumer goes on working.
		nodes[old].kill()
	}
	// Every message processed, the group settled off the old node.
	natstest.Eventually(t, 3*time.Minute, func() error {
		if n := log.unique(group); n < slowBacklog {
			return fmt.Errorf("%d of %d processed (%d deliveries)", n, slowBacklog, log.count())
		}
		return nil
	})
	b := waitBound(t, st, group, 30*time.Second)
	if b.Node == old {
		t.Errorf("the group is still bound to %s: %+v", old, b)
	}
	// Nothing more arrives (a late copy would).
	quiet := log.count()
	time.Sleep(time.Second)
	log.check(t, group, slowBacklog, log.count()-quiet)
	t.Logf("%s: moved %s -> %s; %s", how, old, b.Node, log.summary(group))
}

// processLog records what the consumers processed, to find a message
// processed twice, a group worked on by two consumers at once, and order.
type processLog struct {
	mu        sync.Mutex
	active    map[string]int
	overlaps  int
	times     map[string]map[uint64]int
	order     map[string][]uint64
	epochs    map[string][]uint64
	nodes     map[string][]string
	badHeader int
}

func newProcessLog() *processLog {
	return &processLog{active: map[string]int{}, times: map[string]map[uint64]int{}, order: map[string][]uint64{},
		epochs: map[string][]uint64{}, nodes: map[string][]string{}}
}

func (l *processLog) start(group string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active[group] > 0 {
		l.overlaps++
	}
	l.active[group]++
}

func (l *processLog) end(node, group string, seq, epoch uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.active[group]--
	if l.times[group] == nil {
		l.times[group] = map[uint64]int{}
	}
	l.times[group][seq]++
	l.order[group] = append(l.order[group], seq)
	l.epochs[group] = append(l.epochs[group], epoch)
	if ns := l.nodes[group]; len(ns) == 0 || ns[len(ns)-1] != node {
		l.nodes[group] = append(ns, node)
	}
}

func (l *processLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.order {
		n += len(o)
	}
	return n
}

func (l *processLog) unique(group string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.times[group])
}

func (l *processLog) summary(group string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("%d processed, %d distinct, %d overlapping starts, consumers in turn %v",
		len(l.order[group]), len(l.times[group]), l.overlaps, l.nodes[group])
}

// check asserts that group's n messages were each processed once, in
// ingress order, never two at a time, with epochs that never go down.
func (l *processLog) check(t *testing.T, group string, n, late int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	twice := 0
	for _, k := range l.times[group] {
		if k > 1 {
			twice++
		}
	}
	if twice > 0 || l.overlaps > 0 || late > 0 {
		t.Errorf("%d of %d messages processed twice, %d starts while another consumer worked on the group, %d late deliveries",
			twice, n, l.overlaps, late)
	}
	if len(l.times[group]) != n {
		t.Errorf("%d distinct messages processed, want %d", len(l.times[group]), n)
	}
	o, ep := l.order[group], l.epochs[group]
	for i := 1; i < len(o); i++ {
		if o[i] <= o[i-1] {
			t.Errorf("out of order: ingress seq %d processed after %d", o[i], o[i-1])
			break
		}
	}
	for i := 1; i < len(ep); i++ {
		if ep[i] < ep[i-1] {
			t.Errorf("epoch went down: %d after %d (message %d)", ep[i], ep[i-1], o[i])
			break
		}
	}
	if l.badHeader > 0 {
		t.Errorf("%d messages without a valid %s or %s header", l.badHeader, router.HeaderIngressSeq, router.HeaderEpoch)
	}
}

// slowConsumer consumes a node's queue as the README shows: nats.go
// Consume with its default prefetch, one message at a time, taking work
// for each, then Ack.
type slowConsumer struct {
	t       *testing.T
	node    string
	nc      *nats.Conn
	cc      jetstream.ConsumeContext
	mu      sync.Mutex
	crashed bool
	stop    chan struct{} // closed by crash
	busy    sync.WaitGroup
	// gate, when set, holds every message until it is closed.
	gate chan struct{}
}

func startSlowConsumer(t *testing.T, url, node string, work time.Duration, log *processLog) *slowConsumer {
	t.Helper()
	c := &slowConsumer{t: t, node: node, stop: make(chan struct{})}
	c.nc = natstest.Connect(t, url, nats.Name("slow-consumer-"+node))
	js, err := jetstream.New(c.nc)
	if err != nil {
		t.Fatal(err)
	}
	var cons jetstream.Consumer
	natstest.Eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		cons, err = js.Consumer(ctx, router.QueueStream, router.QueueConsumer(node))
		return err
	})
	c.cc, err = cons.Consume(func(m jetstream.Msg) {
		c.mu.Lock()
		if c.crashed {
			c.mu.Unlock()
			return
		}
		c.busy.Add(1)
		gate := c.gate
		c.mu.Unlock()
		defer c.busy.Done()
		if gate != nil {
			select {
			case <-gate:
			case <-c.stop:
				return // crashed while held
			}
		}
		h := m.Headers()
		group := h.Get("Group-Id")
		seq, err1 := strconv.ParseUint(h.Get(router.HeaderIngressSeq), 10, 64)
		epoch, err2 := strconv.ParseUint(h.Get(router.HeaderEpoch), 10, 64)
		if err1 != nil || err2 != nil {
			log.mu.Lock()
			log.badHeader++
			log.mu.Unlock()
		}
		log.start(group)
		time.Sleep(work)
		log.end(node, group, seq, epoch)
		_ = m.Ack()
	}, jetstream.PullPriorityGroup(router.PriorityGroup))
	if err != nil {
		t.Fatalf("consume %s: %v", node, err)
	}
	t.Cleanup(func() { c.crash() })
	return c
}

// crash stops the consumer as a dying process would: the message in hand
// is finished, what it pulled and did not process is dropped unacked.
func (c *slowConsumer) crash() {
	c.mu.Lock()
	if c.crashed {
		c.mu.Unlock()
		return
	}
	c.crashed = true
	close(c.stop)
	c.mu.Unlock()
	c.busy.Wait()
	c.cc.Stop()
	c.nc.Close()
}
