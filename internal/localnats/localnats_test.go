package localnats

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestStart: one server and a cluster of three come up with JetStream, a
// client of each server reaches the others after it, and a stream
// replicated on all three takes writes.
func TestStart(t *testing.T) {
	for _, n := range []int{1, 3} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		c, err := Start(ctx, t.TempDir(), "test", n)
		if err != nil {
			cancel()
			t.Fatalf("%d servers: %v", n, err)
		}
		if got := c.URLsFor(n - 1); len(got) != n || got[0] != c.URLs()[n-1] {
			t.Errorf("URLsFor(%d) = %v, want server %d's first, then the others", n-1, got, n-1)
		}
		nc, err := c.Connect(n-1, "test")
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}, Replicas: n}); err != nil {
			t.Fatalf("%d servers: stream: %v", n, err)
		}
		if ack, err := js.Publish(ctx, "t", []byte("x")); err != nil || ack.Sequence != 1 {
			t.Fatalf("%d servers: publish: %v %v", n, ack, err)
		}
		nc.Close()
		c.Close()
		cancel()
	}
	if _, err := Connect(nil, "none"); err == nil {
		t.Error("Connect with no URL succeeded")
	}
}
