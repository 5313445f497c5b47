package integration

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// producer publishes numbered messages round-robin over groups until
// stopped, recording what each group should receive.
type producer struct {
	mu     sync.Mutex
	want   map[string][]string
	stop   chan struct{}
	done   chan struct{}
	errors int
}

func startProducer(t *testing.T, url string, groups []string, every time.Duration) *producer {
	t.Helper()
	js := jetStream(t, url)
	p := &producer{want: map[string][]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			case <-time.After(every):
			}
			g := groups[i%len(groups)]
			p.mu.Lock()
			body := fmt.Sprintf("%s/%05d", g, len(p.want[g]))
			p.mu.Unlock()
			if err := tryPublish(js, "jms.orders", g, body); err != nil {
				// Not acknowledged: it may or may not be stored. Give up on
				// this body (the test then cannot tell) by stopping.
				p.mu.Lock()
				p.errors++
				p.mu.Unlock()
				return
			}
			p.mu.Lock()
			p.want[g] = append(p.want[g], body)
			p.mu.Unlock()
		}
	}()
	t.Cleanup(p.halt)
	return p
}

func (p *producer) halt() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

func (p *producer) total() (map[string][]string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	out := map[string][]string{}
	for g, b := range p.want {
		out[g] = append([]string(nil), b...)
		n += len(b)
	}
	return out, n
}

// A node process is killed mid-stream, with its consumer (machine loss):
// after the grace period its groups move, with what waited on its queue
// and what it never routed, in order, nothing lost or duplicated.
func TestNodeKilledGroupsMoveAfterGrace(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	_, n1, col, stop1, nc := threeNodesOnOneServer(t, s, lifecycleConfig)
	handoffs := watchEvents(t, nc, proposals.EventHandoff)
	groups := make([]string, 12)
	for i := range groups {
		groups[i] = fmt.Sprintf("g%02d", i)
	}
	p := startProducer(t, s.URL(), groups, 2*time.Millisecond)
	col.waitCount(t, 200, 20*time.Second)
	st := openStore(t, nc)
	var onN1 []string
	for _, g := range groups {
		if waitBound(t, st, g, 5*time.Second).Node == "n1" {
			onN1 = append(onN1, g)
		}
	}
	if len(onN1) == 0 {
		t.Fatal("no group on n1")
	}
	killed := time.Now()
	stop1()
	n1.kill()
	for _, g := range onN1 {
		handoffs.waitGroup(t, g, 30*time.Second)
	}
	t.Logf("groups of the killed node routed again %v after the kill (grace %v)", time.Since(killed), n1.cfg.NodeGrace)
	time.Sleep(500 * time.Millisecond) // keep producing after the move
	p.halt()
	want, n := p.total()
	if p.errors > 0 {
		t.Fatalf("producer saw %d publish errors", p.errors)
	}
	got := col.waitCount(t, n, 30*time.Second)
	where := checkOrderedOnce(t, got, want)
	for _, g := range onN1 {
		if w := where[g]; w[len(w)-1] == "n1" {
			t.Errorf("group %q still ends on the dead node: %v", g, w)
		}
	}
	if st := streamState(t, jetStream(t, s.URL()), router.QueueStream); st.Msgs != 0 {
		t.Errorf("%d messages left on queues", st.Msgs)
	}
}

// A node dies (machine loss: node and consumer) while new groups keep
// starting. Until its liveness record expires the handler still binds
// some of them to it; nothing of theirs is covered by its last checkpoint,
// so waiting for the node to come back saves nothing. They are taken off
// as soon as the node leaves the live set, not after the grace: every
// message of theirs is delivered before the first of the node's older
// groups moves at the grace. Before, they waited out the grace (15 s by
// default) for their first delivery.
func TestNodeKilledNewGroupsMoveWithoutTheGrace(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	cfg := func(id string, typ router.HandlerType) router.Config {
		c := lifecycleConfig(id, typ)
		// Early moves are delivered 1.4–1.8 s after the kill on a quiet
		// machine and ~3.7 s in about one run in four beside two busy
		// loops (an ack wait of 2 s more), before and after 9d01853
		// alike; a loaded CI machine took 7.7–9.3 s once with a 5 s
		// grace. The claim is the order (early moves before the grace's),
		// so the grace leaves room for the load.
		c.NodeGrace = 10 * time.Second
		return c
	}
	n0, n1, col, stop1, nc := threeNodesOnOneServer(t, s, cfg)
	moves := watchEvents(t, nc, proposals.EventMove)
	old := startProducer(t, s.URL(), groupNames(12), 2*time.Millisecond)
	col.waitCount(t, 200, 20*time.Second)
	// New groups: one every 10 ms, each with three messages.
	fresh := make([]string, 600)
	for i := range fresh {
		fresh[i] = fmt.Sprintf("new%03d", i)
	}
	js := jetStream(t, s.URL())
	freshWant := map[string][]string{}
	var freshMu sync.Mutex
	freshDone := make(chan error, 1)
	go func() {
		for _, g := range fresh {
			bodies := []string{g + "/0", g + "/1", g + "/2"}
			if err := tryPublish(js, "jms.orders", g, bodies...); err != nil {
				freshDone <- err
				return
			}
			freshMu.Lock()
			freshWant[g] = bodies
			freshMu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
		freshDone <- nil
	}()
	time.Sleep(time.Second) // new groups bound to n1 while it lives
	// The node first: a node that outlived its consumer would announce
	// that it has none, and the handler would bind nothing new to it.
	n1.kill()
	killed := time.Now()
	stop1()
	if err := <-freshDone; err != nil {
		t.Fatal(err)
	}
	// The early moves name the node's new groups; the grace's come later.
	var early []string
	var graceAt time.Time
	natstest.Eventually(t, 60*time.Second, func() error {
		moves.mu.Lock()
		defer moves.mu.Unlock()
		early, graceAt = early[:0], time.Time{}
		for _, e := range moves.evs {
			switch {
			case e.PrevNode != "n1":
			case strings.Contains(e.Reason, "bound after its last checkpoint"):
				early = append(early, e.Group)
			case strings.Contains(e.Reason, "gone for") && (graceAt.IsZero() || e.At.Before(graceAt)):
				graceAt = e.At
			}
		}
		if graceAt.IsZero() {
			return errors.New("n1's older groups not moved at the grace yet")
		}
		return nil
	})
	if len(early) == 0 {
		t.Fatalf("no group of the dead node was moved before the grace: the test shows nothing; the handler's log:\n%s", n0.log.tail(16<<10))
	}
	old.halt()
	want, n := old.total()
	freshMu.Lock()
	for g, b := range freshWant {
		want[g] = b
		n += len(b)
	}
	freshMu.Unlock()
	got := col.waitCount(t, n, 60*time.Second)
	checkOrderedOnce(t, got, want)
	last := map[string]time.Time{}
	for _, r := range got {
		if r.at.After(last[r.group]) {
			last[r.group] = r.at
		}
	}
	var slowest time.Duration
	for _, g := range early {
		if !strings.HasPrefix(g, "new") {
			continue
		}
		if !last[g].Before(graceAt) {
			t.Errorf("group %s, bound to n1 after its checkpoint, was delivered whole only %v after the kill, once the grace had passed",
				g, last[g].Sub(killed).Round(time.Millisecond))
		}
		slowest = max(slowest, last[g].Sub(killed))
	}
	t.Logf("%d groups taken off the dead node early; the slowest delivered whole %v after the kill; the grace's moves began %v after it",
		len(early), slowest.Round(time.Millisecond), graceAt.Sub(killed).Round(time.Millisecond))
}

// threeNodesOnOneServer starts n0 (LOCAL), n1 and n2 (REMOTE) on s with
// the configurations cfg gives, a consumer on each node's queue into one
// collector, and waits until all three are eligible. It returns n0 and n1,
// the collector, what stops n1's consumer and a connection to s.
func threeNodesOnOneServer(t *testing.T, s *natstest.Server, cfg func(string, router.HandlerType) router.Config) (*node, *node, *collector, func(), *nats.Conn) {
	t.Helper()
	n0 := startNode(t, s.URL(), cfg("n0", router.Local))
	n1 := startNode(t, s.URL(), cfg("n1", router.Remote))
	startNode(t, s.URL(), cfg("n2", router.Remote))
	col := &collector{}
	startConsumer(t, s.URL(), "n0", col)
	stop1 := startConsumer(t, s.URL(), "n1", col)
	startConsumer(t, s.URL(), "n2", col)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0", "n1", "n2"}, []string{"n0", "n1", "n2"})
	return n0, n1, col, stop1, nc
}
