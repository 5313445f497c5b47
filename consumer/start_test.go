package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
	"github.com/grouprouter/grouprouter/router/routertest"
)

// Starting an application and its router node together (issue 31, item 3).

// waitingLine is what Consume logs, once, while the queue consumer does
// not exist yet.
const waitingLine = "waiting for the node's queue consumer"

// launchNode starts router node id (LOCAL, on url) without waiting for
// it; it stops when the test ends.
func launchNode(t testing.TB, url, id string, mode router.QueueMode) *router.Router {
	t.Helper()
	r, _ := routertest.Launch(t, natstest.Connect(t, url, nats.Name("node-"+id)), router.Config{
		Name: "h", Type: router.Local, Address: "jms", Timeout: time.Second,
		Node: id, Heartbeat: 100 * time.Millisecond, QueueMode: mode,
	})
	return r
}

// ready waits until the node routes.
func ready(t testing.TB, r *router.Router) {
	t.Helper()
	select {
	case <-r.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("node not ready within 30s")
	}
}

// seenWithConsumer waits (at most 10 s: the node looks every 100 ms while
// it has none) until the node registry, what 'grouprouter nodes' shows,
// says each node has a consumer, and returns for each when the node
// announced it.
func seenWithConsumer(t testing.TB, js jetstream.JetStream, nodes ...string) map[string]time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seen := map[string]time.Time{}
	var reg *kvbinding.Registry
	for {
		var err error
		if reg == nil {
			reg, err = kvbinding.OpenRegistry(ctx, js, kvbinding.RegistryConfig{}, nil)
		}
		if err == nil {
			var list []kvbinding.NodeInfo
			if list, err = reg.ListNodes(ctx); err == nil {
				now := time.Now()
				for _, i := range list {
					if _, ok := seen[i.Node]; !ok && i.HasConsumer && slices.Contains(nodes, i.Node) {
						// When the node announced it (its record's time;
						// a later record's if this look came late), not
						// when this look read it: a registry read held up
						// by the servers is not the node's delay.
						seen[i.Node] = now
						if !i.Heartbeat.IsZero() && i.Heartbeat.Before(now) {
							seen[i.Node] = i.Heartbeat
						}
					}
				}
			}
		}
		if len(seen) == len(nodes) {
			return seen
		}
		select {
		case <-ctx.Done():
			t.Fatalf("within 10 s, the registry showed a consumer for %d of %v only (err %v)", len(seen), nodes, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// orderLog records the bodies each group's messages had, as processed.
type orderLog struct {
	mu  sync.Mutex
	got map[string][]string
	n   int
}

func (o *orderLog) add(group, body string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.got == nil {
		o.got = map[string][]string{}
	}
	o.got[group] = append(o.got[group], body)
	o.n++
}

func (o *orderLog) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// publishGroups publishes n messages of each group on the ingress,
// interleaved, and returns the bodies per group in order.
func publishGroups(t testing.TB, js jetstream.JetStream, groups []string, n int) map[string][]string {
	t.Helper()
	want := map[string][]string{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range n {
		for _, g := range groups {
			m := nats.NewMsg("jms.orders")
			m.Header.Set("Group-Id", g)
			m.Data = []byte(g + "-" + strconv.Itoa(i))
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
			want[g] = append(want[g], string(m.Data))
		}
	}
	return want
}

// checkOrder waits until every message is processed, then checks each
// group got its messages once, in order.
func checkOrder(t testing.TB, o *orderLog, want map[string][]string) {
	t.Helper()
	total := 0
	for _, w := range want {
		total += len(w)
	}
	waitFor(t, "every message processed", func() bool { return o.count() >= total })
	o.mu.Lock()
	defer o.mu.Unlock()
	for g, w := range want {
		if !slices.Equal(o.got[g], w) {
			t.Errorf("group %s processed %v, want %v", g, o.got[g], w)
		}
	}
}

// TestConsumeStartedBeforeNode: Consume started before the node's router
// (no stream, no queue consumer yet) waits, saying so once, and processes
// every group in order once the node runs; the node reports its consumer.
// Also an application of its own, pulling with nats.go (priority group
// "grouping") once consumer.WaitQueue returned, started at the same time.
func TestConsumeStartedBeforeNode(t *testing.T) {
	for _, mode := range []router.QueueMode{router.QueuePinned, router.QueuePlain} {
		t.Run("Consume/"+string(mode), func(t *testing.T) {
			srv := natstest.RunServer(t)
			js := srv.JetStream()
			var o orderLog
			logs := &natstest.Buffer{}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- consumer.Consume(ctx, js, "n1", func(_ context.Context, m *consumer.Message) error {
					o.add(m.Group, string(m.Data))
					return nil
				}, consumer.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
			}()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Consume: %v", err)
				}
			}()
			waitFor(t, "Consume says it waits", func() bool { return strings.Contains(logs.String(), waitingLine) })
			time.Sleep(600 * time.Millisecond) // a few of its looks
			select {
			case err := <-done:
				t.Fatalf("Consume returned %v before the node ran", err)
			default:
			}
			r := launchNode(t, srv.URL(), "n1", mode)
			ready(t, r)
			readyAt := time.Now()
			t.Logf("node n1 seen with its consumer %v after it was ready", seenWithConsumer(t, js, "n1")["n1"].Sub(readyAt).Round(time.Millisecond))
			checkOrder(t, &o, publishGroups(t, js, []string{"a", "b", "c"}, 20))
			if n := strings.Count(logs.String(), waitingLine); n != 1 {
				t.Errorf("Consume said %d times that it waits, want once:\n%s", n, logs)
			}
		})
	}
	t.Run("nats.go/pinned", func(t *testing.T) {
		srv := natstest.RunServer(t)
		js := srv.JetStream()
		var o orderLog
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		attached := make(chan jetstream.ConsumeContext, 1)
		go func() {
			defer close(attached)
			cons, err := consumer.WaitQueue(ctx, js, "n1")
			if err != nil {
				t.Errorf("WaitQueue: %v", err)
				return
			}
			cc, err := cons.Consume(func(m jetstream.Msg) {
				o.add(m.Headers().Get("Group-Id"), string(m.Data()))
				_ = m.Ack()
			}, jetstream.PullPriorityGroup(router.PriorityGroup))
			if err != nil {
				t.Errorf("Consume: %v", err)
				return
			}
			attached <- cc
		}()
		r := launchNode(t, srv.URL(), "n1", router.QueuePinned)
		cc, ok := <-attached
		if !ok {
			t.FailNow()
		}
		defer cc.Stop()
		ready(t, r)
		seenWithConsumer(t, js, "n1")
		checkOrder(t, &o, publishGroups(t, js, []string{"a", "b", "c"}, 20))
	})
	t.Run("WaitQueue/ctx", func(t *testing.T) {
		srv := natstest.RunServer(t)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if _, err := consumer.WaitQueue(ctx, srv.JetStream(), "n1"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("WaitQueue without a node: %v, want its context's error", err)
		}
	})
}

// TestAttachTheMomentTheQueueExists: three nodes on a cluster of three
// servers start together; an application, on one connection to one of
// the servers, attaches to each node's queue with nats.go (priority group
// "grouping" when pinned) the moment consumer.WaitQueue gives it, or with
// consumer.Consume started with the nodes. Every node reports its
// consumer within a few of its 100 ms looks (10 s at most). Attaching the
// moment the consumer's info is answered instead, before its leader is
// elected, the pull is lost: nats.go pulls again only after two missed
// idle heartbeats (30 s), and the node sees no consumer until then.
func TestAttachTheMomentTheQueueExists(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    router.QueueMode
		consume bool // consumer.Consume, not nats.go
	}{{"nats.go/pinned", router.QueuePinned, false}, {"nats.go/plain", router.QueuePlain, false}, {"Consume/pinned", router.QueuePinned, true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := natstest.RunCluster(t, 3)
			ids := []string{"n1", "n2", "n3"}
			js := c.Servers[0].JetStream()
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			var mu sync.Mutex
			attachedAt := map[string]time.Time{}
			started := time.Now()
			for _, id := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if tc.consume {
						if err := consumer.Consume(ctx, js, id, func(context.Context, *consumer.Message) error { return nil }); err != nil {
							t.Errorf("Consume %s: %v", id, err)
						}
						return
					}
					cons, err := consumer.WaitQueue(ctx, js, id)
					if err != nil {
						t.Errorf("WaitQueue %s: %v", id, err)
						return
					}
					var opts []jetstream.PullConsumeOpt
					if tc.mode == router.QueuePinned {
						opts = append(opts, jetstream.PullPriorityGroup(router.PriorityGroup))
					}
					cc, err := cons.Consume(func(m jetstream.Msg) { _ = m.Ack() }, opts...)
					if err != nil {
						t.Errorf("nats.go Consume %s: %v", id, err)
						return
					}
					mu.Lock()
					attachedAt[id] = time.Now()
					mu.Unlock()
					<-ctx.Done()
					cc.Stop()
				}()
			}
			for i, id := range ids {
				launchNode(t, c.Servers[i].URL(), id, tc.mode)
			}
			seen := seenWithConsumer(t, js, ids...)
			mu.Lock()
			defer mu.Unlock()
			var took []string
			for _, id := range ids {
				from := attachedAt[id]
				if tc.consume {
					from = started
				}
				took = append(took, fmt.Sprintf("%s %v", id, seen[id].Sub(from).Round(time.Millisecond)))
			}
			what := "attached"
			if tc.consume {
				what = "Consume started, before the nodes"
			}
			t.Logf("each node reported its consumer after it was %s: %s", what, strings.Join(took, ", "))
		})
	}
}
