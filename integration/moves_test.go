package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// waitAllSettled waits until every record of the groups is bound and
// settled (no move, no hand-over step left), and returns the records.
func waitAllSettled(t testing.TB, st *kvbinding.Store, groups []string, d time.Duration) map[string]kvbinding.Binding {
	t.Helper()
	out := map[string]kvbinding.Binding{}
	natstest.Eventually(t, d, func() error {
		var stuck []string
		for _, g := range groups {
			b, err := st.Get(context.Background(), g)
			if err != nil || !b.Settled() {
				desc := "no record"
				if err == nil {
					desc = fmt.Sprintf("%s step=%q node=%s prev=%s", b.State, b.Step, b.Node, b.PrevNode)
				}
				stuck = append(stuck, g+": "+desc)
				continue
			}
			out[g] = b
		}
		if len(stuck) > 0 {
			return fmt.Errorf("%d groups not settled, e.g. %s", len(stuck), strings.Join(stuck[:min(3, len(stuck))], "; "))
		}
		return nil
	})
	return out
}

// The scenario of a move that stuck under CPU load: three servers, three
// nodes that rebind after 2 s, a consumer per node acking every message,
// 30 groups with one message each; then n2's consumer stops and 5 more
// messages per group are published. Every group bound to n2 moves (its
// waiting messages with it), no record stays moving, and every message is
// processed once, in order. Run it under load (two `yes > /dev/null`) with
// -count to look for stuck moves.
func TestConsumerLeavesOnClusterGroupsMove(t *testing.T) {
	t.Parallel() // see doc.go
	c := natstest.RunCluster(t, 3)
	for i, s := range c.Servers {
		typ := router.Remote
		if i == 0 {
			typ = router.Local
		}
		cfg := testConfig(fmt.Sprintf("n%d", i), typ)
		cfg.RebindAfter = 2 * time.Second
		cfg.NodeGrace = 2 * time.Second
		cfg.QueueAckWait = 2 * time.Second
		startNode(t, s.URL(), cfg)
	}
	col := &timedCollector{}
	consumers := make([]*appConsumer, 3)
	for i, id := range all3 {
		consumers[i] = startAppConsumer(t, c.Servers[i].URL(), id, col)
	}
	admin := natstest.Connect(t, c.URLs(), nats.Name("test-admin"))
	waitEligible(t, admin, all3, all3)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	st := openStore(t, admin)
	want := map[string][]string{}
	groups := make([]string, 30)
	for i := range groups {
		groups[i] = fmt.Sprintf("leave-%02d", i)
		sendBatch(t, js, groups[i], "first", 1, want)
	}
	col.waitConsumed(t, want, 30*time.Second)
	before := waitAllSettled(t, st, groups, 30*time.Second)
	var onN2 []string
	for g, b := range before {
		if b.Node == "n2" {
			onN2 = append(onN2, g)
		}
	}
	if len(onN2) == 0 {
		t.Fatalf("no group bound to n2: %v", before)
	}

	consumers[2].stop()
	stopped := time.Now()
	for _, g := range groups {
		sendBatch(t, js, g, "after", 5, want)
	}
	col.waitConsumed(t, want, 90*time.Second)
	after := waitAllSettled(t, st, groups, 30*time.Second)
	for _, g := range onN2 {
		if after[g].Node == "n2" {
			t.Errorf("group %s is still bound to n2, whose consumer left", g)
		}
	}
	time.Sleep(300 * time.Millisecond) // duplicates, if any, arrive right behind
	checkDelivered(t, col.all(), want, false, false)
	waitQueuesEmpty(t, js, 20*time.Second)
	t.Logf("%d groups moved off n2; every message processed %v after its consumer stopped", len(onN2), time.Since(stopped).Round(time.Millisecond))
}

// TestTakeoverOfManyGroups kills a node that holds about 1,000 groups and
// measures how long its groups take to be routed again by the survivors:
// the time from the kill to the first message of the last group processed
// after it (logged; the assertion is only that every group moved, every
// message was processed once, in order).
func TestTakeoverOfManyGroups(t *testing.T) {
	t.Parallel() // see doc.go
	if testing.Short() {
		t.Skip("-short: takes ~30 s")
	}
	const groupsN = 3000 // about 1,000 per node
	c := natstest.RunCluster(t, 3)
	nodes := make([]*node, 3)
	for i, s := range c.Servers {
		typ := router.Remote
		if i == 0 {
			typ = router.Local
		}
		cfg := testConfig(fmt.Sprintf("n%d", i), typ)
		cfg.NodeGrace = 2 * time.Second
		cfg.QueueAckWait = 2 * time.Second
		// Heartbeats of 100 ms (liveness TTL 1 s) let a live node look
		// gone on a loaded machine while 3,000 groups are decided.
		cfg.Heartbeat = 500 * time.Millisecond
		nodes[i] = startNode(t, s.URL(), cfg)
	}
	col := &timedCollector{}
	for i, id := range all3 {
		startAppConsumer(t, c.Servers[i].URL(), id, col)
	}
	admin := natstest.Connect(t, c.URLs(), nats.Name("test-admin"))
	waitEligible(t, admin, all3, all3)
	js, err := jetstream.New(admin, jetstream.WithPublishAsyncMaxPending(1024))
	if err != nil {
		t.Fatal(err)
	}
	st := openStore(t, admin)
	groups := make([]string, groupsN)
	want := map[string][]string{}
	publishAll := func(tag string) {
		var futures []jetstream.PubAckFuture
		for i, g := range groups {
			if i%500 == 0 {
				select {
				case <-js.PublishAsyncComplete():
				case <-time.After(30 * time.Second):
					t.Fatal("publish acks timed out")
				}
			}
			body := g + "/" + tag
			msg := nats.NewMsg("jms.orders")
			msg.Header.Set("Group-Id", g)
			msg.Data = []byte(body)
			f, err := js.PublishMsgAsync(msg)
			if err != nil {
				t.Fatalf("publish %d: %v", i, err)
			}
			futures = append(futures, f)
			want[g] = append(want[g], body)
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatalf("publish: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("publish ack timed out")
			}
		}
	}
	for i := range groups {
		groups[i] = fmt.Sprintf("many-%04d", i)
	}
	publishAll("a")
	col.waitConsumed(t, want, 120*time.Second)
	before := waitAllSettled(t, st, groups, 60*time.Second)
	// The REMOTE node with the most groups is killed.
	byNode := map[string][]string{}
	for g, b := range before {
		byNode[b.Node] = append(byNode[b.Node], g)
	}
	victim := 1
	if len(byNode["n2"]) > len(byNode["n1"]) {
		victim = 2
	}
	victims := byNode[nodes[victim].id]
	if len(victims) == 0 {
		t.Fatalf("no group bound to n1 or n2 before the kill: %d groups on n0", len(before))
	}
	crash(t, nodes[victim])
	killed := time.Now()
	publishAll("b")
	col.waitConsumed(t, want, 120*time.Second)
	var last time.Time
	isVictim := map[string]bool{}
	for _, g := range victims {
		isVictim[g] = true
	}
	for _, d := range col.all() {
		if isVictim[d.group] && strings.HasSuffix(d.body, "/b") && d.at.After(last) {
			last = d.at
		}
	}
	after := waitAllSettled(t, st, groups, 30*time.Second)
	for _, g := range victims {
		if after[g].Node == nodes[victim].id {
			t.Errorf("group %s still bound to the killed node", g)
		}
	}
	checkDelivered(t, col.all(), want, false, false)
	t.Logf("takeover of %d groups of a killed node (grace 2s): last group's first message processed %v after the kill",
		len(victims), last.Sub(killed).Round(time.Millisecond))
}
