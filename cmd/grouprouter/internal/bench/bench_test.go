package bench

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// Hot paths of the router, through the public APIs.

func BenchmarkKey(b *testing.B) {
	for _, id := range []string{"order-1234567", "order:1234567/ünïcode"} {
		b.Run(id, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := kvbinding.Key(id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func fillCache(c *kvbinding.Cache, n int) []string {
	groups := make([]string, n)
	nodes := []string{"n0", "n1", "n2"}
	for i := range groups {
		groups[i] = "order-" + strconv.Itoa(1_000_000+i)
		c.Apply(kvbinding.Binding{Group: groups[i], State: kvbinding.StateBound, Node: nodes[i%3],
			FromSeq: uint64(i + 1), Revision: uint64(i + 1)})
	}
	return groups
}

func BenchmarkCacheLookup(b *testing.B) {
	c := kvbinding.NewCache(kvbinding.CacheConfig{})
	groups := fillCache(c, 100_000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, ok := c.Lookup(groups[i%len(groups)]); !ok {
			b.Fatal("missing")
		}
		i++
	}
}

func BenchmarkCacheLookupParallel(b *testing.B) {
	c := kvbinding.NewCache(kvbinding.CacheConfig{})
	groups := fillCache(c, 100_000)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			c.Lookup(groups[i%len(groups)])
			i++
		}
	})
}

// BenchmarkCacheMemory reports the heap a cache holds per binding at 1M
// bindings (the target: at most 200 bytes).
func BenchmarkCacheMemory(b *testing.B) {
	const n = 1_000_000
	var perBinding float64
	for b.Loop() {
		before := settledHeap()
		c := kvbinding.NewCache(kvbinding.CacheConfig{})
		fillCache(c, n)
		after := settledHeap()
		perBinding = float64(int64(after)-int64(before)) / n
		runtime.KeepAlive(c)
	}
	b.ReportMetric(perBinding, "B/binding")
}

func BenchmarkUnmarshalBinding(b *testing.B) {
	val, err := bindingValue("order-1234567", "n1", 42)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(val)))
	for b.Loop() {
		if _, err := kvbinding.UnmarshalBinding(val); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTransition(b *testing.B) {
	live := map[string]proposals.NodeState{
		"n0": {HasConsumer: true, Groups: 1000}, "n1": {HasConsumer: true, Groups: 990}, "n2": {HasConsumer: false, Groups: 5},
	}
	now := time.Now()
	b.Run("new group", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			proposals.Transition("order-1", nil, proposals.Input{Op: proposals.OpBind, By: "n2", Node: "n1", Seq: 7}, proposals.Env{Now: now, Handler: "h/n0", Live: live})
		}
	})
	b.Run("bound group", func(b *testing.B) {
		existing := &kvbinding.Binding{State: kvbinding.StateBound, Node: "n0", FromSeq: 3, Revision: 9}
		b.ReportAllocs()
		for b.Loop() {
			proposals.Transition("order-1", existing, proposals.Input{Op: proposals.OpBind, By: "n2", Node: "n1", Seq: 7}, proposals.Env{Now: now, Handler: "h/n0", Live: live})
		}
	})
}

// BenchmarkSteadyState runs the steady state end to end in this process
// (server, one router node, producer, consumer), then the relay baseline on
// the same server, each with b.N messages over 1,000 hot groups, and
// reports the router's msgs/s and its ratio to the relay's.
func BenchmarkSteadyState(b *testing.B) {
	srv := natstest.RunServer(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bb := &bencher{stderr: io.Discard, started: time.Now()}
	mon, prodConn := srv.Connect(), srv.Connect()
	sk, err := newSink(mon)
	if err != nil {
		b.Fatal(err)
	}
	defer sk.stop()
	prod, err := newProducer([]*nats.Conn{prodConn}, defaultPayload)
	if err != nil {
		b.Fatal(err)
	}
	e := &env{mon: mon, sink: sk, prodConns: []*nats.Conn{prodConn}, prod: prod}
	if e.js, err = jetstream.New(mon); err != nil {
		b.Fatal(err)
	}

	// The router.
	rctx, stopRouter := context.WithCancel(ctx)
	r, err := router.New(srv.Connect(), router.Config{Name: handlerName, Type: router.Local, Address: benchAddress,
		Timeout: 5 * time.Second, Node: "n0"})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	select {
	case <-r.Ready():
	case err := <-done:
		b.Fatalf("router stopped: %v", err)
	}
	if err := sk.consume(ctx, "n0"); err != nil {
		b.Fatal(err)
	}
	if err := waitRegistry(ctx, e.js, []string{"n0"}, 1, 20*time.Second); err != nil {
		b.Fatal(err)
	}
	hot := hotGroups("a", defaultGroups)
	if _, err := bb.measureRun(ctx, e, nil, runSpec{label: "warm-up", n: len(hot), groups: roundRobin(hot, true)}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	got, err := bb.measureRun(ctx, e, nil, runSpec{label: "router", n: b.N, groups: roundRobin(hot, false)})
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	stopRouter()
	if err := <-done; err != nil {
		b.Fatal(err)
	}

	// The relay, same server, same consumer.
	s, err := e.js.Stream(ctx, router.IngressStream)
	if err != nil {
		b.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	lctx, stopRelay := context.WithCancel(ctx)
	rl := &relay{node: "n0", startSeq: info.State.LastSeq + 1, log: discardLogger()}
	ready := make(chan struct{})
	relayDone := make(chan error, 1)
	go func() { relayDone <- rl.run(lctx, srv.Connect(), func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-relayDone:
		b.Fatalf("relay stopped: %v", err)
	}
	base, err := bb.measureRun(ctx, e, nil, runSpec{label: "relay", n: b.N, groups: roundRobin(hot, false)})
	if err != nil {
		b.Fatal(err)
	}
	stopRelay()
	<-relayDone
	b.ReportMetric(got.Rate, "msgs/s")
	if base.Rate > 0 {
		b.ReportMetric(got.Rate/base.Rate, "ratio_vs_relay")
	}
}

// TestRelayAndRouterInProcess is a fast check of the in-process pieces the
// benchmark uses (sink, producer, relay), without child processes.
func TestRelayAndRouterInProcess(t *testing.T) {
	srv := natstest.RunServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mon := srv.Connect()
	sk, err := newSink(mon)
	if err != nil {
		t.Fatal(err)
	}
	defer sk.stop()
	prod, err := newProducer([]*nats.Conn{srv.Connect()}, 64)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{mon: mon, sink: sk, prod: prod}
	// The streams and the node's consumer come from a router node.
	rctx, stopRouter := context.WithCancel(ctx)
	r, err := router.New(srv.Connect(), router.Config{Name: handlerName, Type: router.Local, Address: benchAddress,
		Timeout: 5 * time.Second, Node: "n0"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	<-r.Ready()
	if err := sk.consume(ctx, "n0"); err != nil {
		t.Fatal(err)
	}
	bb := &bencher{stderr: io.Discard, started: time.Now()}
	m, err := bb.measureRun(ctx, e, nil, runSpec{label: "router", n: 300, keepLat: true, groupPrefix: "g-",
		groups: fresh("g-"), newGroups: 300})
	if err != nil {
		t.Fatal(err)
	}
	if m.Lat.N != 300 || m.FirstLat.N != 300 || m.Binds != 300 || m.Rate <= 0 {
		t.Fatalf("router run: %+v", m)
	}
	stopRouter()
	<-done

	rl := &relay{node: "n0", startSeq: 0, log: discardLogger()}
	lctx, stopRelay := context.WithCancel(ctx)
	ready := make(chan struct{})
	relayDone := make(chan error, 1)
	// Start after everything routed so far: the relay would copy it again.
	js, _ := jetstream.New(mon)
	// The relay writes to a queue of limits retention, as relayArgs
	// prepares it, consumed through the same durable consumer.
	sk.forget()
	if err := limitsQueue(ctx, js); err != nil {
		t.Fatal(err)
	}
	q, err := js.Stream(ctx, router.QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	if qi, err := q.Info(ctx); err != nil || qi.Config.Retention != jetstream.LimitsPolicy {
		t.Fatalf("the relay's queue stream: %v, err %v", qi, err)
	}
	if err := sk.consume(ctx, "n0"); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, router.IngressStream)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := s.Info(ctx)
	rl.startSeq = info.State.LastSeq + 1
	go func() { relayDone <- rl.run(lctx, srv.Connect(), func() { close(ready) }) }()
	<-ready
	m, err = bb.measureRun(ctx, e, nil, runSpec{label: "relay", n: 300, keepLat: true, groups: roundRobin([]string{"x"}, false)})
	if err != nil {
		t.Fatal(err)
	}
	stopRelay()
	if err := <-relayDone; err != nil {
		t.Fatal(err)
	}
	if m.Lat.N != 300 || rl.relayed.Load() != 300 || sk.stray.Load() != 0 {
		t.Fatalf("relay run: %+v, relayed %d, stray %d", m, rl.relayed.Load(), sk.stray.Load())
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
