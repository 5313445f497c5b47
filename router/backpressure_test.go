package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/grouprouter/grouprouter/internal/natstest"
)

// The back-pressure tests run a node whose queue stream takes ~4 messages
// of 1 KB (its queue has no consumer until the test consumes it) and that
// holds at most 4 more: publishing fullGroup messages of one group fills
// it, and its reader waits for room.
const fullGroup = 20

func fullNodeConfig(reg prometheus.Registerer) Config {
	return Config{Name: "h", Type: Local, Address: "jms", Timeout: time.Second, Node: "n0",
		Heartbeat: 100 * time.Millisecond, LeaseTTL: time.Second, CheckpointInterval: 100 * time.Millisecond,
		MaxHeldMessages: 4, QueueMaxBytes: 4 << 10, Metrics: reg,
		// No spilling: these tests are about the reader waiting at the
		// held bounds (a group's messages behind its undecided head
		// would otherwise be spilled and the reader go on).
		MaxSpilledBytes: -1}
}

// runNode starts a node with cfg and waits until it is ready; stop stops it
// and returns what Run returned, or fails the test if it does not return.
func runNode(t *testing.T, nc *nats.Conn, cfg Config) (r *Router, stop func() error) {
	t.Helper()
	r, err := New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-r.Ready()
	return r, func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return: the reader waiting for room was not woken by the stop")
			return nil
		}
	}
}

// publishGroup publishes fullGroup messages of group g, each body starting
// with its two-digit index.
func publishGroup(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	body := make([]byte, 1000)
	for i := 0; i < fullGroup; i++ {
		msg := nats.NewMsg("jms.orders")
		msg.Header.Set("Group-Id", "g")
		msg.Data = append([]byte(fmt.Sprintf("%02d", i)), body...)
		if _, err := js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
}

// consumeInOrder consumes n0's queue: the fullGroup messages, in order,
// once.
func consumeInOrder(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	cons, err := js.Consumer(context.Background(), QueueStream, QueueConsumer("n0"))
	if err != nil {
		t.Fatal(err)
	}
	for next := 0; next < fullGroup; {
		batch, err := cons.Fetch(5, jetstream.FetchMaxWait(2*time.Second), jetstream.FetchPriorityGroup(PriorityGroup))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if want := fmt.Sprintf("%02d", next); string(m.Data()[:2]) != want {
				t.Fatalf("message %q, want %s", m.Data()[:2], want)
			}
			next++
			if err := m.DoubleAck(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 0 || info.NumAckPending != 0 {
		t.Errorf("after all %d: %d pending, %d unacked (a message routed twice)", fullGroup, info.NumPending, info.NumAckPending)
	}
}

// TestBackPressureIsMeasured: a node whose queue stream is full cannot
// publish; its held messages reach their bound, its reader waits, and
// grouprouter_ingress_full_seconds_total counts the wait while it lasts.
// Once the queue is consumed, everything is routed, in order.
func TestBackPressureIsMeasured(t *testing.T) {
	s := natstest.RunServer(t)
	nc := s.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	_, stop := runNode(t, nc, fullNodeConfig(reg))
	defer func() { _ = stop() }()
	publishGroup(t, js)
	fullSeconds := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "grouprouter_ingress_full_seconds_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatal("grouprouter_ingress_full_seconds_total not exported")
		return 0
	}
	var first float64
	natstest.Eventually(t, 20*time.Second, func() error {
		if first = fullSeconds(); first <= 0 {
			return fmt.Errorf("full for %vs", first)
		}
		return nil
	})
	natstest.Eventually(t, 20*time.Second, func() error {
		if now := fullSeconds(); now <= first {
			return fmt.Errorf("full for %vs, as before: a wait under way is not counted", now)
		}
		return nil
	})
	consumeInOrder(t, js)
}

// TestStopWhileFull: a node whose reader waits for room (its queue full,
// its held messages at their bound) stops when asked, and a restart routes
// what is left, in order, once.
func TestStopWhileFull(t *testing.T) {
	s := natstest.RunServer(t)
	nc := s.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	r, stop := runNode(t, nc, fullNodeConfig(nil))
	publishGroup(t, js)
	natstest.Eventually(t, 20*time.Second, func() error {
		if r.rs.fullSince.Load() == 0 {
			return fmt.Errorf("reader not waiting for room (held %d)", r.Stats().Held)
		}
		return nil
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	_, stop = runNode(t, nc, fullNodeConfig(nil))
	defer func() { _ = stop() }()
	consumeInOrder(t, js)
}
