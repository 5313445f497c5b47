package consumer_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
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
