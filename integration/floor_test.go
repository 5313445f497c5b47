package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// The scenario: a group is routed and ends (unbound), its released
// record expires (RecordTTL 1 s here) and the queue stream's duplicate
// window passes (shrunk to 1 s here); then a node without a checkpoint
// joins, and a node comes back with a checkpoint from before the group's
// messages. Neither binds the group again from its old messages: nothing
// is delivered twice. The group's next message binds it afresh, once.
func TestFreshNodeDoesNotRouteAgain(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	cfg1 := testConfig("n1", router.Local)
	cfg1.RecordTTL = time.Second
	startNode(t, s.URL(), cfg1)
	n2 := startNode(t, s.URL(), testConfig("n2", router.Remote)) // no consumer: not chosen
	var col collector
	startConsumer(t, s.URL(), "n1", &col)
	nc := s.Connect()
	js := jetStream(t, s.URL())
	waitEligible(t, nc, []string{"n1", "n2"}, []string{"n1"})

	const window = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	qs, err := js.Stream(ctx, router.QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	qcfg := qs.CachedInfo().Config
	qcfg.Duplicates = window
	if _, err := js.UpdateStream(ctx, qcfg); err != nil {
		t.Fatal(err)
	}

	// n2 reads one message, and stops: its checkpoint ends before g's.
	publish(t, js, "jms.orders", "x", "x1")
	col.waitGroup(t, "x", 1, 20*time.Second)
	natstest.Eventually(t, 10*time.Second, func() error {
		if p := n2.r.Stats().Position; p < 2 {
			return fmt.Errorf("n2 at %d", p)
		}
		return nil
	})
	n2.stop()

	want := map[string][]string{"x": {"x1"}}
	sendBatch(t, js, "g", "first", 3, want)
	col.waitGroup(t, "g", 3, 20*time.Second)
	routedAt := time.Now()
	if _, err := proposals.Move(ctx, nc, "g", "", 10*time.Second); err != nil {
		t.Fatalf("unbind g: %v", err)
	}
	st := openStore(t, nc)
	natstest.Eventually(t, 30*time.Second, func() error {
		b, err := st.Get(ctx, "g")
		if errors.Is(err, kvbinding.ErrNotFound) {
			return nil
		}
		return fmt.Errorf("g's record still there: %+v, %v", b, err)
	})
	// The queue's duplicate window no longer covers g's messages: a
	// second copy would be stored and delivered.
	if wait := 2*window - time.Since(routedAt); wait > 0 {
		<-time.After(wait)
	}
	var floor kvbinding.Floor
	natstest.Eventually(t, 10*time.Second, func() error {
		reg, err := kvbinding.OpenRegistry(ctx, js, kvbinding.RegistryConfig{}, nil)
		if err != nil {
			return err
		}
		if floor, _, err = reg.LoadFloor(ctx); err != nil {
			return err
		}
		if floor.Seq < 5 {
			return fmt.Errorf("routing floor %d, want past g's messages (2-4)", floor.Seq)
		}
		return nil
	})
	t.Logf("routing floor %d, raised by %s", floor.Seq, floor.By)

	// A node without a checkpoint joins; n2 comes back from its old one.
	n3 := startNode(t, s.URL(), testConfig("n3", router.Remote))
	startConsumer(t, s.URL(), "n3", &col)
	n2.restart()
	for _, n := range []*node{n2, n3} {
		natstest.Eventually(t, 20*time.Second, func() error {
			if p := n.r.Stats().Position; p < 5 {
				return fmt.Errorf("%s at %d of 4", n.id, p)
			}
			return nil
		})
	}
	if st := n2.r.Stats(); st.BelowFloor != 3 || st.Routed != 0 {
		t.Errorf("n2 (back from a checkpoint before g): %d below the floor, %d routed; want 3, 0", st.BelowFloor, st.Routed)
	}
	if st := n3.r.Stats(); st.Routed != 0 {
		t.Errorf("n3 (no checkpoint) routed %d", st.Routed)
	}
	if b, err := st.Get(ctx, "g"); !errors.Is(err, kvbinding.ErrNotFound) {
		t.Errorf("g was bound again: %+v, %v", b, err)
	}

	// g's next message binds it afresh, from itself.
	waitEligible(t, nc, []string{"n1", "n2", "n3"}, []string{"n1", "n3"})
	sendBatch(t, js, "g", "next", 1, want)
	b := waitBound(t, st, "g", 20*time.Second)
	if b.FromSeq != 5 {
		t.Errorf("g bound again from %d, want 5 (its new message)", b.FromSeq)
	}
	got := col.waitCount(t, 5, 20*time.Second)
	checkOrderedOnce(t, got, want) // g may be on another node now: it was unbound
	checkQueuedOnce(t, js, 5)
}
