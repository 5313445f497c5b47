package kvbinding

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
)

// rollupAll publishes a roll-up on key of bucket (natstest.RollupAll).
func rollupAll(ctx context.Context, js jetstream.JetStream, bucket, key string) error {
	return natstest.RollupAll(ctx, js, "$KV."+bucket+"."+key)
}

// TestRegistryDeniesRollups: a registry bucket created by this release
// refuses a roll-up on a node's own key (which would purge the lease and
// every other record), while per-key TTLs still expire a lease, so that a
// standby's create takes it.
func TestRegistryDeniesRollups(t *testing.T) {
	ctx, js, reg := openTestRegistry(t)
	if err := reg.Announce(ctx, NodeInfo{Node: "n1"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.AcquireLease(ctx, "h", "h/n0", time.Second); err != nil {
		t.Fatal(err)
	}
	if ok, err := reg.Hardened(ctx); err != nil || !ok {
		t.Fatalf("a new bucket is not hardened: %v %v", ok, err)
	}
	err := rollupAll(ctx, js, DefaultNodesBucket, CheckpointKey("n2"))
	if err == nil {
		t.Fatal("a roll-up on a node's key was stored")
	}
	if _, err := reg.GetLease(ctx, "h"); err != nil {
		t.Fatalf("the lease is gone after a refused roll-up: %v", err)
	}
	s, err := js.Stream(ctx, "KV_"+DefaultNodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx); err == nil {
		t.Error("the registry bucket allowed a purge")
	}
	// The lease (1 s TTL) expires without a marker; a standby's create
	// then takes it.
	natstest.Eventually(t, 5*time.Second, func() error {
		_, err := reg.AcquireLease(ctx, "h", "h/n1", time.Second)
		return err
	})
}

// TestHardenEarlierBucket: a registry bucket as an earlier release created
// it (expiry markers, roll-ups allowed) takes a roll-up; Harden updates it
// to refuse them and keeps its records; a second Harden changes nothing.
func TestHardenEarlierBucket(t *testing.T) {
	s := natstest.RunServer(t)
	js := s.JetStream()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: DefaultNodesBucket, History: 1,
		LimitMarkerTTL: time.Second, MaxValueSize: MaxRegistryValueSize}); err != nil {
		t.Fatal(err)
	}
	reg, err := OpenRegistry(ctx, js, RegistryConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := reg.Hardened(ctx); err != nil || ok {
		t.Fatalf("an earlier release's bucket reads as hardened: %v %v", ok, err)
	}
	if err := rollupAll(ctx, js, DefaultNodesBucket, "probe"); err != nil {
		t.Fatalf("the earlier bucket refused a roll-up (the test's premise): %v", err)
	}
	if err := reg.SaveCheckpoint(ctx, "n1", Checkpoint{Next: 9}); err != nil {
		t.Fatal(err)
	}
	changed, err := reg.Harden(ctx)
	if err != nil || !changed {
		t.Fatalf("Harden: %v %v", changed, err)
	}
	if changed, err := reg.Harden(ctx); err != nil || changed {
		t.Fatalf("a second Harden: %v %v", changed, err)
	}
	if err := rollupAll(ctx, js, DefaultNodesBucket, CheckpointKey("n2")); err == nil {
		t.Error("the hardened bucket stored a roll-up")
	}
	if c, ok, err := reg.LoadCheckpoint(ctx, "n1"); err != nil || !ok || c.Next != 9 {
		t.Errorf("checkpoint after hardening: %+v %v %v", c, ok, err)
	}
	if _, err := reg.AcquireLease(ctx, "h", "h/n0", time.Second); err != nil {
		t.Fatalf("a lease with a TTL on the hardened bucket: %v", err)
	}
}

// TestLiveNodeExpiresWithoutMarker: a node that stops announcing leaves the
// live set once its record's TTL has passed and the bucket no longer holds
// it, without any marker; a node that goes on announcing stays, and one
// that announces again after expiring is back.
func TestLiveNodeExpiresWithoutMarker(t *testing.T) {
	s := natstest.RunServer(t)
	js := s.JetStream()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var changes atomic.Int32
	reg, err := OpenRegistry(ctx, js, RegistryConfig{}, func() { changes.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- reg.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()
	<-reg.Ready()
	for _, n := range []string{"n1", "n2"} {
		if err := reg.Announce(ctx, NodeInfo{Node: n}, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 5*time.Second, func() error {
		if len(reg.Live()) != 2 {
			return errors.New("both nodes not live yet")
		}
		return nil
	})
	// n1 goes on announcing; n2 stops.
	keep := time.NewTicker(300 * time.Millisecond)
	defer keep.Stop()
	deadline := time.After(15 * time.Second)
	for {
		if _, ok := reg.Live()["n2"]; !ok {
			break
		}
		select {
		case <-keep.C:
			if err := reg.Announce(ctx, NodeInfo{Node: "n1"}, time.Second); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("n2 still live 15 s after its last announcement")
		}
	}
	if _, ok := reg.Live()["n1"]; !ok {
		t.Fatal("n1 expired while announcing")
	}
	if _, _, found, err := reg.LiveRecord(ctx, "n2"); err != nil || found {
		t.Fatalf("n2 left the live set while the bucket still held its record: %v %v", found, err)
	}
	if err := reg.Announce(ctx, NodeInfo{Node: "n2"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() error {
		if _, ok := reg.Live()["n2"]; !ok {
			return errors.New("n2 not back")
		}
		return nil
	})
	// The callback runs after the live set changed: wait for it.
	natstest.Eventually(t, 5*time.Second, func() error {
		if n := changes.Load(); n < 4 {
			return fmt.Errorf("%d change callbacks, want at least 4 (two joins, an expiry, a return)", n)
		}
		return nil
	})
}

// TestLaggingWatchDoesNotExpire: a record past its TTL by this process's
// clock but still held by the bucket (the watch lagged, or the process was
// paused) keeps its node live: the bucket decides.
func TestLaggingWatchDoesNotExpire(t *testing.T) {
	ctx, _, reg := openTestRegistry(t)
	if err := reg.Announce(ctx, NodeInfo{Node: "n1"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	info, _, found, err := reg.LiveRecord(ctx, "n1")
	if err != nil || !found {
		t.Fatal(found, err)
	}
	reg.Feed().Put(LiveKey("n1"), mustEncodeLive(t, info), 1)
	// As if the record had arrived a minute ago.
	reg.mu.Lock()
	reg.expires["n1"] = time.Now().Add(-time.Minute)
	reg.mu.Unlock()
	reg.ExpireDue(ctx, reg.liveStored)
	if _, ok := reg.Live()["n1"]; !ok {
		t.Fatal("a node whose record the bucket holds was expired by the local clock")
	}
	// Once the record is gone from the bucket, the same check expires it.
	kv, _ := reg.js.KeyValue(ctx, DefaultNodesBucket)
	if err := kv.Delete(ctx, LiveKey("n1")); err != nil {
		t.Fatal(err)
	}
	reg.mu.Lock()
	reg.expires["n1"] = time.Now().Add(-time.Second)
	reg.mu.Unlock()
	reg.ExpireDue(ctx, reg.liveStored)
	if _, ok := reg.Live()["n1"]; ok {
		t.Fatal("a node whose record is gone stayed live")
	}
}

func mustEncodeLive(t *testing.T, info NodeInfo) []byte {
	t.Helper()
	b, err := encodeRecord(recordLive, &info)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
