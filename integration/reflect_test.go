package integration

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/permissions"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// TestRepliesCannotReachRouterState runs the generated accounts on a
// 3-server cluster and attacks them as issue 16 did inside one account: a
// producer publishes real messages whose reply subject names every key of
// both buckets, each node's queue, the dead-letter and parked subjects,
// the JetStream API and the handler's subjects, so that JetStream's PubAck
// would be stored or acted on there; a consumer aims the replies of its
// API requests at the same targets. Nothing of the router's state changes:
// no stream holds a PubAck or an API response (the lease included), the
// streams and the queue consumers stay, and the consumers receive exactly
// what was published. A REMOTE node's user, inside the router's account,
// cannot write a binding or another node's checkpoint with the answers of
// its reads. Then every node crashes and restarts, and
// every message is still delivered exactly once, in order.
func TestRepliesCannotReachRouterState(t *testing.T) {
	// Not parallel: permtest.NewAuth sets the passwords in the environment.
	layout := permissions.Layout{Address: "jms", Nodes: []string{"n0", "n1", "n2"}, Handlers: []string{"n0", "n1"}, Name: "my-grouping-handler"}
	a := runAuthCluster(t, layout)
	nodes := a.startNodes(t)
	var col collector
	for i, id := range layout.Nodes {
		a.consumeAs(t, i, "consumer-"+id, id, &col)
	}
	admin := a.admin(t)
	ajs, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	waitEligible(t, admin, layout.Nodes, layout.Nodes)

	producer := a.connect(t, 1, "producer", "producer")
	pjs := a.js(t, producer, "producer")
	want := map[string][]string{}
	groups := []string{"g1", "g2", "g3", "g4", "g5", "g6"}
	for _, g := range groups {
		sendBatch(t, pjs, g, "first", 5, want)
	}
	col.waitCount(t, 30, 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The targets: every key of both buckets as they are now, the queues,
	// the dead letters, the parking, the JetStream API, the handler.
	var targets []string
	for _, bucket := range []string{kvbinding.DefaultBucket, kvbinding.DefaultNodesBucket} {
		kv, err := ajs.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := kv.Keys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			targets = append(targets, "$KV."+bucket+"."+k)
		}
	}
	if len(targets) < len(groups)+4 {
		t.Fatalf("only %d keys in the buckets: %v", len(targets), targets)
	}
	for _, n := range layout.Nodes {
		targets = append(targets, router.QueueSubject(n, "jms.orders"), proposals.ProposeSubject(n),
			consumer.ParkedSubjectPrefix+n+".jms.orders", "$JS.ACK."+router.QueueStream+"."+router.QueueConsumer(n)+".1.1.1.1.0")
	}
	q := router.QueueStream
	targets = append(targets,
		router.DeadLetterSubjectPrefix+"jms.orders", "$KV."+consumer.ParkedBucket+".r.g1",
		"$JS.API.STREAM.DELETE."+q, "$JS.API.STREAM.PURGE."+router.IngressStream, "$JS.API.STREAM.DELETE.KV_"+kvbinding.DefaultBucket,
		"$JS.API.CONSUMER.DELETE."+q+"."+router.QueueConsumer("n1"), "$JS.API.CONSUMER.PAUSE."+q+"."+router.QueueConsumer("n0"),
		proposals.SubjectAdmin, proposals.SubjectHandlerPrefix+layout.Name+".ping",
		proposals.SubjectEventsPrefix+proposals.EventHandlerTakeover, proposals.SubjectEventsPrefix+proposals.EventBind,
		// The consumers' side of their imports (the producers' account
		// has none of them).
		layout.ImportedSubject("$KV."+consumer.ParkedBucket+".r.g1"), layout.ImportedSubject("$JS.API.STREAM.DELETE."+q))

	takeovers := func() uint64 {
		s, err := ajs.Stream(ctx, router.EventsStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(proposals.SubjectEventsPrefix+proposals.EventHandlerTakeover))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects[proposals.SubjectEventsPrefix+proposals.EventHandlerTakeover]
	}
	takeoversBefore := takeovers()

	// The producer: a real message per target, on one group, in order.
	for i, target := range targets {
		body := fmt.Sprintf("atk-%03d", i)
		m := &nats.Msg{Subject: "jms.orders", Reply: target, Header: nats.Header{"Group-Id": []string{"atk"}}, Data: []byte(body)}
		if err := producer.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(target, "$JS.ACK.") {
			// A reserved reply: the server refuses the publish itself.
			continue
		}
		want["atk"] = append(want["atk"], body)
	}
	if err := producer.Flush(); err != nil {
		t.Fatal(err)
	}
	// A consumer: its API requests, with their replies aimed the same way.
	cons := a.connect(t, 0, "consumer-n0", "consumer-n0-attacker")
	for _, target := range targets {
		if strings.HasPrefix(target, consumer.ParkedSubjectPrefix+"n0.") || strings.Contains(target, router.QueueConsumer("n0")+".") ||
			strings.HasPrefix(target, layout.ImportedSubject("$KV.")) {
			// Its own imports: what it may publish itself (parking its
			// node's messages, acking its queue, the parked records).
			continue
		}
		for _, api := range []string{"$JS.API.CONSUMER.INFO." + q + "." + router.QueueConsumer("n0"), "$JS.API.STREAM.INFO." + q} {
			if err := cons.PublishRequest(layout.ImportedSubject(api), target, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := cons.Flush(); err != nil {
		t.Fatal(err)
	}

	// Every attack message is delivered (so its PubAck was sent), and
	// nothing else.
	for deadline := time.Now().Add(60 * time.Second); len(col.all()) < 30+len(want["atk"]) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // anything stored by a reply would be delivered by now
	got := col.all()
	checkGrouping(t, got, want)
	if t.Failed() {
		seen := map[string]bool{}
		for _, r := range got {
			seen[r.body] = true
		}
		for i, target := range targets {
			t.Logf("atk-%03d: reply %s, received %v", i, target, seen[fmt.Sprintf("atk-%03d", i)])
		}
		t.FailNow()
	}
	published := map[string]bool{}
	for _, bs := range want {
		for _, b := range bs {
			published[b] = true
		}
	}
	for _, r := range got {
		if !published[r.body] {
			t.Errorf("consumer of %s received %q (group %q), which nobody published", r.node, r.body, r.group)
		}
	}

	// No stream of the router's account stores a reply.
	for _, stream := range []string{"KV_" + kvbinding.DefaultBucket, "KV_" + kvbinding.DefaultNodesBucket, "KV_" + consumer.ParkedBucket,
		consumer.ParkedStream, q, router.DeadLetterStream, router.EventsStream, router.IngressStream} {
		for _, m := range readStream(ctx, t, ajs, stream) {
			if bytes.Contains(m.Data, []byte(`"stream":"`)) || bytes.Contains(m.Data, []byte(`io.nats.jetstream.api.v1.`)) {
				t.Errorf("stream %s holds a reply at %d (%s): %.120s", stream, m.Sequence, m.Subject, m.Data)
			}
		}
	}
	// The streams and the queue consumers are all there, none paused, and
	// no handler took over.
	for _, n := range layout.Nodes {
		c, err := ajs.Consumer(ctx, q, router.QueueConsumer(n))
		if err != nil {
			t.Fatalf("queue consumer of %s: %v", n, err)
		}
		if info := c.CachedInfo(); info.Paused {
			t.Errorf("queue consumer of %s paused", n)
		}
	}
	// A takeover would be no proof (a loaded machine lets leases lapse):
	// the lease record is checked above with the rest of the bucket.
	t.Logf("%d handler takeovers during the attack", takeovers()-takeoversBefore)
	for _, n := range nodes {
		if st := n.r.Stats(); st.BindingsRewinds != 0 {
			t.Errorf("node %s saw %d bindings rewinds", n.id, st.BindingsRewinds)
		}
	}

	// A REMOTE node's user, inside the router's account: it may read
	// binding records only as JSON around them (a direct get, whose answer
	// is the record itself, is refused), so aiming the answer at another
	// group's key writes no binding: the cache ignores it and the handler
	// writes the record back. Its own checkpoint copied onto n1's key
	// (direct get of its own key, reply aimed at n1's) is refused as n1's.
	store, err := kvbinding.OpenStore(ctx, ajs, kvbinding.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	g1, err := store.Get(ctx, "g1")
	if err != nil {
		t.Fatal(err)
	}
	g2, err := store.Get(ctx, "g2")
	if err != nil {
		t.Fatal(err)
	}
	attacker := a.connect(t, 2, "node-n2", "node-n2-attacker")
	if err := attacker.PublishRequest("$JS.API.STREAM.MSG.GET.KV_"+kvbinding.DefaultBucket, "$KV."+kvbinding.DefaultBucket+".r.g2",
		[]byte(fmt.Sprintf(`{"seq":%d}`, g1.Revision))); err != nil {
		t.Fatal(err)
	}
	if err := attacker.PublishRequest("$JS.API.DIRECT.GET.KV_"+kvbinding.DefaultNodesBucket+".$KV."+kvbinding.DefaultNodesBucket+"."+kvbinding.CheckpointKey("n2"),
		"$KV."+kvbinding.DefaultNodesBucket+"."+kvbinding.CheckpointKey("n1"), nil); err != nil {
		t.Fatal(err)
	}
	if err := attacker.Flush(); err != nil {
		t.Fatal(err)
	}
	a.deniedPublish(t, "node-n2", "$JS.API.DIRECT.GET.KV_"+kvbinding.DefaultBucket)
	reg, err := kvbinding.OpenRegistry(ctx, ajs, kvbinding.RegistryConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 20*time.Second, func() error {
		b, err := store.Get(ctx, "g2")
		if err != nil {
			return err
		}
		if b.Node != g2.Node || b.Group != "g2" {
			return fmt.Errorf("g2 reads %+v, was bound to %s", b, g2.Node)
		}
		return nil
	})
	if c, ok, err := reg.LoadCheckpoint(ctx, "n1"); err == nil && ok && c.Node != "n1" {
		t.Errorf("n1's checkpoint is %+v", c)
	}

	// Every node crashes, and restarts: what follows is delivered once,
	// in order.
	for _, n := range nodes {
		n.kill()
	}
	for _, g := range groups {
		sendBatch(t, pjs, g, "between", 2, want)
	}
	for _, n := range nodes {
		n.launch()
	}
	for _, n := range nodes {
		n.waitReady(60 * time.Second)
	}
	for _, g := range append(groups, "atk") {
		sendBatch(t, pjs, g, "after", 3, want)
	}
	total := 0
	for _, bs := range want {
		total += len(bs)
	}
	col.waitCount(t, total, 60*time.Second)
	time.Sleep(time.Second)
	// A node that came back later than its grace has had its groups moved:
	// the order holds across the move.
	checkOrderedOnce(t, col.all(), want)
}

// readStream returns every message stored in stream, read by sequence.
func readStream(ctx context.Context, t *testing.T, js jetstream.JetStream, stream string) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted (acked on a work queue, or a KV update)
		}
		out = append(out, m)
	}
	return out
}
