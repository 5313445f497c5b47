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
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// TestGroupLimit: a flood of new groups against a cluster whose group
// limit is 20 (3 servers, 3 nodes; the LOCAL handler and its backup both
// have the limit). A group bound before the flood keeps flowing, in order.
// Of the flood's groups, as many are bound as the limit leaves room for,
// and every other one's messages are dead-lettered with the reason:
// every message is either delivered once, in order, or in the dead-letter
// stream once, never both and never neither. The bucket never holds more
// bound groups than the limit, and a "limit" event is published. Once
// groups close, new groups are bound again.
func TestGroupLimit(t *testing.T) {
	t.Parallel() // see doc.go
	const limit, flood = 20, 150
	c := natstest.RunCluster(t, 3)
	for i, s := range c.Servers {
		typ := router.Remote
		if i < 2 {
			typ = router.Local
		}
		cfg := testConfig(fmt.Sprintf("n%d", i), typ)
		cfg.MaxGroups = limit
		startNode(t, s.URL(), cfg)
	}
	var col collector
	for i, id := range all3 {
		startConsumer(t, c.Servers[i].URL(), id, &col)
	}
	admin := natstest.Connect(t, c.URLs(), nats.Name("test-admin"))
	waitEligible(t, admin, all3, all3)
	limits := watchEvents(t, admin, proposals.EventLimit)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}

	want := map[string][]string{}
	sendBatch(t, js, "steady", "before", 3, want)
	col.waitCount(t, 3, 30*time.Second)

	// The flood: two messages per new group, the steady group's between.
	floodWant := map[string][]string{}
	for i := range flood {
		g := fmt.Sprintf("flood-%03d", i)
		sendBatch(t, js, g, "a", 1, floodWant)
		if i%30 == 0 {
			sendBatch(t, js, "steady", fmt.Sprintf("during-%d", i), 1, want)
		}
	}
	for i := range flood {
		g := fmt.Sprintf("flood-%03d", i)
		sendBatch(t, js, g, "b", 1, floodWant)
	}
	total := len(want["steady"]) + 2*flood

	// Every message ends up delivered or dead-lettered.
	var dead map[string][]string
	natstest.Eventually(t, 60*time.Second, func() error {
		dead = deadLettered(t, js)
		n := len(col.all())
		for _, b := range dead {
			n += len(b)
		}
		if n < total {
			var missing []string
			for g := range floodWant {
				if _, ok := dead[g]; ok {
					continue
				}
				found := false
				for _, r := range col.all() {
					found = found || r.group == g
				}
				if !found && len(missing) < 5 {
					missing = append(missing, g)
				}
			}
			return fmt.Errorf("%d of %d messages delivered or dead-lettered (%d groups dead-lettered; neither, e.g.: %v)", n, total, len(dead), missing)
		}
		return nil
	})
	got := col.all()
	delivered := map[string][]string{"steady": want["steady"]}
	for _, r := range got {
		if r.group != "steady" {
			delivered[r.group] = floodWant[r.group]
		}
	}
	checkGrouping(t, got, delivered)
	for g, bs := range dead {
		if _, ok := delivered[g]; ok {
			t.Errorf("group %s both delivered and dead-lettered", g)
		}
		if strings.Join(bs, ",") != strings.Join(floodWant[g], ",") {
			t.Errorf("group %s dead-lettered %v, want %v in order", g, bs, floodWant[g])
		}
	}
	if n := len(delivered) + len(dead); n != flood+1 {
		t.Errorf("%d groups delivered, %d dead-lettered, of %d", len(delivered), len(dead), flood+1)
	}
	if len(delivered) > limit || len(delivered) < 2 {
		t.Errorf("%d groups delivered (steady included), want at most the limit %d and some", len(delivered), limit)
	}
	t.Logf("%d groups bound (steady included), %d dead-lettered", len(delivered), len(dead))
	if bound := boundRecords(t, admin); bound > limit {
		t.Errorf("the bucket holds %d bound groups, limit %d", bound, limit)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		limits.mu.Lock()
		defer limits.mu.Unlock()
		if len(limits.evs) == 0 {
			return fmt.Errorf("no %s event", proposals.EventLimit)
		}
		if !strings.Contains(limits.evs[0].Reason, "--max-groups") {
			return fmt.Errorf("limit event %+v does not name the setting", limits.evs[0])
		}
		return nil
	})

	// Room comes back as groups close: close five bound flood groups, and
	// five new groups are bound.
	closed := 0
	for g := range delivered {
		if g == "steady" || closed == 5 {
			continue
		}
		m := nats.NewMsg("jms.orders")
		m.Header.Set("Group-Id", g)
		m.Header.Set(router.HeaderGroupSeq, "-1")
		m.Data = []byte(g + "/close")
		if _, err := js.PublishMsg(t.Context(), m); err != nil {
			t.Fatal(err)
		}
		closed++
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		if bound := boundRecords(t, admin); bound > len(delivered)-5 {
			return fmt.Errorf("%d groups bound, want %d after five closed", bound, len(delivered)-5)
		}
		return nil
	})
	after := map[string][]string{}
	for i := range 5 {
		sendBatch(t, js, fmt.Sprintf("after-%d", i), "a", 2, after)
	}
	var late []received
	natstest.Eventually(t, 30*time.Second, func() error {
		late = late[:0]
		for _, r := range col.all() {
			if strings.HasPrefix(r.group, "after-") {
				late = append(late, r)
			}
		}
		if len(late) < 10 {
			var deadAfter []string
			for g := range deadLettered(t, js) {
				if strings.HasPrefix(g, "after-") {
					deadAfter = append(deadAfter, g)
				}
			}
			return fmt.Errorf("%d of the new groups' 10 messages delivered; dead-lettered: %v; %d bound", len(late), deadAfter, boundRecords(t, admin))
		}
		return nil
	})
	checkGrouping(t, late, after)
}

// deadLettered returns the dead-letter stream's messages by group, bodies
// in stream order; it fails the test on a message dead-lettered twice or
// for another reason than the group limit.
func deadLettered(t testing.TB, js jetstream.JetStream) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	n := streamState(t, js, router.DeadLetterStream).Msgs
	if n == 0 {
		return out
	}
	seen := map[string]bool{}
	for _, m := range waitStreamMsgs(t, js, router.DeadLetterStream, int(n), 10*time.Second) {
		g := m.Header.Get("Group-Id")
		if r := m.Header.Get(router.HeaderDeadReason); !strings.Contains(r, "group limit") {
			t.Errorf("dead letter of %s: reason %q", g, r)
		}
		seq := m.Header.Get(router.HeaderIngressSeq)
		if seen[seq] {
			t.Errorf("ingress message %s dead-lettered twice", seq)
		}
		seen[seq] = true
		out[g] = append(out[g], string(m.Data))
	}
	return out
}

// boundRecords counts the bindings bucket's bound (or moving) records.
func boundRecords(t testing.TB, nc *nats.Conn) int {
	t.Helper()
	st := openStore(t, nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := 0
	bs, err := st.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		if b.Group != "" && (b.State == kvbinding.StateBound || b.State == kvbinding.StateMoving) {
			n++
		}
	}
	return n
}
