package router

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// TestHardenParkedBucket: a parked bucket as an earlier release created it
// (nats.go's defaults: roll-ups allowed) takes a roll-up that erases every
// parked record; kvbinding.HardenBucket makes it refuse roll-ups and purges
// and keeps its records; EnsureParking creates it so from the start.
func TestHardenParkedBucket(t *testing.T) {
	s := natstest.RunServer(t)
	js := s.JetStream()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rollup := func(key string) error { return natstest.RollupAll(ctx, js, "$KV."+ParkedBucket+"."+key) }
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: ParkedBucket})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "r.a", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := rollup("r.b"); err != nil {
		t.Fatalf("an earlier release's bucket refused a roll-up (the test's premise): %v", err)
	}
	if _, err := kv.Get(ctx, "r.a"); err == nil {
		t.Fatal("a roll-up left the other records (the test's premise)")
	}
	changed, err := kvbinding.HardenBucket(ctx, js, ParkedBucket)
	if err != nil || !changed {
		t.Fatalf("HardenBucket: %v %v", changed, err)
	}
	if changed, err := kvbinding.HardenBucket(ctx, js, ParkedBucket); err != nil || changed {
		t.Fatalf("a second HardenBucket: %v %v", changed, err)
	}
	if _, err := kv.Get(ctx, "r.b"); err != nil {
		t.Fatalf("a record after hardening: %v", err)
	}
	if err := rollup("r.c"); err == nil {
		t.Error("the hardened bucket took a roll-up")
	}
	if err := js.DeleteStream(ctx, "KV_"+ParkedBucket); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureParking(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	if err := rollup("r.d"); err == nil {
		t.Error("a bucket EnsureParking created took a roll-up")
	}
	if changed, err := kvbinding.HardenBucket(ctx, js, ParkedBucket); err != nil || changed {
		t.Errorf("a bucket EnsureParking created is not hardened: %v %v", changed, err)
	}
}

// TestEnsureParkingConcurrently: a LOCAL node (3 replicas) and consumers
// of package consumer (1 replica, their default) that create the parked
// stream at once on 3 servers all succeed. Before, one that found the
// name in use (another's create under way, the stream not answering yet)
// gave up after three quick tries, and a consumer failed to start
// (TestNodeRestartAfterCrashRoutesAgain, once in 20 runs: "create stream
// GROUPING_PARKED: ... stream name already in use"); and one look at a
// stream with no leader yet took the caller's whole deadline.
func TestEnsureParkingConcurrently(t *testing.T) {
	c := natstest.RunCluster(t, 3)
	jss := make([]jetstream.JetStream, 3)
	for i, s := range c.Servers {
		jss[i] = s.JetStream()
		natstest.Eventually(t, 20*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := jss[i].AccountInfo(ctx)
			return err
		})
	}
	errs := make(chan error, len(jss))
	for i, js := range jss {
		replicas := 1
		if i == 0 {
			replicas = 3
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			_, err := EnsureParking(ctx, js, replicas)
			errs <- err
		}()
	}
	for range jss {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
