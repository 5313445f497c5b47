package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/wire"
)

// Example consumes node n1's queue with an in-process server. The queue
// is filled by hand here; a router does that in production.
func Example() {
	dir, _ := os.MkdirTemp("", "consumer-example")
	defer os.RemoveAll(dir)
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		fmt.Println("server not ready")
		return
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// What the router of node n1 sets up and queues.
	_, _ = js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.QueueStream, Subjects: []string{wire.QueueSubjectPrefix + ">"}, Retention: jetstream.WorkQueuePolicy})
	_, _ = js.CreateOrUpdateConsumer(ctx, wire.QueueStream, jetstream.ConsumerConfig{
		Durable: wire.QueueConsumer("n1"), FilterSubject: wire.QueueFilter("n1"), AckPolicy: jetstream.AckExplicitPolicy,
		PriorityGroups: []string{wire.PriorityGroup}, PriorityPolicy: jetstream.PriorityPolicyPinned, PinnedTTL: time.Minute,
	})
	for i, group := range []string{"alice", "bob", "alice", "bob", "alice"} {
		m := nats.NewMsg(wire.QueueSubject("n1", "orders.new"))
		m.Header.Set("Group-Id", group)
		m.Header.Set(wire.HeaderIngressSeq, strconv.Itoa(i+1))
		m.Header.Set(wire.HeaderEpoch, "7")
		m.Data = []byte("order " + strconv.Itoa(i+1))
		_, _ = js.PublishMsg(ctx, m)
	}

	var (
		mu   sync.Mutex
		seen = map[string][]string{}
	)
	runCtx, stop := context.WithCancel(ctx)
	err = consumer.Consume(runCtx, js, "n1", func(ctx context.Context, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		seen[m.Group] = append(seen[m.Group], fmt.Sprintf("%s (fence %d:%d)", m.Data, m.Fence.Epoch, m.Fence.IngressSeq))
		if len(seen["alice"])+len(seen["bob"]) == 5 {
			stop()
		}
		return nil
	}, consumer.WithConcurrency(8))
	if err != nil {
		fmt.Println(err)
	}
	for _, g := range slices.Sorted(maps.Keys(seen)) {
		fmt.Println(g, seen[g])
	}
	// Output:
	// alice [order 1 (fence 7:1) order 3 (fence 7:3) order 5 (fence 7:5)]
	// bob [order 2 (fence 7:2) order 4 (fence 7:4)]
}

// exampleQueue starts an in-process server and queues, on node n1's queue,
// one message per group given ("order <i>", ingress seq i, epoch 7), as
// node n1's router would. It returns a JetStream context and a function
// that stops the server.
func exampleQueue(groups ...string) (jetstream.JetStream, func()) {
	dir, _ := os.MkdirTemp("", "consumer-example")
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		panic(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		panic("server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		panic(err)
	}
	done := func() { nc.Close(); srv.Shutdown(); _ = os.RemoveAll(dir) }
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = js.CreateStream(ctx, jetstream.StreamConfig{Name: wire.QueueStream, Subjects: []string{wire.QueueSubjectPrefix + ">"}, Retention: jetstream.WorkQueuePolicy})
	_, _ = js.CreateOrUpdateConsumer(ctx, wire.QueueStream, jetstream.ConsumerConfig{
		Durable: wire.QueueConsumer("n1"), FilterSubject: wire.QueueFilter("n1"), AckPolicy: jetstream.AckExplicitPolicy,
		PriorityGroups: []string{wire.PriorityGroup}, PriorityPolicy: jetstream.PriorityPolicyPinned, PinnedTTL: time.Minute,
	})
	for i, group := range groups {
		m := nats.NewMsg(wire.QueueSubject("n1", "orders.new"))
		m.Header.Set(wire.DefaultGroupHeader, group)
		m.Header.Set(wire.HeaderIngressSeq, strconv.Itoa(i+1))
		m.Header.Set(wire.HeaderEpoch, "7")
		m.Data = []byte("order " + strconv.Itoa(i+1))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			panic(err)
		}
	}
	return js, done
}

// waitUntil polls cond every 10 ms for up to 20 s.
func waitUntil(cond func() bool) bool {
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return false
}

// ExampleConsume applies node n1's queued messages to a store that keeps,
// per group, the fence of the last write: a write whose fence is not
// higher is a stale copy (made before the group moved) and is dropped.
// A nil return acknowledges the message.
func ExampleConsume() {
	js, stopServer := exampleQueue("alice", "bob", "alice")
	defer stopServer()

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var (
		mu      sync.Mutex
		applied = map[string]consumer.Fence{} // the store: group -> fence of its last write
		handled int
	)
	err := consumer.Consume(ctx, js, "n1", func(ctx context.Context, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if handled++; handled == 3 {
			stop() // Consume drains and returns nil
		}
		if !applied[m.Group].Less(m.Fence) {
			return nil // a stale copy: acknowledge it unapplied
		}
		applied[m.Group] = m.Fence // with the write, in one transaction
		return nil
	}, consumer.WithConcurrency(64))
	fmt.Println("Consume:", err)
	fmt.Println("alice at", applied["alice"].IngressSeq, "bob at", applied["bob"].IngressSeq)
	// Output:
	// Consume: <nil>
	// alice at 3 bob at 2
}

// ExampleWithMaxAttempts retries a failing message after a backoff while
// the group's later messages wait; other groups go on. The third attempt
// succeeds here; a fourth failure would have parked the group.
func ExampleWithMaxAttempts() {
	js, stopServer := exampleQueue("alice", "alice")
	defer stopServer()

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var log []string
	err := consumer.Consume(ctx, js, "n1", func(ctx context.Context, m *consumer.Message) error {
		log = append(log, fmt.Sprintf("%s attempt %d", m.Data, m.Attempt)) // one message of a group at a time
		if m.IngressSeq == 1 && m.Attempt < 3 {
			return errors.New("store unavailable") // tried again after the backoff
		}
		if m.IngressSeq == 2 {
			stop()
		}
		return nil
	}, consumer.WithMaxAttempts(4), consumer.WithBackoff(10*time.Millisecond, time.Second))
	fmt.Println("Consume:", err)
	fmt.Println(strings.Join(log, "\n"))
	// Output:
	// Consume: <nil>
	// order 1 attempt 1
	// order 1 attempt 2
	// order 1 attempt 3
	// order 2 attempt 1
}

// ExampleTerminal parks a group at a message that no retry can fix: the
// message and the group's later messages go, in order, to the parked
// stream, while the other groups go on. GetParked (grouprouter parked)
// shows the parked group.
func ExampleTerminal() {
	js, stopServer := exampleQueue("alice", "bob", "alice", "bob")
	defer stopServer()

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var (
		mu      sync.Mutex
		handled []string
	)
	go func() {
		done <- consumer.Consume(ctx, js, "n1", func(ctx context.Context, m *consumer.Message) error {
			if m.Group == "bob" {
				return consumer.Terminal(errors.New("unknown customer"))
			}
			mu.Lock()
			handled = append(handled, fmt.Sprintf("%s %s", m.Group, m.Data))
			mu.Unlock()
			return nil
		})
	}()
	var pg consumer.ParkedGroup
	waitUntil(func() bool {
		var err error
		pg, err = consumer.GetParked(ctx, js, "bob")
		mu.Lock()
		defer mu.Unlock()
		return err == nil && pg.Messages == 2 && len(handled) == 2
	})
	stop()
	fmt.Println("Consume:", <-done)
	fmt.Println("handled:", handled)
	fmt.Printf("parked %s at ingress seq %d: %d messages, %d attempt, reason %q\n", pg.Group, pg.Head, pg.Messages, pg.Record.Attempts, pg.Record.Reason)
	// Output:
	// Consume: <nil>
	// handled: [alice order 1 alice order 3]
	// parked bob at ingress seq 2: 2 messages, 1 attempt, reason "terminal: unknown customer"
}

// ExampleReplay retries a parked group once the fault is fixed, as
// "grouprouter retry" does: the running Consume handles its parked
// messages in order (Message.Replayed), then the group runs again.
func ExampleReplay() {
	js, stopServer := exampleQueue("bob", "bob")
	defer stopServer()

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var (
		mu     sync.Mutex
		broken = true
		log    []string
	)
	go func() {
		done <- consumer.Consume(ctx, js, "n1", func(ctx context.Context, m *consumer.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if broken {
				return consumer.Terminal(errors.New("schema mismatch"))
			}
			log = append(log, fmt.Sprintf("%s replayed=%v", m.Data, m.Replayed))
			return nil
		})
	}()
	waitUntil(func() bool {
		pg, err := consumer.GetParked(ctx, js, "bob")
		return err == nil && pg.Messages == 2
	})

	mu.Lock()
	broken = false // the fix is deployed
	mu.Unlock()
	if _, err := consumer.Replay(ctx, js, "bob", consumer.ReplayRetry, ""); err != nil {
		fmt.Println(err)
	}
	waitUntil(func() bool {
		_, err := consumer.GetParked(ctx, js, "bob")
		return errors.Is(err, consumer.ErrNotParked)
	})
	stop()
	fmt.Println("Consume:", <-done)
	fmt.Println(strings.Join(log, "\n"))
	// Output:
	// Consume: <nil>
	// order 1 replayed=true
	// order 2 replayed=true
}
