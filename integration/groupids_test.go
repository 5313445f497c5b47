package integration

// Group ids are arbitrary UTF-8 of 1 to 1024 bytes (kvbinding.Key maps
// them injectively to KV keys); anything else is dead-lettered.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// Odd but valid group ids are bound under their exact id and their
// messages delivered in order with the header value intact.
func TestOddGroupIDsRoundTrip(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	startNode(t, s.URL(), testConfig("n0", router.Local))
	var col collector
	startConsumer(t, s.URL(), "n0", &col)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0"}, []string{"n0"})
	js := jetStream(t, s.URL())
	st := openStore(t, nc)

	ids := []string{
		"a.b.c", "orders.*", "orders.>", "*", ">", "two words", "with/slash", "order:42",
		"Zürich ✓", "日本", "==", "r.x", "b.x", "r.", "b.", "ungrouped", "-_=",
		strings.Repeat("x", kvbinding.MaxGroupIDLen),     // longest plain id: key "r.xxx…"
		strings.Repeat("é", kvbinding.MaxGroupIDLen/2),   // longest non-plain id: key "b.<base64>"
		strings.Repeat("日本.", kvbinding.MaxGroupIDLen/7), // 1022 bytes
	}
	// The Go client trims leading and trailing ASCII whitespace from header
	// values when it writes them (nats.go writeHeaderValue uses
	// textproto.TrimString), so " lead space" is stored on the ingress, and
	// therefore bound and delivered, as "lead space". Such ids cannot be
	// told apart from their trimmed form.
	const leadSpace = " lead space"
	want := map[string][]string{}
	for i, id := range append(ids, leadSpace) {
		b := bodies(fmt.Sprintf("id%02d", i), 3)
		publish(t, js, "jms.orders", id, b...)
		want[strings.TrimSpace(id)] = b
	}
	total := 3 * (len(ids) + 1)
	checkGrouping(t, col.waitCount(t, total, 30*time.Second), want)
	checkQueuedOnce(t, js, total)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for id := range want {
		b, err := st.Get(ctx, id)
		if err != nil {
			t.Errorf("binding of %q: %v", short(id), err)
			continue
		}
		if b.Group != id || b.State != kvbinding.StateBound || b.Node != "n0" {
			t.Errorf("binding of %q is %+v", short(id), b)
		}
	}
	if _, err := st.Get(ctx, leadSpace); !errors.Is(err, kvbinding.ErrNotFound) {
		t.Errorf("binding of %q (untrimmed): err=%v, want not found", leadSpace, err)
	}
	all := listBindings(t, st)
	for g := range all {
		if _, ok := want[g]; !ok {
			t.Errorf("unexpected binding of %q", short(g))
		}
	}
	if len(all) != len(want) {
		t.Errorf("%d bindings, want %d", len(all), len(want))
	}
}

// A message whose group id is unusable (too long, not UTF-8) goes to the
// dead-letter stream with a reason, is not lost, and does not hold up the
// groups published around it.
func TestInvalidGroupIDsDeadLettered(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	startNode(t, s.URL(), testConfig("n0", router.Local))
	var col collector
	startConsumer(t, s.URL(), "n0", &col)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0"}, []string{"n0"})
	js := jetStream(t, s.URL())

	invalid := []string{
		strings.Repeat("y", kvbinding.MaxGroupIDLen+1),
		"bad \xff\xfe utf-8",
	}
	want := map[string][]string{}
	dead := map[string][]string{} // by invalid id, in publish order
	for i, id := range invalid {
		sendBatch(t, js, fmt.Sprintf("before%d", i), "x", 3, want)
		b := bodies(fmt.Sprintf("invalid%d", i), 2)
		publish(t, js, "jms.orders", id, b...)
		dead[id] = b
		sendBatch(t, js, fmt.Sprintf("after%d", i), "x", 3, want)
	}
	checkGrouping(t, col.waitCount(t, 12, 30*time.Second), want)
	checkQueuedOnce(t, js, 12)

	// Each id's messages in order; two ids are two lanes, dead-lettered
	// side by side, so there is no order between them.
	dlq := waitStreamMsgs(t, js, router.DeadLetterStream, 2*len(invalid), 20*time.Second)
	got := map[string][]string{}
	for i, m := range dlq {
		id := m.Header.Get("Group-Id")
		got[id] = append(got[id], string(m.Data))
		if m.Header.Get(router.HeaderDeadReason) == "" {
			t.Errorf("dead letter %d has no %s header", i, router.HeaderDeadReason)
		}
		t.Logf("dead letter %d: %s", i, m.Header.Get(router.HeaderDeadReason))
	}
	for _, id := range invalid {
		if !slices.Equal(got[id], dead[id]) {
			t.Errorf("dead letters of %q: %q, want %q", short(id), got[id], dead[id])
		}
	}
	if len(dlq) != 2*len(invalid) {
		t.Errorf("dead-letter stream holds %d messages, want %d", len(dlq), 2*len(invalid))
	}
}

// short abbreviates long ids in messages.
func short(id string) string {
	if len(id) > 40 {
		return fmt.Sprintf("%s…(%d bytes)", id[:20], len(id))
	}
	return id
}

// The node that proposes a new group is chosen by a rendezvous hash of the
// group id over the live nodes, so that the proposing work (and the
// Timeout wait when that node has just died) is spread evenly. Ids that
// share a prefix, as real ids do ("order-0".."order-59"), must spread too.
func TestProposerRoleSpreadOverNodes(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	startNode(t, s.URL(), testConfig("n0", router.Local))
	startNode(t, s.URL(), testConfig("n1", router.Remote))
	startNode(t, s.URL(), testConfig("n2", router.Remote))
	var col collector
	for _, n := range all3 {
		startConsumer(t, s.URL(), n, &col)
	}
	nc := s.Connect()
	waitEligible(t, nc, all3, all3)
	st := openStore(t, nc)
	js := jetStream(t, s.URL())
	const groups = 60
	want := map[string][]string{}
	for i := 0; i < groups; i++ {
		sendBatch(t, js, fmt.Sprintf("order-%d", i), "x", 1, want)
	}
	checkGrouping(t, col.waitCount(t, groups, 30*time.Second), want)
	proposedBy := map[string]int{}
	for g := range want {
		proposedBy[waitBound(t, st, g, 10*time.Second).ProposedBy]++
	}
	t.Logf("proposals per node: %v", proposedBy)
	for _, n := range all3 {
		if proposedBy[n] < groups/10 {
			t.Errorf("node %s proposed %d of %d groups (%v), want about a third each: the rendezvous hash (FNV-1a of node+group, compared raw) is skewed for ids sharing a prefix",
				n, proposedBy[n], groups, proposedBy)
		}
	}
}
