package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/router"
)

// cluster3 starts three NATS servers and one router node on each: n0
// LOCAL, n1 and n2 REMOTE.
func cluster3(t *testing.T) (*natstest.Cluster, []*node) {
	t.Helper()
	return clusterOf(t, "LRR")
}

// clusterOf starts one NATS server per letter of layout and, on server i,
// router node "n<i>": L for LOCAL, R for REMOTE, '-' for none (nil in the
// returned slice; start it later with startNode).
func clusterOf(t *testing.T, layout string) (*natstest.Cluster, []*node) {
	t.Helper()
	c := natstest.RunCluster(t, len(layout))
	nodes := make([]*node, len(layout))
	for i, s := range c.Servers {
		switch layout[i] {
		case 'L':
			nodes[i] = startNode(t, s.URL(), testConfig(fmt.Sprintf("n%d", i), router.Local))
		case 'R':
			nodes[i] = startNode(t, s.URL(), testConfig(fmt.Sprintf("n%d", i), router.Remote))
		case '-':
		default:
			t.Fatalf("clusterOf: bad layout %q", layout)
		}
	}
	return c, nodes
}

// Artemis scenario 5/6 flavour: many groups from every server, consumers
// everywhere: each group at one consumer, in order, spread over nodes.
func TestClusterGroupsSpreadAndStayInOrder(t *testing.T) {
	t.Parallel() // see doc.go
	c, _ := cluster3(t)
	var col collector
	for i, s := range c.Servers {
		startConsumer(t, s.URL(), fmt.Sprintf("n%d", i), &col)
	}
	nc := c.Servers[0].Connect()
	waitEligible(t, nc, []string{"n0", "n1", "n2"}, []string{"n0", "n1", "n2"})
	want := map[string][]string{}
	total := 0
	for i := 0; i < 9; i++ {
		g := fmt.Sprintf("id%d", i)
		want[g] = bodies(g, 10)
		total += 10
	}
	// Interleave groups and entry servers.
	jss := make([]jetstream.JetStream, 3)
	for i, s := range c.Servers {
		jss[i], _ = jetstream.New(s.Connect())
	}
	for k := 0; k < 10; k++ {
		for i := 0; i < 9; i++ {
			g := fmt.Sprintf("id%d", i)
			publish(t, jss[(i+k)%3], "jms.orders", g, want[g][k])
		}
	}
	got := col.waitCount(t, total, 30*time.Second)
	where := checkGrouping(t, got, want)
	perNode := map[string]int{}
	for _, n := range where {
		perNode[n]++
	}
	if len(perNode) != 3 {
		t.Errorf("groups spread over %v, want all three nodes", perNode)
	}
	t.Logf("groups per node: %v", perNode)
}

// all3 names the nodes of a three-node cluster.
var all3 = []string{"n0", "n1", "n2"}

// consumeOn starts, for each index i, an application consumer of node
// n<i>'s queue connected to server i.
func consumeOn(t *testing.T, c *natstest.Cluster, col *collector, idx ...int) {
	t.Helper()
	for _, i := range idx {
		startConsumer(t, c.Servers[i].URL(), fmt.Sprintf("n%d", i), col)
	}
}
