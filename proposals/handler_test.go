package proposals

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"grouprouter/internal/natstest"
	"grouprouter/kvbinding"
)

// handlerEnv runs a handler with its own connection, cache and registry.
type handlerEnv struct {
	h      *Handler
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
}

func startHandler(t *testing.T, s *natstest.Server, node string, live []kvbinding.NodeInfo) *handlerEnv {
	t.Helper()
	return startHandlerTB(t, s, node, live)
}

func startHandlerTB(t testing.TB, s *natstest.Server, node string, live []kvbinding.NodeInfo) *handlerEnv {
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
	cache := kvbinding.NewCache(nil)
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
	h := NewHandler(nc, store, cache, reg, HandlerConfig{Name: "h", Node: node, LeaseTTL: time.Second})
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
				ps[g] = Proposal{Group: fmt.Sprintf("g%d", g), Node: []string{"n1", "n2"}[(i+g)%2], FromSeq: 1}
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
			first := results[0][g].Binding
			if d.Binding == nil || d.Binding.Node != first.Node || d.Binding.Revision != first.Revision {
				t.Fatalf("group g%d: proposer %d saw %+v, proposer 0 saw %+v", g, i, d.Binding, first)
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
	before, err := c.Propose(context.Background(), []Proposal{{Group: "kept", Node: "n1", FromSeq: 1}})
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
	after, err := c.Propose(context.Background(), []Proposal{{Group: "kept", Node: "n2", FromSeq: 9}, {Group: "new", Node: "n2", FromSeq: 9}})
	if err != nil {
		t.Fatal(err)
	}
	if after[0].Outcome != Rejected || after[0].Binding.Node != "n1" || after[0].Revision != before[0].Revision {
		t.Fatalf("existing binding changed after takeover: before %+v after %+v", before[0].Binding, after[0].Binding)
	}
	if after[1].Outcome != Accepted || after[1].Binding.Node != "n2" {
		t.Fatalf("new group not decided by the backup: %+v", after[1])
	}
}

func TestClientErrors(t *testing.T) {
	s := natstest.RunServer(t)
	nc := s.Connect()
	c := NewClient(nc, "p", 200*time.Millisecond)
	_, err := c.Propose(context.Background(), []Proposal{{Group: "g", Node: "n1", FromSeq: 1}})
	if !errors.Is(err, ErrNoHandler) {
		t.Fatalf("no handler: %v, want ErrNoHandler", err)
	}
	// A responder that never answers.
	sub, _ := nc.Subscribe(SubjectPropose, func(*nats.Msg) {})
	defer sub.Unsubscribe()
	_ = nc.Flush()
	if _, err := c.Propose(context.Background(), []Proposal{{Group: "g", Node: "n1", FromSeq: 1}}); !errors.Is(err, ErrDecisionTimeout) {
		t.Fatalf("silent handler: %v, want ErrDecisionTimeout", err)
	}
	if _, err := c.Propose(context.Background(), []Proposal{{Group: "g", Node: "bad node", FromSeq: 1}}); !errors.Is(err, ErrBadMessage) {
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
	for _, body := range []string{`garbage`, `{"v":2,"proposer":"p","proposals":[]}`} {
		m, err := nc.Request(SubjectPropose, []byte(body), 2*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if _, err := DecodeReply(m.Data, Request{}); !errors.Is(err, ErrHandlerFailed) {
			t.Errorf("%s: reply %s decodes to %v, want ErrHandlerFailed", body, m.Data, err)
		}
	}
	// One invalid proposal in a batch fails alone.
	data := []byte(`{"v":2,"proposer":"p","proposals":[{"group":"ok","node":"n1","from_seq":1},{"group":"bad","node":"n1","from_seq":0}]}`)
	m, err := nc.Request(SubjectPropose, data, 2*time.Second)
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
