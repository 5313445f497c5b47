package router

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/proposals"
)

// TestRunLeavesNothingBehind: every goroutine and subscription a node
// starts (reader, asker, timers, hand-over, liveness, the LOCAL handler and
// its NATS service, the cache and registry watches, the publisher) ends
// before Run returns, also after it routed, decided and moved groups.
func TestRunLeavesNothingBehind(t *testing.T) {
	s := natstest.RunServer(t)
	nc := s.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	baseSubs := nc.NumSubscriptions()

	cfg := Config{Name: "h", Type: Local, Address: "jms", Timeout: time.Second, Node: "n0",
		Heartbeat: 100 * time.Millisecond, LeaseTTL: time.Second, CheckpointInterval: 100 * time.Millisecond,
		GroupTimeout: 300 * time.Millisecond, ReaperPeriod: 100 * time.Millisecond}
	r, err := New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	other, err := New(nc, Config{Name: "h", Type: Remote, Address: "jms", Timeout: time.Second, Node: "n1",
		Heartbeat: 100 * time.Millisecond, CheckpointInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- r.Run(ctx) }()
	go func() { done <- other.Run(ctx) }()
	<-r.Ready()
	<-other.Ready()
	natstest.Eventually(t, 10*time.Second, func() error {
		if !r.HandlerActive() {
			return natstest.ErrNotYet
		}
		return nil
	})
	for i := 0; i < 20; i++ {
		msg := nats.NewMsg("jms.orders")
		msg.Header.Set("Group-Id", fmt.Sprintf("g%d", i%5))
		msg.Data = []byte("x")
		if _, err := js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		if st := r.Stats(); st.Routed+other.Stats().Routed < 20 {
			return fmt.Errorf("routed %d+%d of 20", st.Routed, other.Stats().Routed)
		}
		return nil
	})
	// A move exercises the hand-over shell; the group timeout the release.
	b, ok := r.Cache().Lookup("g0")
	if !ok {
		t.Fatal("g0 not bound")
	}
	target := "n1"
	if b.Node == "n1" {
		target = "n0"
	}
	if _, err := proposals.Move(context.Background(), nc, "g0", target, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// Once the move is over, g0 may move on (neither node has a consumer,
	// and a starved heartbeat makes a node gone for a while): any end of
	// the hand-over will do.
	natstest.Eventually(t, 10*time.Second, func() error {
		if now, _ := r.Cache().Lookup("g0"); now.Revision <= b.Revision || !now.Settled() && now.State != "released" {
			return fmt.Errorf("g0 is %+v", now)
		}
		return nil
	})

	cancel()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	// The connection's own request multiplexer (created by the first
	// request) is the connection's, not the node's. (A NATS service's
	// subscriptions are drained: they go shortly after Stop.)
	natstest.Eventually(t, 5*time.Second, func() error {
		if n := nc.NumSubscriptions(); n > baseSubs+1 {
			return fmt.Errorf("%d subscriptions left on the connection after Run returned (was %d)", n, baseSubs)
		}
		return nil
	})
	nc.Close()
	// The server's goroutines stay (it runs until the test ends); none of
	// this module's or of the client's may.
	natstest.Eventually(t, 5*time.Second, func() error {
		if left := ourGoroutines(); len(left) > 0 {
			return fmt.Errorf("%d goroutines left, e.g.\n%s", len(left), left[0])
		}
		return nil
	})
}

// ourGoroutines returns the stacks of the goroutines running code of this
// module (outside tests) or of the NATS client.
func ourGoroutines() []string {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "_test.go") || strings.Contains(g, "testing.tRunner") {
			continue
		}
		if strings.Contains(g, "github.com/grouprouter/grouprouter/") || strings.Contains(g, "nats-io/nats.go") {
			out = append(out, g)
		}
	}
	return out
}

func TestConsumerPresent(t *testing.T) {
	now := time.Now()
	recent, old := now.Add(-time.Second), now.Add(-time.Minute)
	for _, tt := range []struct {
		name string
		info jetstream.ConsumerInfo
		want bool
	}{
		{"pulling", jetstream.ConsumerInfo{NumWaiting: 1}, true},
		{"pinned", jetstream.ConsumerInfo{PriorityGroups: []jetstream.PriorityGroupState{{Group: "grouping", PinnedClientID: "x"}}}, true},
		{"busy with what it pulled", jetstream.ConsumerInfo{NumAckPending: 32, Delivered: jetstream.SequenceInfo{Last: &recent}}, true},
		{"acking lately", jetstream.ConsumerInfo{NumAckPending: 32, AckFloor: jetstream.SequenceInfo{Last: &recent}}, true},
		{"holding messages, silent past the ack wait", jetstream.ConsumerInfo{NumAckPending: 32, Delivered: jetstream.SequenceInfo{Last: &old}}, false},
		{"nothing", jetstream.ConsumerInfo{}, false},
	} {
		if got := consumerPresent(&tt.info, now); got != tt.want {
			t.Errorf("%s: consumerPresent = %v, want %v", tt.name, got, tt.want)
		}
	}
}
