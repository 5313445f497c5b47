package integration

// The clustered-grouping scenarios ActiveMQ Artemis tests (see
// shared/research/artemis.md), on three NATS servers with router node n<i>
// on server i: n0 LOCAL, n1 and n2 REMOTE unless a test says otherwise.
// "Sent via server i" means the producer is connected to server i.

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// Artemis 1: one group sent via one server, consumers everywhere.
func TestArtemis01OneGroupFromOneServer(t *testing.T) {
	t.Parallel() // see doc.go
	c, _ := cluster3(t)
	var col collector
	consumeOn(t, c, &col, 0, 1, 2)
	waitEligible(t, c.Servers[0].Connect(), all3, all3)
	js := jetStream(t, c.Servers[0].URL())
	want := map[string][]string{}
	sendBatch(t, js, "g", "s0", 10, want)
	where := checkGrouping(t, col.waitCount(t, 10, 30*time.Second), want)
	checkQueuedOnce(t, js, 10)
	t.Logf("group at %s", where["g"])
}

// Artemis 2: one group sent via servers 0, 1 and 2 in turn.
func TestArtemis02OneGroupFromEveryServer(t *testing.T) {
	t.Parallel() // see doc.go
	c, _ := cluster3(t)
	var col collector
	consumeOn(t, c, &col, 0, 1, 2)
	waitEligible(t, c.Servers[0].Connect(), all3, all3)
	want := map[string][]string{}
	for i, s := range c.Servers {
		sendBatch(t, jetStream(t, s.URL()), "g", fmt.Sprintf("s%d", i), 10, want)
	}
	where := checkGrouping(t, col.waitCount(t, 30, 30*time.Second), want)
	checkQueuedOnce(t, jetStream(t, c.Servers[0].URL()), 30)
	t.Logf("group at %s", where["g"])
}

// Artemis 3: the only consumer is on n1; batches via servers 1, 2, 0.
func TestArtemis03OnlyConsumerOnOneNode(t *testing.T) {
	t.Parallel() // see doc.go
	c, _ := cluster3(t)
	var col collector
	consumeOn(t, c, &col, 1)
	waitEligible(t, c.Servers[0].Connect(), all3, []string{"n1"})
	want := map[string][]string{}
	for _, i := range []int{1, 2, 0} {
		sendBatch(t, jetStream(t, c.Servers[i].URL()), "g", fmt.Sprintf("s%d", i), 10, want)
	}
	where := checkGrouping(t, col.waitCount(t, 30, 30*time.Second), want)
	if where["g"] != "n1" {
		t.Errorf("group at %q, want n1, the only node with a consumer", where["g"])
	}
	checkQueuedOnce(t, jetStream(t, c.Servers[0].URL()), 30)
}

// Artemis 4: consumers on n0 and n2 only, sent via server 1: the group
// lands on n0 or n2, never on n1, and a later batch follows it.
func TestArtemis04SenderNodeWithoutConsumer(t *testing.T) {
	t.Parallel() // see doc.go
	c, _ := cluster3(t)
	var col collector
	consumeOn(t, c, &col, 0, 2)
	waitEligible(t, c.Servers[0].Connect(), all3, []string{"n0", "n2"})
	js := jetStream(t, c.Servers[1].URL())
	want := map[string][]string{}
	sendBatch(t, js, "g", "first", 10, want)
	first := checkGrouping(t, col.waitCount(t, 10, 30*time.Second), want)["g"]
	if first != "n0" && first != "n2" {
		t.Fatalf("group at %q, want n0 or n2 (n1 has no consumer)", first)
	}
	sendBatch(t, js, "g", "later", 10, want)
	if later := checkGrouping(t, col.waitCount(t, 20, 30*time.Second), want)["g"]; later != first {
		t.Errorf("later batch at %q, first at %q", later, first)
	}
	checkQueuedOnce(t, js, 20)
	t.Logf("group at %s", first)
}

// Artemis 5: three groups, one after the other, via server 0: each group
// at one consumer, and the three spread over the three nodes (each new
// group goes to the node holding the fewest groups).
func TestArtemis05ThreeGroupsThreeConsumers(t *testing.T) {
	t.Parallel() // see doc.go
	c, nodes := cluster3(t)
	var col collector
	consumeOn(t, c, &col, 0, 1, 2)
	waitEligible(t, c.Servers[0].Connect(), all3, all3)
	js := jetStream(t, c.Servers[0].URL())
	want := map[string][]string{}
	for i, g := range []string{"ga", "gb", "gc"} {
		sendBatch(t, js, g, "s0", 10, want)
		col.waitCount(t, 10*(i+1), 30*time.Second)
		// Every node knows the binding before the next group is decided,
		// so that the next choice sees this one.
		waitCached(t, nodes, g)
	}
	where := checkGrouping(t, col.all(), want)
	checkQueuedOnce(t, js, 30)
	used := map[string]bool{}
	for _, n := range where {
		used[n] = true
	}
	if len(used) != 3 {
		t.Errorf("groups at %v, want three different nodes", where)
	}
	t.Logf("groups at %v", where)
}

// waitCached waits until every running node's binding cache holds group.
func waitCached(t *testing.T, nodes []*node, group string) {
	t.Helper()
	for _, n := range nodes {
		if n == nil || n.cancel == nil {
			continue
		}
		natstest.Eventually(t, 10*time.Second, func() error {
			if _, ok := n.r.Cache().Lookup(group); !ok {
				return fmt.Errorf("node %s has no binding of %q yet", n.id, group)
			}
			return nil
		})
	}
}

// Artemis 6: nine concurrent senders, groups id0..id8, sender i connected
// to server i%3.
func TestArtemis06ConcurrentSenders(t *testing.T) {
	t.Parallel() // see doc.go
	c, _ := cluster3(t)
	var col collector
	consumeOn(t, c, &col, 0, 1, 2)
	waitEligible(t, c.Servers[0].Connect(), all3, all3)
	want := map[string][]string{}
	jss := make([]jetstream.JetStream, 9)
	for i := range jss {
		g := fmt.Sprintf("id%d", i)
		want[g] = bodies(g, 10)
		jss[i] = jetStream(t, c.Servers[i%3].URL())
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(jss))
	start := make(chan struct{})
	for i, js := range jss {
		g := fmt.Sprintf("id%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for _, b := range want[g] {
				if err := tryPublish(js, "jms.orders", g, b); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	where := checkGrouping(t, col.waitCount(t, 90, 30*time.Second), want)
	checkQueuedOnce(t, jss[0], 90)
	perNode := map[string][]string{}
	for g, n := range where {
		perNode[n] = append(perNode[n], g)
	}
	for _, gs := range perNode {
		sort.Strings(gs)
	}
	t.Logf("groups per node: %v", perNode)
}

// Artemis 10: every node is stopped (gracefully) and restarted. Bindings
// survive unchanged, messages sent while no node ran are routed after the
// restart, and later messages of each group go where the earlier ones
// went. A node is ready without waiting for the others (REMOTE nodes are
// restarted first, the LOCAL one last).
func TestArtemis10AllNodesRestart(t *testing.T) {
	t.Parallel() // see doc.go
	c, nodes := cluster3(t)
	var col collector
	consumeOn(t, c, &col, 0, 1, 2)
	nc := c.Servers[0].Connect()
	waitEligible(t, nc, all3, all3)
	st := openStore(t, nc)
	want := map[string][]string{}
	groups := []string{"g0", "g1", "g2", "g3", "g4", "g5"}
	for i, g := range groups {
		sendBatch(t, jetStream(t, c.Servers[i%3].URL()), g, "before", 5, want)
	}
	before := checkGrouping(t, col.waitCount(t, 30, 30*time.Second), want)
	bindings := listBindings(t, st)

	for _, n := range nodes {
		n.stop()
	}
	js := jetStream(t, c.Servers[1].URL())
	for _, g := range groups {
		sendBatch(t, js, g, "while-down", 3, want)
	}
	for _, i := range []int{2, 1, 0} {
		start := time.Now()
		nodes[i].restart()
		t.Logf("node %s (%s) ready %v after restart", nodes[i].id, nodes[i].cfg.Type, time.Since(start).Round(time.Millisecond))
	}
	waitEligible(t, nc, all3, all3)
	if after := listBindings(t, st); !sameBindings(t, bindings, after) {
		t.Errorf("bindings changed across the restart")
	}
	for i, g := range groups {
		sendBatch(t, jetStream(t, c.Servers[(i+1)%3].URL()), g, "after", 5, want)
	}
	after := checkGrouping(t, col.waitCount(t, 6*13, 30*time.Second), want)
	for _, g := range groups {
		if after[g] != before[g] {
			t.Errorf("group %s moved from %s to %s across the restart", g, before[g], after[g])
		}
	}
	checkQueuedOnce(t, js, 6*13)
	sameBindings(t, bindings, listBindings(t, st))
}

// sameBindings reports (and logs) whether two listings of the bindings are
// identical, revisions included.
func sameBindings(t *testing.T, a, b map[string]kvbinding.Binding) bool {
	t.Helper()
	same := len(a) == len(b)
	for g, x := range a {
		y, ok := b[g]
		if !ok || x.Node != y.Node || x.State != y.State || x.FromSeq != y.FromSeq || x.Revision != y.Revision {
			t.Errorf("binding of %q: was %+v, now %+v", g, x, y)
			same = false
		}
	}
	for g := range b {
		if _, ok := a[g]; !ok {
			t.Errorf("new binding of %q: %+v", g, b[g])
			same = false
		}
	}
	return same
}

// Artemis 13: messages without a group id are routed normally (each once,
// spread over the nodes with consumers), and grouped traffic alongside
// stays grouped.
func TestArtemis13UngroupedAlongsideGrouped(t *testing.T) {
	t.Parallel() // see doc.go
	c, _ := cluster3(t)
	var col collector
	consumeOn(t, c, &col, 0, 1, 2)
	waitEligible(t, c.Servers[0].Connect(), all3, all3)
	want := map[string][]string{}
	ungrouped := bodies("plain", 30)
	groups := []string{"ga", "gb", "gc"}
	for k, b := range ungrouped {
		js := jetStream(t, c.Servers[k%3].URL())
		publish(t, js, "jms.orders", "", b)
		if k%3 == 0 {
			g := groups[(k/3)%3]
			sendBatch(t, js, g, fmt.Sprintf("k%02d", k), 1, want)
		}
	}
	total := len(ungrouped) + 10
	got := col.waitCount(t, total, 30*time.Second)
	var grouped []received
	seen := map[string]int{}
	perNode := map[string]int{}
	for _, r := range got {
		if r.group != "" {
			grouped = append(grouped, r)
			continue
		}
		seen[r.body]++
		perNode[r.node]++
	}
	for _, b := range ungrouped {
		if seen[b] != 1 {
			t.Errorf("ungrouped %q received %d times, want once", b, seen[b])
		}
	}
	if len(perNode) < 2 {
		t.Errorf("ungrouped messages all on %v, want them spread over more than one node", perNode)
	}
	where := checkGrouping(t, grouped, want)
	checkQueuedOnce(t, jetStream(t, c.Servers[0].URL()), total)
	t.Logf("ungrouped per node: %v; groups at %v", perNode, where)
}
