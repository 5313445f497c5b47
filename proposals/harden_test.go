package proposals

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// TestHandlerHardensEarlierRegistry: on a registry bucket of an earlier
// release (expiry markers, roll-ups allowed), the active handler leaves
// the bucket as it is while a node of that release (a liveness record
// without a TTL) is live, and hardens it once every live node announces a
// TTL.
func TestHandlerHardensEarlierRegistry(t *testing.T) {
	s := natstest.RunServer(t)
	js := s.JetStream()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: kvbinding.DefaultNodesBucket, History: 1,
		LimitMarkerTTL: time.Second, MaxValueSize: kvbinding.MaxRegistryValueSize})
	if err != nil {
		t.Fatal(err)
	}
	// An untyped record, as releases before typed records wrote: no TTL.
	if _, err := kv.Put(ctx, kvbinding.LiveKey("n9"), []byte(`{"node":"n9","type":"REMOTE","handler":"h"}`)); err != nil {
		t.Fatal(err)
	}
	env := startHandler(t, s, "n1", liveNodes)
	reg, err := kvbinding.OpenRegistry(ctx, js, kvbinding.RegistryConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		if !env.h.Active() {
			return errors.New("handler not active")
		}
		return nil
	})
	time.Sleep(time.Second) // four lease ticks of the active handler
	if ok, err := reg.Hardened(ctx); err != nil || ok {
		t.Fatalf("hardened while a node of an earlier release is live: %v %v", ok, err)
	}
	if err := kv.Delete(ctx, kvbinding.LiveKey("n9")); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		if ok, err := reg.Hardened(ctx); err != nil || !ok {
			return errors.New("not hardened yet")
		}
		return nil
	})
}
