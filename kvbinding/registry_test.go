package kvbinding

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"grouprouter/internal/natstest"
)

// TestRegistryKeys: LiveKey, CheckpointKey and LeaseKey name the keys the
// registry writes (NATS permissions are generated from them).
func TestRegistryKeys(t *testing.T) {
	s := natstest.RunServer(t)
	js, err := jetstream.New(s.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg, err := OpenRegistry(ctx, js, RegistryConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Announce(ctx, NodeInfo{Node: "n1"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := reg.SaveCheckpoint(ctx, "n1", Checkpoint{Next: 7}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.AcquireLease(ctx, "h", "h/n1", time.Minute); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, DefaultNodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{LiveKey("n1"), CheckpointKey("n1"), LeaseKey("h")} {
		if _, err := kv.Get(ctx, key); err != nil {
			t.Errorf("key %q: %v", key, err)
		}
	}
}
