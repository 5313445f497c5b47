package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/router"
)

// TestSpilledFloodKeepsBoundGroupsFlowing: a node whose held messages
// are bounded at 20 reads a flood of 200 new groups while no handler
// answers (the LOCAL node is down). It holds the first ones, then keeps
// only the sequence of the next ones (spills them) and goes on reading:
// a group bound before the flood keeps being delivered, in order, while
// the flood waits. Once the handler is back, the flood's groups are
// decided, their messages read again from the ingress, and every one is
// delivered once, in order. Without spilling the node stops reading after
// 20 messages and the bound group waits behind the flood.
func TestSpilledFloodKeepsBoundGroupsFlowing(t *testing.T) {
	t.Parallel() // see doc.go
	const flood = 200
	s := natstest.RunServer(t)
	n0 := startNode(t, s.URL(), testConfig("n0", router.Local))
	cfg := testConfig("n1", router.Remote)
	cfg.MaxHeldMessages = 20
	n1 := startNode(t, s.URL(), cfg)
	var col collector
	startConsumer(t, s.URL(), "n1", &col) // the only consumer: every group binds to n1
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0", "n1"}, []string{"n1"})
	js := jetStream(t, s.URL())

	want := map[string][]string{}
	sendBatch(t, js, "steady", "before", 3, want)
	col.waitCount(t, 3, 30*time.Second)

	n0.kill() // no handler: new groups wait for a decision
	for i := range flood {
		sendBatch(t, js, fmt.Sprintf("new-%03d", i), "a", 1, want)
	}
	sendBatch(t, js, "steady", "during", 5, want)
	natstest.Eventually(t, 30*time.Second, func() error {
		n := 0
		for _, r := range col.all() {
			if r.group == "steady" {
				n++
			}
		}
		if n < 8 {
			return fmt.Errorf("the bound group has %d of 8 messages delivered behind the flood (n1 spilled %d)", n, n1.r.Stats().Spilled)
		}
		return nil
	})
	st := n1.r.Stats()
	if st.Spilled == 0 || st.Held > cfg.MaxHeldMessages {
		t.Fatalf("n1 holds %d messages and %d spilled; want some spilled, at most %d held", st.Held, st.Spilled, cfg.MaxHeldMessages)
	}
	t.Logf("while no handler answered: %d held, %d spilled (%d bytes)", st.Held, st.Spilled, st.SpilledBytes)
	if n := len(col.all()); n != 8 {
		t.Fatalf("%d messages delivered while no handler answered, want the bound group's 8", n)
	}

	n0.restart()
	checkGrouping(t, col.waitCount(t, 8+flood, 60*time.Second), want)
	checkQueuedOnce(t, js, 8+flood)
	natstest.Eventually(t, 10*time.Second, func() error {
		if st := n1.r.Stats(); st.Spilled != 0 || st.SpilledBytes != 0 || st.Held != 0 {
			return fmt.Errorf("n1 still counts %d held, %d spilled (%d bytes)", st.Held, st.Spilled, st.SpilledBytes)
		}
		return nil
	})
}

// TestSpilledMessageGoneFromTheIngress: a spilled message that expires
// from the ingress before its group is decided (ingress max age 2 s, the
// handler down for longer) cannot be read again: it goes to the
// dead-letter stream without its body, with the reason, and the group's
// later messages are delivered.
func TestSpilledMessageGoneFromTheIngress(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	cfg0 := testConfig("n0", router.Local)
	cfg0.IngressMaxAge = 2 * time.Second
	n0 := startNode(t, s.URL(), cfg0)
	cfg := testConfig("n1", router.Remote)
	cfg.IngressMaxAge = 2 * time.Second
	cfg.MaxHeldMessages = 4
	n1 := startNode(t, s.URL(), cfg)
	var col collector
	startConsumer(t, s.URL(), "n1", &col)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0", "n1"}, []string{"n1"})
	js := jetStream(t, s.URL())

	n0.kill()
	lost := map[string][]string{}
	for i := range 10 {
		sendBatch(t, js, fmt.Sprintf("old-%d", i), "a", 1, lost)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		if st := n1.r.Stats(); st.Spilled == 0 {
			return fmt.Errorf("n1 spilled nothing (%d held)", st.Held)
		}
		return nil
	})
	spilled := n1.r.Stats().Spilled
	natstest.Eventually(t, 20*time.Second, func() error {
		if n := streamState(t, js, router.IngressStream).Msgs; n != 0 {
			return fmt.Errorf("the ingress still holds %d messages", n)
		}
		return nil
	})
	n0.restart()
	dead := waitStreamMsgs(t, js, router.DeadLetterStream, spilled, 30*time.Second)
	for _, m := range dead {
		if g := m.Header.Get("Group-Id"); !strings.HasPrefix(g, "old-") {
			t.Errorf("dead letter %s names group %q", m.Header.Get(router.HeaderIngressSeq), g)
		}
		if r := m.Header.Get(router.HeaderDeadReason); !strings.Contains(r, "no longer holds") || len(m.Data) != 0 {
			t.Errorf("dead letter %s: reason %q, %d body bytes", m.Header.Get(router.HeaderIngressSeq), r, len(m.Data))
		}
	}
	// The held ones (not spilled) are delivered; later messages too.
	want := map[string][]string{}
	sendBatch(t, js, "old-0", "b", 2, want)
	natstest.Eventually(t, 30*time.Second, func() error {
		n := 0
		for _, r := range col.all() {
			if r.group == "old-0" && strings.Contains(r.body, "/b-") {
				n++
			}
		}
		if n < 2 {
			return fmt.Errorf("%d of old-0's 2 later messages delivered", n)
		}
		return nil
	})
	if got := len(col.all()) + len(dead); got < 10+2 {
		t.Errorf("%d delivered and %d dead-lettered, of 12", len(col.all()), len(dead))
	}
	t.Logf("%d spilled and dead-lettered, %d delivered", len(dead), len(col.all()))
}
