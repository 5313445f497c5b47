package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// attack is one hostile input and what it is.
type attack struct {
	what string
	msg  *nats.Msg
}

// hostileInputs returns what a client with publish rights on the grouping
// namespace (and no more sense) can send: malformed, oversized and forged
// requests, replies, events and KV values. groups are groups in use.
func hostileInputs(rnd *rand.Rand, groups []string) []attack {
	g := groups[rnd.IntN(len(groups))]
	key, _ := kvbinding.Key(g)
	node := []string{"n0", "n1", "n2", "n9"}[rnd.IntN(4)]
	notInboxes := []string{"$KV.grouping-nodes.lease.my-grouping-handler", "$KV.grouping-bindings." + key,
		"$KV.grouping-nodes.ckpt.n1", "$JS.API.STREAM.DELETE.GROUPING_QUEUE", "jms.orders", "grouping.queue.n1.x",
		"grouping.propose.n0", "grouping.events.bind", "_INBOX.*", "_INBOX.>", "_INBOX.a..b", "_INBOX.x.", ""}
	garbage := make([]byte, rnd.IntN(2048))
	for i := range garbage {
		garbage[i] = byte(rnd.IntN(256))
	}
	valid := fmt.Sprintf(`{"v":3,"proposer":%q,"proposals":[{"group":%q,"node":"n1","seq":1}]}`, node, g)
	ops := []attack{
		{"garbage proposal", &nats.Msg{Subject: proposals.ProposeSubject(node), Reply: "_INBOX.h1." + node, Data: garbage}},
		{"oversized proposal", &nats.Msg{Subject: proposals.ProposeSubject(node), Reply: "_INBOX.h2",
			Data: []byte(`{"v":3,"proposer":"` + node + `","proposals":[{"group":"` + strings.Repeat("x", 900<<10) + `"}]}`)}},
		{"wrong version", &nats.Msg{Subject: proposals.ProposeSubject(node), Reply: "_INBOX.h3", Data: []byte(strings.Replace(valid, `"v":3`, `"v":2`, 1))}},
		{"proposer not the subject's node", &nats.Msg{Subject: proposals.ProposeSubject("n2"), Reply: "_INBOX.h4",
			Data: []byte(fmt.Sprintf(`{"v":3,"proposer":"n1","proposals":[{"group":%q,"node":"n1","seq":1}]}`, g))}},
		{"reply to a non-inbox", &nats.Msg{Subject: proposals.ProposeSubject(node), Reply: notInboxes[rnd.IntN(len(notInboxes))], Data: []byte(valid)}},
		{"stale fence", &nats.Msg{Subject: proposals.ProposeSubject(node), Reply: "_INBOX.h5",
			Data: []byte(fmt.Sprintf(`{"v":3,"proposer":%q,"proposals":[{"op":"fence","group":%q,"seq":1,"rev":1}]}`, node, g))}},
		{"drained by a node the record does not name", &nats.Msg{Subject: proposals.ProposeSubject(node), Reply: "_INBOX.h6",
			Data: []byte(fmt.Sprintf(`{"v":3,"proposer":%q,"proposals":[{"op":"drained","group":%q,"rev":%d}]}`, node, g, rnd.IntN(5000)+1))}},
		{"release by a node the record does not name", &nats.Msg{Subject: proposals.ProposeSubject("n9"), Reply: "_INBOX.h7",
			Data: []byte(fmt.Sprintf(`{"v":3,"proposer":"n9","proposals":[{"op":"release","group":%q,"seq":5,"rev":%d,"kind":"close"}]}`, g, rnd.IntN(5000)+1))}},
		{"dead-letter past the ingress", &nats.Msg{Subject: proposals.ProposeSubject(node), Reply: "_INBOX.h8",
			Data: []byte(fmt.Sprintf(`{"v":3,"proposer":%q,"proposals":[{"op":"deadletter","group":%q,"seq":999999999}]}`, node, g))}},
		{"operator op on a node subject", &nats.Msg{Subject: proposals.ProposeSubject(node), Reply: "_INBOX.h9",
			Data: []byte(fmt.Sprintf(`{"v":3,"proposer":%q,"proposals":[{"op":"move","group":%q,"node":"n2"}]}`, node, g))}},
		{"garbage admin", &nats.Msg{Subject: proposals.SubjectAdmin, Reply: "_INBOX.a1", Data: garbage}},
		{"admin reply to a non-inbox", &nats.Msg{Subject: proposals.SubjectAdmin, Reply: notInboxes[rnd.IntN(len(notInboxes))],
			Data: []byte(fmt.Sprintf(`{"v":3,"op":"unbind","group":%q}`, g))}},
		{"admin to a dead node", &nats.Msg{Subject: proposals.SubjectAdmin, Reply: "_INBOX.a2",
			Data: []byte(fmt.Sprintf(`{"v":3,"op":"move","group":%q,"node":"n9"}`, g))}},
		{"ping with a non-inbox reply", &nats.Msg{Subject: "grouping.handler.my-grouping-handler.ping", Reply: notInboxes[rnd.IntN(len(notInboxes))]}},
		{"garbage event", &nats.Msg{Subject: "grouping.events.bind", Data: garbage}},
		{"forged handler takeover", &nats.Msg{Subject: "grouping.events.handler", Data: []byte(`{"kind":"handler","prev_node":"` + node + `","by":"x"}`)}},
		{"garbage handler event", &nats.Msg{Subject: "grouping.events.handler", Data: garbage}},
		{"garbage binding value", &nats.Msg{Subject: "$KV.grouping-bindings." + key, Data: garbage}},
		{"binding of another group", &nats.Msg{Subject: "$KV.grouping-bindings." + key,
			Data: []byte(`{"group":"someone-else","state":"bound","node":"n1","from_seq":1,"decided_at":"2026-12-01T00:00:00Z","decided_by":"x"}`)}},
		{"binding with a bad node", &nats.Msg{Subject: "$KV.grouping-bindings." + key,
			Data: []byte(fmt.Sprintf(`{"group":%q,"state":"bound","node":"n 1","from_seq":1,"decided_at":"2026-12-01T00:00:00Z","decided_by":"x"}`, g))}},
		{"binding with drain entries that are not node ids", &nats.Msg{Subject: "$KV.grouping-bindings." + key,
			Data: []byte(fmt.Sprintf(`{"group":%q,"state":"bound","node":"n1","from_seq":1,"step":"drain","drain":["a.b","*"],"decided_at":"2026-12-01T00:00:00Z","decided_by":"x"}`, g))}},
		{"oversized binding", &nats.Msg{Subject: "$KV.grouping-bindings." + key, Data: bytes.Repeat([]byte("x"), 64<<10)}},
		{"binding under a foreign key", &nats.Msg{Subject: "$KV.grouping-bindings.zz.top", Data: []byte(`{}`)}},
		{"garbage liveness", &nats.Msg{Subject: "$KV.grouping-nodes.live." + node, Data: garbage}},
		{"liveness of another node", &nats.Msg{Subject: "$KV.grouping-nodes.live.n1", Data: []byte(`{"node":"n7","has_consumer":true}`)}},
		{"lease without a holder", &nats.Msg{Subject: "$KV.grouping-nodes.lease.my-grouping-handler", Data: []byte(`{"since":"2026-12-01T00:00:00Z"}`)}},
		{"garbage checkpoint", &nats.Msg{Subject: "$KV.grouping-nodes.ckpt." + node, Data: garbage}},
	}
	return ops
}

// hostileIngress returns producer messages that cannot be grouped: they
// must end in the dead-letter stream with a reason.
func hostileIngress(i int) []*nats.Msg {
	twice := nats.NewMsg(fmt.Sprintf("jms.hostile.%d", i))
	twice.Header["Group-Id"] = []string{"a"}
	twice.Header["GROUP-ID"] = []string{"b"}
	twice.Data = []byte("two group ids")
	badUTF8 := nats.NewMsg(fmt.Sprintf("jms.hostile.%d", i))
	badUTF8.Header["Group-Id"] = []string{"\xff\xfe"}
	badUTF8.Data = []byte("bad utf-8")
	long := nats.NewMsg("jms." + strings.Repeat("t", 3900))
	long.Header.Set("Group-Id", fmt.Sprintf("long-%d", i))
	long.Data = []byte("subject too long to republish")
	tooLongID := nats.NewMsg(fmt.Sprintf("jms.hostile.%d", i))
	tooLongID.Header.Set("Group-Id", strings.Repeat("g", kvbinding.MaxGroupIDLen+1))
	tooLongID.Data = []byte("group id too long")
	return []*nats.Msg{twice, badUTF8, long, tooLongID}
}

// TestHostileInputs sends malformed, oversized and forged messages to every
// subject and KV key of the grouping namespace, and producer messages that
// cannot be grouped, while producers and consumers run: every
// acknowledged message arrives exactly once, in order per group; the
// messages that cannot be grouped are dead-lettered with a reason; no node
// stops; requests with a non-inbox reply subject are dropped, unanswered.
func TestHostileInputs(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	nodes := []*node{
		startNode(t, s.URL(), lifecycleConfig("n0", router.Local)),
		startNode(t, s.URL(), lifecycleConfig("n1", router.Local)),
		startNode(t, s.URL(), lifecycleConfig("n2", router.Remote)),
	}
	col := &timedCollector{}
	for _, id := range all3 {
		startAppConsumer(t, s.URL(), id, col)
	}
	nc := s.Connect()
	waitEligible(t, nc, all3, all3)
	ps := []*loadProducer{
		startLoad(t, s.URL(), "ha", 8, 20, 15*time.Millisecond),
		startLoad(t, s.URL(), "hb", 8, 0, 15*time.Millisecond),
	}
	// Let groups be bound, so that the forged values hit live records.
	natstest.Eventually(t, 20*time.Second, func() error {
		if col.len() < 50 {
			return natstest.ErrNotYet
		}
		return nil
	})

	attacker := natstest.Connect(t, s.URL(), nats.Name("attacker"))
	// The attacker also answers proposals itself, with forged replies
	// (some of them): nodes must not take them for records.
	forged, err := attacker.Subscribe(proposals.SubjectPropose, func(m *nats.Msg) {
		if rand.IntN(4) == 0 && strings.HasPrefix(m.Reply, "_INBOX.") && !strings.ContainsAny(m.Reply, "*>") {
			_ = m.Respond([]byte(`{"v":3,"handler":"evil","decisions":[{"group":"x","outcome":"accepted","revision":999999999}]}`))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(attacker)
	if err != nil {
		t.Fatal(err)
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	kinds := map[string]int{}
	var hostile int
	stopAt := time.Now().Add(8 * time.Second)
	for round := 0; time.Now().Before(stopAt); round++ {
		_, groups := ackTimes(ps...)
		var names []string
		for g := range groups {
			names = append(names, g)
		}
		if len(names) == 0 {
			continue
		}
		for _, a := range hostileInputs(rnd, names) {
			if err := attacker.PublishMsg(a.msg); err == nil {
				kinds[a.what]++
			}
		}
		if round%10 == 0 {
			for _, m := range hostileIngress(round) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if _, err := js.PublishMsg(ctx, m); err != nil {
					t.Fatalf("hostile ingress message not stored: %v", err)
				}
				cancel()
				hostile++
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = forged.Unsubscribe()
	haltAll(t, ps...)
	want, n := sentAll(ps...)
	col.waitConsumed(t, want, 90*time.Second)
	time.Sleep(500 * time.Millisecond) // duplicates, if any, arrive right behind
	checkDelivered(t, col.all(), want, false, false)

	for _, nd := range nodes {
		select {
		case err := <-nd.done:
			t.Errorf("node %s stopped during the attack: %v", nd.id, err)
		default:
		}
	}
	// Every message that cannot be grouped is in the dead-letter stream,
	// with a reason.
	dlq := waitStreamMsgs(t, jetStream(t, s.URL()), router.DeadLetterStream, hostile, 30*time.Second)
	reasons := map[string]int{}
	for _, m := range dlq {
		r := m.Header.Get(router.HeaderDeadReason)
		if r == "" {
			t.Errorf("dead letter on %s without a reason", m.Subject)
		}
		reasons[strings.SplitN(r, ":", 2)[0]]++
	}
	// Every record the attack wrote over was restored by the handler.
	st := openStore(t, nc)
	natstest.Eventually(t, 20*time.Second, func() error {
		for g := range want {
			if _, err := st.Get(context.Background(), g); err != nil && !errors.Is(err, kvbinding.ErrNotFound) {
				return fmt.Errorf("%s: %v", g, err)
			}
		}
		return nil
	})
	dropped := uint64(0)
	for _, nd := range nodes[:2] {
		if h := nd.r.Handler(); h != nil {
			dropped += h.Dropped()
		}
	}
	if dropped == 0 {
		t.Errorf("no request with a non-inbox reply subject was dropped")
	}
	t.Logf("%d messages in %d groups delivered exactly once, in order, through %d hostile inputs %v; %d ungroupable messages dead-lettered %v; %d requests dropped for their reply subject",
		n, len(want), sum(kinds), kinds, len(dlq), reasons, dropped)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
