package proposals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// handlerEnv runs a handler with its own connection, cache and registry.
type handlerEnv struct {
	h      *Handler
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

func startHandler(t *testing.T, s *natstest.Server, node string, live []kvbinding.NodeInfo, opts ...func(*HandlerConfig)) *handlerEnv {
	t.Helper()
	return startHandlerTB(t, s, node, live, opts...)
}

func startHandlerTB(t testing.TB, s *natstest.Server, node string, live []kvbinding.NodeInfo, opts ...func(*HandlerConfig)) *handlerEnv {
	t.Helper()
	nc := s.Connect()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	store, err := kvbinding.OpenStore(ctx, js, kvbinding.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := kvbinding.OpenRegistry(ctx, js, kvbinding.RegistryConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range live {
		if err := reg.Announce(ctx, info, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	cache := kvbinding.NewCache(kvbinding.CacheConfig{})
	go func() { _ = cache.Run(ctx, store) }()
	go func() { _ = reg.Run(ctx) }()
	<-cache.Ready()
	<-reg.Ready()
	natstest.Eventually(t, 5*time.Second, func() error {
		if len(reg.Live()) < len(live) {
			return natstest.ErrNotYet
		}
		return nil
	})
	cfg := HandlerConfig{Name: "h", Node: node, LeaseTTL: time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	h := NewHandler(nc, store, cache, reg, cfg)
	e := &handlerEnv{h: h, nc: nc, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(e.done); _ = h.Run(ctx) }()
	t.Cleanup(func() { e.cancel(); <-e.done })
	return e
}

var liveNodes = []kvbinding.NodeInfo{{Node: "n1", HasConsumer: true}, {Node: "n2", HasConsumer: true}}

func TestHandlerExactlyOneAnswersAndConcurrentProposalsConverge(t *testing.T) {
	s := natstest.RunServer(t)
	a := startHandler(t, s, "h1", liveNodes)
	b := startHandler(t, s, "h2", liveNodes)
	natstest.Eventually(t, 5*time.Second, func() error {
		if a.h.Active() == b.h.Active() {
			return fmt.Errorf("active: h1=%v h2=%v, want exactly one", a.h.Active(), b.h.Active())
		}
		return nil
	})
	// 20 proposers, each proposing the same 50 groups to alternating nodes.
	var wg sync.WaitGroup
	results := make([][]Decision, 20)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := NewClient(s.Connect(), fmt.Sprintf("p%d", i), 5*time.Second)
			ps := make([]Proposal, 50)
			for g := range ps {
				ps[g] = Proposal{Group: fmt.Sprintf("g%d", g), Node: []string{"n1", "n2"}[(i+g)%2], Seq: 1}
			}
			d, err := c.Propose(context.Background(), ps)
			if err != nil {
				t.Errorf("proposer %d: %v", i, err)
			}
			results[i] = d
		}()
	}
	wg.Wait()
	for g := 0; g < 50; g++ {
		accepted := 0
		for i := range results {
			d := results[i][g]
			if d.Outcome == Accepted {
				accepted++
			}
			first := results[0][g]
			if (d.Outcome != Accepted && d.Outcome != Rejected) || d.Revision != first.Revision {
				t.Fatalf("group g%d: proposer %d saw %+v, proposer 0 saw %+v", g, i, d, first)
			}
		}
		if accepted > 1 {
			t.Fatalf("group g%d accepted %d times", g, accepted)
		}
	}
	if n := a.h.Decisions() + b.h.Decisions(); n != 1000 || (a.h.Decisions() != 0 && b.h.Decisions() != 0) {
		t.Fatalf("decisions h1=%d h2=%d: want all 1000 answered by one handler", a.h.Decisions(), b.h.Decisions())
	}
}

func TestHandlerBackupTakesOverWithBindingsIntact(t *testing.T) {
	s := natstest.RunServer(t)
	a := startHandler(t, s, "h1", liveNodes)
	natstest.Eventually(t, 5*time.Second, func() error {
		if !a.h.Active() {
			return natstest.ErrNotYet
		}
		return nil
	})
	b := startHandler(t, s, "h2", liveNodes)
	c := NewClient(s.Connect(), "p", 2*time.Second)
	before, err := c.Propose(context.Background(), []Proposal{{Group: "kept", Node: "n1", Seq: 1}})
	if err != nil {
		t.Fatal(err)
	}
	// Crash the active handler: its connection dies without releasing the lease.
	a.nc.Close()
	start := time.Now()
	natstest.Eventually(t, 10*time.Second, func() error {
		if !b.h.Active() {
			return natstest.ErrNotYet
		}
		return nil
	})
	t.Logf("backup active %v after the active handler's connection died (lease TTL 1s)", time.Since(start))
	after, err := c.Propose(context.Background(), []Proposal{{Group: "kept", Node: "n2", Seq: 9}, {Group: "new", Node: "n2", Seq: 9}})
	if err != nil {
		t.Fatal(err)
	}
	if after[0].Outcome != Rejected || after[0].Revision != before[0].Revision {
		t.Fatalf("existing binding changed after takeover: before %+v after %+v", before[0], after[0])
	}
	if after[1].Outcome != Accepted {
		t.Fatalf("new group not decided by the backup: %+v", after[1])
	}
	for g, node := range map[string]string{"kept": "n1", "new": "n2"} {
		if rec, err := b.h.store.Get(context.Background(), g); err != nil || rec.Node != node {
			t.Fatalf("%s: %+v, %v; want bound to %s", g, rec, err, node)
		}
	}
}

func TestClientErrors(t *testing.T) {
	s := natstest.RunServer(t)
	nc := s.Connect()
	c := NewClient(nc, "p", 200*time.Millisecond)
	_, err := c.Propose(context.Background(), []Proposal{{Group: "g", Node: "n1", Seq: 1}})
	if !errors.Is(err, ErrNoHandler) {
		t.Fatalf("no handler: %v, want ErrNoHandler", err)
	}
	// A responder that never answers.
	sub, _ := nc.Subscribe(ProposeSubject("p"), func(*nats.Msg) {})
	defer sub.Unsubscribe()
	_ = nc.Flush()
	if _, err := c.Propose(context.Background(), []Proposal{{Group: "g", Node: "n1", Seq: 1}}); !errors.Is(err, ErrDecisionTimeout) {
		t.Fatalf("silent handler: %v, want ErrDecisionTimeout", err)
	}
	if _, err := c.Propose(context.Background(), []Proposal{{Group: "g", Node: "bad node", Seq: 1}}); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("invalid proposal: %v, want ErrBadMessage", err)
	}
}

func TestHandlerAnswersMalformedRequestsWithAnError(t *testing.T) {
	s := natstest.RunServer(t)
	a := startHandler(t, s, "h1", liveNodes)
	natstest.Eventually(t, 5*time.Second, func() error {
		if !a.h.Active() {
			return natstest.ErrNotYet
		}
		return nil
	})
	nc := s.Connect()
	for _, body := range []string{`garbage`, `{"v":3,"proposer":"p","proposals":[]}`,
		// A proposer speaking on another node's subject.
		`{"v":3,"proposer":"n9","proposals":[{"group":"g","node":"n1","seq":1}]}`} {
		m, err := nc.Request(ProposeSubject("p"), []byte(body), 2*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if _, err := DecodeReply(m.Data, Request{}); !errors.Is(err, ErrHandlerFailed) {
			t.Errorf("%s: reply %s decodes to %v, want ErrHandlerFailed", body, m.Data, err)
		}
	}
	// One invalid proposal in a batch fails alone.
	data := []byte(`{"v":3,"proposer":"p","proposals":[{"group":"ok","node":"n1","seq":1},{"group":"bad","node":"n1","seq":0}]}`)
	m, err := nc.Request(ProposeSubject("p"), data, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := DecodeRequest(data)
	reply, err := DecodeReply(m.Data, req)
	if err != nil {
		t.Fatal(err)
	}
	if reply.Decisions[0].Outcome != Accepted || reply.Decisions[1].Outcome != Failed {
		t.Fatalf("decisions = %+v", reply.Decisions)
	}
}

// TestHandlerAnswersOnlyInboxes: a request whose reply subject is not an
// inbox (here: the handler's own lease key, a binding key) is dropped and
// counted; nothing is written there.
func TestHandlerAnswersOnlyInboxes(t *testing.T) {
	s := natstest.RunServer(t)
	a := startHandler(t, s, "h1", liveNodes)
	natstest.Eventually(t, 5*time.Second, func() error {
		if !a.h.Active() {
			return natstest.ErrNotYet
		}
		return nil
	})
	nc := s.Connect()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), kvbinding.DefaultNodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := kv.Get(context.Background(), "lease.h")
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"v":3,"proposer":"p","proposals":[{"group":"g","node":"n1","seq":1}]}`)
	for _, reply := range []string{"$KV.grouping-nodes.lease.h", "$KV.grouping-bindings.r.g", "grouping.propose.p", "jms.orders", "_INBOX.*", "_INBOX.a..b"} {
		if err := nc.PublishMsg(&nats.Msg{Subject: ProposeSubject("p"), Reply: reply, Data: body}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: SubjectAdmin, Reply: "$KV.grouping-nodes.lease.h", Data: []byte(`{"v":3,"op":"unbind","group":"g"}`)}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() error {
		if n := a.h.Dropped(); n != 7 {
			return fmt.Errorf("dropped %d, want 7", n)
		}
		return nil
	})
	// A proper request still works, and the lease is the handler's own.
	c := NewClient(nc, "p", 2*time.Second)
	if ds, err := c.Propose(context.Background(), []Proposal{{Group: "g2", Node: "n1", Seq: 1}}); err != nil || ds[0].Outcome != Accepted {
		t.Fatalf("proper request: %+v, %v", ds, err)
	}
	now, err := kv.Get(context.Background(), "lease.h")
	if err != nil {
		t.Fatal(err)
	}
	if l, err := decodeLeaseForTest(now.Value()); err != nil || l != "h/h1" {
		t.Fatalf("lease after forged requests = %s (was %s), %v", now.Value(), lease.Value(), err)
	}
	if _, err := a.h.store.Get(context.Background(), "g"); !errors.Is(err, kvbinding.ErrNotFound) {
		t.Fatalf("a dropped request decided group g: %v", err)
	}
}

func decodeLeaseForTest(data []byte) (string, error) {
	var l kvbinding.Lease
	err := json.Unmarshal(data, &l)
	return l.Holder, err
}

// TestInboxStem: the handler of a node whose own inbox prefix is
// _INBOX.node-n0 answers the per-user inboxes of other nodes and the
// operator (same first token), and nothing outside them.
func TestInboxStem(t *testing.T) {
	for _, prefix := range []string{"", "_INBOX", "_INBOX.node-n0"} {
		h := NewHandler(nil, nil, nil, nil, HandlerConfig{Name: "h", Node: "n0", InboxPrefix: prefix})
		for reply, want := range map[string]bool{
			"_INBOX.node-n1.Zx9.1":       true,
			"_INBOX.operator.Zx9":        true,
			"_INBOX.abc":                 true,
			"_INBOX_custom.abc":          true, // first token starts with the stem, as before
			"":                           false,
			"$KV.grouping-nodes.lease.h": false,
			"$KV.grouping-bindings.r.g":  false,
			"grouping.propose.n1":        false,
			"_INBOX.node-n1.*":           false,
			"_INBOX.node-n1.>":           false,
			"_INBOX.a..b":                false,
			"_INBOX.node-n1.":            false,
			"jms._INBOX.node-n1.x":       false,
			"_IN.node-n1.x":              false,
			"_INBOX.node-n1.x y":         false,
		} {
			if got := h.inbox(reply); got != want {
				t.Errorf("prefix %q: inbox(%q) = %v, want %v", prefix, reply, got, want)
			}
		}
	}
}

// A handler whose renewals fail (here its server is gone; in production a
// partition cuts it off from the servers' quorum) stops deciding once its
// last successful renewal's TTL, less the margin, has passed by its own
// clock: a standby may hold the lease by then, and this handler cannot
// know. It decides nothing until it holds the lease again. Before, it went
// on answering as the active handler for as long as the renewals failed
// with anything but "lease lost" (18 s of a 20 s partition, seen).
func TestHandlerStandsDownByItsOwnClock(t *testing.T) {
	s := natstest.RunServer(t)
	e := startHandler(t, s, "h1", liveNodes, func(c *HandlerConfig) { c.LeaseTTL = 2 * time.Second })
	natstest.Eventually(t, 10*time.Second, func() error {
		if !e.h.Active() {
			return errors.New("not active yet")
		}
		return nil
	})
	s.Stop()
	cut := time.Now()
	natstest.Eventually(t, 20*time.Second, func() error {
		if e.h.Active() {
			return errors.New("still active with its renewals failing")
		}
		return nil
	})
	t.Logf("stood down %v after its server went away (lease TTL 2 s)", time.Since(cut).Round(time.Millisecond))
	if e.h.auth.holds(time.Now()) {
		t.Errorf("stood down but still holds the authority to decide")
	}
	// It decides nothing meanwhile: a record write is refused before it is sent.
	d := e.h.DecideAll(context.Background(), Request{Proposer: "n1", Proposals: []Proposal{{Group: "g", Node: "n1", Seq: 1}}})
	if len(d) != 1 || d[0].Outcome != Failed || d[0].Error != errNoAuthority.Error() {
		t.Errorf("a decision after standing down: %+v, want failed: %v", d, errNoAuthority)
	}
	s.Restart()
	natstest.Eventually(t, 30*time.Second, func() error {
		if !e.h.Active() {
			return errors.New("not active again")
		}
		return nil
	})
}
