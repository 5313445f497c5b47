package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// TestUnfinishedTakeoverNotRoutedAgainAfterServerRestart: node n1 takes a
// group over and catches up its messages, which its consumer processes,
// but no handler hears that the catch-up is done (the record stays in step
// catchup). Then the NATS server restarts (it rebuilds the queue stream's
// duplicate window from the messages it still stores, and consumed ones
// are gone) and n1 dies. The handler that starts evacuates n1's
// unfinished takeover to n0: n0 must not route the caught-up messages
// again, since the duplicate window would no longer drop them. What n1
// caught up is in its checkpoint, saved before it reports the catch-up.
func TestUnfinishedTakeoverNotRoutedAgainAfterServerRestart(t *testing.T) {
	s := natstest.RunServer(t)
	cfg := func(id string, typ router.HandlerType) router.Config {
		c := testConfig(id, typ)
		c.NodeGrace = 2 * time.Second
		return c
	}
	// A LOCAL node creates the streams and buckets (a REMOTE node does
	// not), then goes away.
	startNode(t, s.URL(), cfg("n0", router.Local)).stop()
	n1 := startNode(t, s.URL(), cfg("n1", router.Remote))
	col := &timedCollector{}
	c1 := startAppConsumer(t, s.URL(), "n1", col)
	nc := s.Connect()
	js := jetStream(t, s.URL())
	st := openStore(t, nc)
	ctx := context.Background()

	// The group belongs to a node that is not there (n9): n1 skips its
	// messages. (The test plays the handler: it writes the records.)
	const g = "taken"
	b, err := st.Create(ctx, kvbinding.Binding{Group: g, State: kvbinding.StateBound, Node: "n9", FromSeq: 1,
		DecidedAt: time.Now().UTC(), DecidedBy: "test"})
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		if r, ok := n1.r.Cache().Lookup(g); !ok || r.Revision != b.Revision {
			return errors.New("n1 has not seen the binding yet")
		}
		return nil
	})
	want := map[string][]string{}
	sendBatch(t, js, g, "before", 10, want)
	natstest.Eventually(t, 10*time.Second, func() error {
		if st := n1.r.Stats(); st.Skipped < 10 {
			return fmt.Errorf("n1 skipped %d of 10", st.Skipped)
		}
		return nil
	})
	// n9 is gone: the group is handed to n1 from its first message, in
	// step catchup. n1 routes the ten messages, its consumer processes
	// them; its report finds no handler.
	if _, err := st.Replace(ctx, kvbinding.Binding{Group: g, State: kvbinding.StateBound, Node: "n1", FromSeq: 1,
		PrevNode: "n9", Step: kvbinding.StepCatchUp, DecidedAt: time.Now().UTC(), DecidedBy: "test"}, b.Revision); err != nil {
		t.Fatal(err)
	}
	col.waitConsumed(t, want, 20*time.Second)
	natstest.Eventually(t, 10*time.Second, func() error {
		c := loadCheckpoint(t, js, "n1")
		if c.Caught[g] < 10 {
			return fmt.Errorf("n1's checkpoint has caught %v", c.Caught)
		}
		return nil
	})
	if r, err := st.Get(ctx, g); err != nil || r.Step != kvbinding.StepCatchUp {
		t.Fatalf("the takeover is finished already (%+v, %v): the test shows nothing", r, err)
	}

	c1.stop()
	crash(t, n1)
	s.Stop()
	s.Restart()

	// A LOCAL node comes: it evacuates n1's unfinished takeover to itself.
	startNode(t, s.URL(), cfg("n0", router.Local))
	startAppConsumer(t, s.URL(), "n0", col)
	natstest.Eventually(t, 30*time.Second, func() error {
		r, err := st.Get(ctx, g)
		if err != nil {
			return err
		}
		if !r.Settled() || r.Node != "n0" {
			return fmt.Errorf("%s is %s on %s step=%q routed=%d", g, r.State, r.Node, r.Step, r.Routed)
		}
		return nil
	})
	sendBatch(t, js, g, "after", 5, want)
	col.waitConsumed(t, want, 30*time.Second)
	time.Sleep(500 * time.Millisecond) // a duplicate, if any, arrives right behind
	checkDelivered(t, col.all(), want, false, false)
}
