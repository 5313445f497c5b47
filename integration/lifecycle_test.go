package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// checkOrderedOnce asserts that each group's messages were received
// exactly once and in order, whichever nodes they came from (a group may
// move), and returns the nodes each group was received on, in order.
func checkOrderedOnce(t testing.TB, got []received, want map[string][]string) map[string][]string {
	t.Helper()
	byGroup := map[string][]received{}
	for _, r := range got {
		byGroup[r.group] = append(byGroup[r.group], r)
	}
	where := map[string][]string{}
	for g, wantBodies := range want {
		rs := byGroup[g]
		if len(rs) != len(wantBodies) {
			t.Errorf("group %q: received %d messages, want %d", g, len(rs), len(wantBodies))
		}
		for i := 0; i < len(rs) && i < len(wantBodies); i++ {
			if rs[i].body != wantBodies[i] {
				t.Errorf("group %q: message %d is %q, want %q (order broken or duplicate)", g, i, rs[i].body, wantBodies[i])
				break
			}
		}
		for _, r := range rs {
			if n := where[g]; len(n) == 0 || n[len(n)-1] != r.node {
				where[g] = append(where[g], r.node)
			}
		}
	}
	return where
}

func lifecycleConfig(node string, typ router.HandlerType) router.Config {
	cfg := testConfig(node, typ)
	cfg.NodeGrace = 2 * time.Second
	cfg.RebindAfter = time.Second
	cfg.QueueAckWait = 2 * time.Second
	return cfg
}

// The Artemis failure, fixed: a node's consumer leaves; its groups and the
// messages waiting on its queue move to a node with a consumer, in order.
func TestConsumerLeavesGroupsAndBacklogMove(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	startNode(t, s.URL(), lifecycleConfig("n0", router.Local))
	startNode(t, s.URL(), lifecycleConfig("n1", router.Remote))
	var col collector
	startConsumer(t, s.URL(), "n0", &col)
	stop1 := startConsumer(t, s.URL(), "n1", &col)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0", "n1"}, []string{"n0", "n1"})
	moves := watchEvents(t, nc, proposals.EventHandoff)
	js := jetStream(t, s.URL())
	want := map[string][]string{}
	groups := []string{"a", "b", "c", "d"}
	for _, g := range groups {
		sendBatch(t, js, g, "before", 5, want)
	}
	col.waitCount(t, 20, 20*time.Second)
	st := openStore(t, nc)
	var onN1 []string
	for _, g := range groups {
		if waitBound(t, st, g, 5*time.Second).Node == "n1" {
			onN1 = append(onN1, g)
		}
	}
	if len(onN1) == 0 {
		t.Fatal("no group bound to n1: the test cannot show a move")
	}
	stop1()
	// These wait on n1's queue: nobody consumes it any more.
	for _, g := range groups {
		sendBatch(t, js, g, "during", 5, want)
	}
	for _, g := range onN1 {
		moves.waitGroup(t, g, 30*time.Second)
	}
	for _, g := range groups {
		sendBatch(t, js, g, "after", 5, want)
	}
	got := col.waitCount(t, 60, 30*time.Second)
	where := checkOrderedOnce(t, got, want)
	for _, g := range onN1 {
		if b := waitBound(t, st, g, 5*time.Second); b.Node != "n0" || !b.Settled() {
			t.Errorf("group %q after the move: %+v, want bound to n0", g, b)
		}
		if w := where[g]; w[len(w)-1] != "n0" {
			t.Errorf("group %q received on %v, want it to end on n0", g, w)
		}
	}
	if st := streamState(t, js, router.QueueStream); st.Msgs != 0 {
		t.Errorf("%d messages left on queues, want none stranded", st.Msgs)
	}
}

// Artemis scenario 7: idle bindings expire everywhere; after the consumer
// moved, the groups bind to the new place.
func TestIdleBindingsExpireAndRebind(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	cfg0 := lifecycleConfig("n0", router.Local)
	cfg1 := lifecycleConfig("n1", router.Remote)
	for _, c := range []*router.Config{&cfg0, &cfg1} {
		c.GroupTimeout = time.Second
		c.ReaperPeriod = 100 * time.Millisecond
		c.RebindAfter = -1 // only expiry moves groups here
	}
	n0 := startNode(t, s.URL(), cfg0)
	n1 := startNode(t, s.URL(), cfg1)
	var col collector
	stop0 := startConsumer(t, s.URL(), "n0", &col)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0", "n1"}, []string{"n0"})
	expired := watchEvents(t, nc, proposals.EventExpire)
	js := jetStream(t, s.URL())
	want := map[string][]string{}
	sendBatch(t, js, "x", "first", 3, want)
	sendBatch(t, js, "y", "first", 3, want)
	col.waitCount(t, 6, 20*time.Second)
	st := openStore(t, nc)
	if b := waitBound(t, st, "x", 5*time.Second); b.Node != "n0" {
		t.Fatalf("x bound to %s, want n0 (the only consumer)", b.Node)
	}
	expired.waitGroup(t, "x", 10*time.Second)
	expired.waitGroup(t, "y", 10*time.Second)
	// Every cache drops the binding.
	natstest.Eventually(t, 5*time.Second, func() error {
		for _, n := range []*node{n0, n1} {
			if r, ok := n.r.Cache().Lookup("x"); ok && r.State == kvbinding.StateBound {
				return fmt.Errorf("%s still caches x as bound", n.id)
			}
		}
		return nil
	})
	// Move the consumer to n1: the groups bind there now.
	stop0()
	startConsumer(t, s.URL(), "n1", &col)
	waitEligible(t, nc, []string{"n0", "n1"}, []string{"n1"})
	sendBatch(t, js, "x", "second", 3, want)
	sendBatch(t, js, "y", "second", 3, want)
	got := col.waitCount(t, 12, 20*time.Second)
	where := checkOrderedOnce(t, got, want)
	for _, g := range []string{"x", "y"} {
		if w := where[g]; len(w) != 2 || w[0] != "n0" || w[1] != "n1" {
			t.Errorf("group %q received on %v, want n0 then n1", g, w)
		}
	}
}

// A Group-Seq: -1 message is delivered, then the group's binding is
// released cluster-wide; the next message binds again.
func TestCloseMarkerReleasesGroup(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	startNode(t, s.URL(), lifecycleConfig("n0", router.Local))
	startNode(t, s.URL(), lifecycleConfig("n1", router.Remote))
	var col collector
	startConsumer(t, s.URL(), "n0", &col)
	startConsumer(t, s.URL(), "n1", &col)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0", "n1"}, []string{"n0", "n1"})
	closed := watchEvents(t, nc, proposals.EventClose)
	js := jetStream(t, s.URL())
	want := map[string][]string{}
	sendBatch(t, js, "order-1", "open", 3, want)
	m := natsMsg("jms.orders", "order-1", "order-1/close")
	m.Header.Set(router.HeaderGroupSeq, "-1")
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	want["order-1"] = append(want["order-1"], "order-1/close")
	sendBatch(t, js, "order-1", "reopened", 3, want)
	ev := closed.waitGroup(t, "order-1", 10*time.Second)
	got := col.waitCount(t, 7, 20*time.Second)
	checkOrderedOnce(t, got, want)
	st := openStore(t, nc)
	b := waitBound(t, st, "order-1", 5*time.Second)
	if b.FromSeq <= ev.FromSeq {
		t.Errorf("binding after close starts at %d, want after the close marker at %d", b.FromSeq, ev.FromSeq)
	}
}

// grouprouter move/unbind: the same order-preserving hand-over, and clear
// errors for an unknown group or an ineligible node.
func TestOperatorMoveAndUnbind(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	startNode(t, s.URL(), lifecycleConfig("n0", router.Local))
	startNode(t, s.URL(), lifecycleConfig("n1", router.Remote))
	startNode(t, s.URL(), lifecycleConfig("n2", router.Remote))
	var col collector
	startConsumer(t, s.URL(), "n0", &col)
	startConsumer(t, s.URL(), "n1", &col)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0", "n1", "n2"}, []string{"n0", "n1"})
	js := jetStream(t, s.URL())
	want := map[string][]string{}
	sendBatch(t, js, "g", "one", 5, want)
	col.waitCount(t, 5, 20*time.Second)
	st := openStore(t, nc)
	from := waitBound(t, st, "g", 5*time.Second).Node
	to := map[string]string{"n0": "n1", "n1": "n0"}[from]
	ctx := context.Background()
	if _, err := proposals.Move(ctx, nc, "nope", to, 5*time.Second); !errors.Is(err, proposals.ErrUnknownGroup) {
		t.Errorf("move of an unknown group: %v, want ErrUnknownGroup", err)
	}
	if _, err := proposals.Move(ctx, nc, "g", "n2", 5*time.Second); !errors.Is(err, proposals.ErrIneligibleNode) {
		t.Errorf("move to a node without consumer: %v, want ErrIneligibleNode", err)
	}
	if _, err := proposals.Move(ctx, nc, "g", "n9", 5*time.Second); !errors.Is(err, proposals.ErrIneligibleNode) {
		t.Errorf("move to an unknown node: %v, want ErrIneligibleNode", err)
	}
	if _, err := proposals.Move(ctx, nc, "g", to, 5*time.Second); err != nil {
		t.Fatalf("move: %v", err)
	}
	natstest.Eventually(t, 20*time.Second, func() error {
		b, err := st.Get(ctx, "g")
		if err != nil {
			return err
		}
		if !b.Settled() || b.Node != to {
			return fmt.Errorf("g is %+v", b)
		}
		return nil
	})
	sendBatch(t, js, "g", "two", 5, want)
	got := col.waitCount(t, 10, 20*time.Second)
	where := checkOrderedOnce(t, got, want)
	if w := where["g"]; len(w) != 2 || w[1] != to {
		t.Errorf("g received on %v, want %s then %s", w, from, to)
	}
	if _, err := proposals.Move(ctx, nc, "g", "", 5*time.Second); err != nil {
		t.Fatalf("unbind: %v", err)
	}
	natstest.Eventually(t, 20*time.Second, func() error {
		b, err := st.Get(ctx, "g")
		if err != nil {
			return err
		}
		if b.State != kvbinding.StateReleased {
			return fmt.Errorf("g is %s", b.State)
		}
		return nil
	})
	sendBatch(t, js, "g", "three", 5, want)
	got = col.waitCount(t, 15, 20*time.Second)
	checkOrderedOnce(t, got, want)
}

func natsMsg(subject, group, body string) *nats.Msg {
	m := nats.NewMsg(subject)
	if group != "" {
		m.Header.Set("Group-Id", group)
	}
	m.Data = []byte(body)
	return m
}
