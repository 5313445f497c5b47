package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"grouprouter/internal/natstest"
)

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
	cfg := Config{Name: "h", Type: Local, Address: "jms", Timeout: time.Second, Node: "n0",
		Heartbeat: 100 * time.Millisecond, LeaseTTL: time.Second, CheckpointInterval: 100 * time.Millisecond,
		MaxHeldMessages: 4, QueueMaxBytes: 4 << 10, Metrics: reg}
	r, err := New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	<-r.Ready()

	const n = 20
	body := make([]byte, 1000)
	for i := 0; i < n; i++ {
		msg := nats.NewMsg("jms.orders")
		msg.Header.Set("Group-Id", "g")
		msg.Data = append([]byte(fmt.Sprintf("%02d", i)), body...)
		if _, err := js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
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
	// The queue holds ~4 messages; the node holds 4 more, then waits.
	var first float64
	natstest.Eventually(t, 20*time.Second, func() error {
		if first = fullSeconds(); first <= 0 {
			return fmt.Errorf("full for %vs, held %d", first, r.Stats().Held)
		}
		return nil
	})
	natstest.Eventually(t, 20*time.Second, func() error {
		if now := fullSeconds(); now <= first {
			return fmt.Errorf("full for %vs, as before: a wait under way is not counted", now)
		}
		return nil
	})

	// Consume the queue: room comes back and everything is routed in order.
	cons, err := js.Consumer(context.Background(), QueueStream, QueueConsumer("n0"))
	if err != nil {
		t.Fatal(err)
	}
	for next := 0; next < n; {
		batch, err := cons.Fetch(5, jetstream.FetchMaxWait(2*time.Second), jetstream.FetchPriorityGroup(PriorityGroup))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if want := fmt.Sprintf("%02d", next); string(m.Data()[:2]) != want {
				t.Fatalf("message %q, want %s", m.Data()[:2], want)
			}
			next++
			if err := m.DoubleAck(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		if got == 0 && batch.Error() != nil {
			t.Fatalf("fetch after %d messages: %v", next, batch.Error())
		}
	}
}

// TestStopWhileFull: a node whose reader waits for room (its queue full,
// its held messages at their bound) stops when asked, and routes what is
// left after a restart.
func TestStopWhileFull(t *testing.T) {
	s := natstest.RunServer(t)
	nc := s.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Name: "h", Type: Local, Address: "jms", Timeout: time.Second, Node: "n0",
		Heartbeat: 100 * time.Millisecond, LeaseTTL: time.Second, CheckpointInterval: 100 * time.Millisecond,
		MaxHeldMessages: 4, QueueMaxBytes: 4 << 10}
	start := func() (*Router, context.CancelFunc, chan error) {
		r, err := New(nc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		<-r.Ready()
		return r, cancel, done
	}
	r, cancel, done := start()
	const n = 20
	body := make([]byte, 1000)
	for i := 0; i < n; i++ {
		msg := nats.NewMsg("jms.orders")
		msg.Header.Set("Group-Id", "g")
		msg.Data = append([]byte(fmt.Sprintf("%02d", i)), body...)
		if _, err := js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 20*time.Second, func() error {
		if r.fullSince.Load() == 0 {
			return fmt.Errorf("reader not waiting for room (held %d)", r.Stats().Held)
		}
		return nil
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return: the reader waiting for room was not woken by the stop")
	}

	// A restart routes the rest once the queue is consumed, in order, once.
	_, cancel, done = start()
	defer func() {
		cancel()
		<-done
	}()
	cons, err := js.Consumer(context.Background(), QueueStream, QueueConsumer("n0"))
	if err != nil {
		t.Fatal(err)
	}
	for next := 0; next < n; {
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
		t.Errorf("after all %d: %d pending, %d unacked (a message routed twice)", n, info.NumPending, info.NumAckPending)
	}
}
