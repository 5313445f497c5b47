package integration

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// rebalancing returns a node configuration with rebalancing on, as a
// deployment has it by default.
func rebalancing(node string, typ router.HandlerType) router.Config {
	cfg := testConfig(node, typ)
	cfg.Rebalance = nil
	return cfg
}

// boundPerNode counts the groups of want bound to each node (any step), and
// how many of want have no bound record.
func boundPerNode(t testing.TB, st *kvbinding.Store, want []string) (map[string]int, int) {
	t.Helper()
	all := listBindings(t, st)
	per, unbound := map[string]int{}, 0
	for _, g := range want {
		b, ok := all[g]
		if !ok || b.State != kvbinding.StateBound {
			unbound++
			continue
		}
		per[b.Node]++
	}
	return per, unbound
}

func describeSpread(per map[string]int) string {
	nodes := make([]string, 0, len(per))
	for n := range per {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	var parts []string
	for _, n := range nodes {
		parts = append(parts, fmt.Sprintf("%s:%d", n, per[n]))
	}
	return strings.Join(parts, " ")
}

// endMoving stops the producers and checks, as endLoad does, that every
// message they had acknowledged was processed once and in order and that
// the queues empty; a move's drain stores the messages it moves again on
// the queue stream, so the stream's count is reported, not checked.
func endMoving(t *testing.T, js jetstream.JetStream, col *timedCollector, ps []*loadProducer) (total int, copies uint64) {
	t.Helper()
	haltAll(t, ps...)
	want, total := sentAll(ps...)
	col.waitConsumed(t, want, 60*time.Second)
	checkDelivered(t, col.all(), want, false, false)
	waitQueuesEmpty(t, js, 30*time.Second)
	return total, streamState(t, js, router.QueueStream).LastSeq - uint64(total)
}

// rebalanceMoves returns the move events that say rebalance.
func (l *eventLog) rebalanceMoves() []proposals.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []proposals.Event
	for _, e := range l.evs {
		if strings.HasPrefix(e.Reason, "rebalance") {
			out = append(out, e)
		}
	}
	return out
}

// first returns the earliest event recorded, and whether there is one.
func (l *eventLog) first() (proposals.Event, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.evs) == 0 {
		return proposals.Event{}, false
	}
	f := l.evs[0]
	for _, e := range l.evs[1:] {
		if e.At.Before(f.At) {
			f = e
		}
	}
	return f, true
}

// burstProducer publishes to its groups in rounds: every group's message
// of a round at once (asynchronously), the next round once the whole
// round is acknowledged, so that a group's messages are stored in order.
type burstProducer struct {
	mu   sync.Mutex
	want map[string][]string
	err  error
	stop chan struct{}
	done chan struct{}
}

func startBurst(t testing.TB, js jetstream.JetStream, groups []string, every time.Duration) *burstProducer {
	t.Helper()
	p := &burstProducer{want: map[string][]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for round := 0; ; round++ {
			futures := make([]jetstream.PubAckFuture, 0, len(groups))
			bodies := make([]string, 0, len(groups))
			for _, g := range groups {
				body := fmt.Sprintf("%s/%05d", g, round)
				m := natsMsg("jms.orders", g, body)
				m.Header.Set(jetstream.MsgIDHeader, body)
				f, err := js.PublishMsgAsync(m)
				if err != nil {
					p.fail(err)
					return
				}
				futures, bodies = append(futures, f), append(bodies, body)
			}
			for i, f := range futures {
				select {
				case <-f.Ok():
					p.mu.Lock()
					p.want[groups[i]] = append(p.want[groups[i]], bodies[i])
					p.mu.Unlock()
				case err := <-f.Err():
					p.fail(err)
					return
				case <-time.After(30 * time.Second):
					p.fail(fmt.Errorf("no PubAck for %s", bodies[i]))
					return
				}
			}
			select {
			case <-p.stop:
				return
			case <-time.After(every):
			}
		}
	}()
	t.Cleanup(p.halt)
	return p
}

func (p *burstProducer) fail(err error) {
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
}

func (p *burstProducer) halt() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// TestStartedTogetherSpreads starts three nodes and their consumers, then
// producers of 30 groups at the moment the second and third consumers
// start (only the first node's consumer is known by then; every group's
// first message is published at once): at most 15 of the 30 groups are on
// any node within 5 s of the first decision, and every message is
// processed once, in order.
func TestStartedTogetherSpreads(t *testing.T) {
	t.Parallel() // see doc.go
	c := natstest.RunCluster(t, 3)
	admin := natstest.Connect(t, c.URLs(), nats.Name("test-admin"))
	binds := watchEvents(t, admin, proposals.EventBind)
	moves := watchEvents(t, admin, proposals.EventMove)
	for i, s := range c.Servers {
		typ := router.Remote
		if i == 0 {
			typ = router.Local
		}
		cfg := rebalancing(fmt.Sprintf("n%d", i), typ)
		// Presence as a deployment has it: the default heartbeat.
		cfg.Heartbeat = 0
		if os.Getenv("GROUPROUTER_TEST_NO_REBALANCE") != "" {
			cfg.Rebalance = &proposals.RebalanceConfig{}
		}
		startNode(t, s.URL(), cfg)
	}
	col := &timedCollector{}
	startAppConsumer(t, c.Servers[0].URL(), "n0", col)
	waitEligible(t, admin, all3, []string{"n0"})
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	groups := make([]string, 30)
	for i := range groups {
		groups[i] = fmt.Sprintf("together-%02d", i)
	}
	startAppConsumer(t, c.Servers[1].URL(), "n1", col)
	startAppConsumer(t, c.Servers[2].URL(), "n2", col)
	p := startBurst(t, js, groups, 100*time.Millisecond)

	st := openStore(t, admin)
	var first proposals.Event
	natstest.Eventually(t, 30*time.Second, func() error {
		var ok bool
		if first, ok = binds.first(); !ok {
			return fmt.Errorf("no bind event yet")
		}
		return nil
	})
	// Poll until the spread holds, up to 5 s after the first decision.
	deadline := first.At.Add(5 * time.Second)
	var per map[string]int
	initial := ""
	for {
		var unbound int
		per, unbound = boundPerNode(t, st, groups)
		if initial == "" && unbound == 0 {
			initial = describeSpread(per)
		}
		most := 0
		for _, n := range per {
			most = max(most, n)
		}
		if unbound == 0 && most <= 15 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the first decision: %s, %d unbound; want at most 15 of 30 on any node", describeSpread(per), unbound)
		}
		time.Sleep(50 * time.Millisecond) // a poll, bounded by the deadline above
	}
	t.Logf("spread %s (all bound first as %s) %v after the first decision; %d rebalance moves",
		describeSpread(per), initial, time.Since(first.At).Round(time.Millisecond), len(moves.rebalanceMoves()))
	p.halt()
	if p.err != nil {
		t.Fatal(p.err)
	}
	col.waitConsumed(t, p.want, 60*time.Second)
	checkDelivered(t, col.all(), p.want, false, false)
	waitQueuesEmpty(t, js, 30*time.Second)
	total := 0
	for _, b := range p.want {
		total += len(b)
	}
	t.Logf("%d messages processed once, in order (%d drain copies)", total, streamState(t, js, router.QueueStream).LastSeq-uint64(total))
}

// TestNodeJoinGetsItsShare runs two nodes serving 40 busy groups, then
// starts a third node with a consumer: it holds at least its share minus
// the tolerance (13 of 40) within 30 s, while every group keeps receiving
// messages, and every message is processed once, in order.
func TestNodeJoinGetsItsShare(t *testing.T) {
	t.Parallel() // see doc.go
	c := natstest.RunCluster(t, 3)
	admin := natstest.Connect(t, c.URLs(), nats.Name("test-admin"))
	moves := watchEvents(t, admin, proposals.EventMove)
	startNode(t, c.Servers[0].URL(), rebalancing("n0", router.Local))
	startNode(t, c.Servers[1].URL(), rebalancing("n1", router.Remote))
	col := &timedCollector{}
	startAppConsumer(t, c.Servers[0].URL(), "n0", col)
	startAppConsumer(t, c.Servers[1].URL(), "n1", col)
	waitEligible(t, admin, []string{"n0", "n1"}, []string{"n0", "n1"})
	// 40 groups, each with a message every 100 ms.
	ps := []*loadProducer{
		startLoad(t, c.Servers[0].URL(), "j0", 20, 0, 5*time.Millisecond),
		startLoad(t, c.Servers[1].URL(), "j1", 20, 0, 5*time.Millisecond),
	}
	var groups []string
	for _, p := range ps {
		for slot := range p.version {
			groups = append(groups, p.group(slot))
		}
	}
	st := openStore(t, admin)
	natstest.Eventually(t, 30*time.Second, func() error {
		if per, unbound := boundPerNode(t, st, groups); unbound > 0 {
			return fmt.Errorf("%d of 40 groups unbound (%s)", unbound, describeSpread(per))
		}
		return nil
	})
	before, _ := boundPerNode(t, st, groups)

	joined := time.Now()
	startNode(t, c.Servers[2].URL(), rebalancing("n2", router.Remote))
	startAppConsumer(t, c.Servers[2].URL(), "n2", col)
	share := 40.0 / 3
	want := int(share - float64(proposals.DefaultRebalance.Tolerance) + 0.999) // 13
	var per map[string]int
	natstest.Eventually(t, 30*time.Second, func() error {
		per, _ = boundPerNode(t, st, groups)
		if per["n2"] < want {
			return fmt.Errorf("n2 holds %d of 40, want at least %d (%s)", per["n2"], want, describeSpread(per))
		}
		return nil
	})
	reached := time.Now()
	took := reached.Sub(joined)
	// Every group stayed busy: each one was published to while n2 took
	// its share, and after.
	natstest.Eventually(t, 10*time.Second, func() error {
		bodies, _ := ackTimes(ps...)
		after := map[string]bool{}
		for b, at := range bodies {
			if at.After(reached) {
				after[b[:strings.IndexByte(b, '/')]] = true
			}
		}
		if len(after) != len(groups) {
			return fmt.Errorf("%d of %d groups had a message published since n2 took its share", len(after), len(groups))
		}
		return nil
	})
	rb := moves.rebalanceMoves()
	if len(rb) == 0 {
		t.Fatalf("no move event says rebalance")
	}
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	total, copies := endMoving(t, js, col, ps)
	after := waitAllSettled(t, st, groups, 30*time.Second)
	final := map[string]int{}
	for _, b := range after {
		final[b.Node]++
	}
	t.Logf("before %s; n2 had %d %v after it joined (%s); %d rebalance moves; settled %s; %d messages processed once, in order (%d drain copies)",
		describeSpread(before), per["n2"], took.Round(time.Millisecond), describeSpread(per), len(rb), describeSpread(final), total, copies)
}

// TestConsumerPresenceAnnouncedAtOnce starts a node whose heartbeat is a
// minute, then a consumer of its queue: the node announces the consumer
// without waiting for its next heartbeat (it looks for one every 100 ms
// while it has none).
func TestConsumerPresenceAnnouncedAtOnce(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	cfg := testConfig("n0", router.Local)
	cfg.Heartbeat = time.Minute
	startNode(t, s.URL(), cfg)
	admin := natstest.Connect(t, s.URL(), nats.Name("test-admin"))
	waitEligible(t, admin, []string{"n0"}, nil)
	col := &timedCollector{}
	started := time.Now()
	startAppConsumer(t, s.URL(), "n0", col)
	waitEligible(t, admin, []string{"n0"}, []string{"n0"})
	t.Logf("consumer announced %v after it started (heartbeat 1m)", time.Since(started).Round(time.Millisecond))
}
