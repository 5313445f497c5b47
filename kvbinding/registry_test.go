package kvbinding

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
)

// openTestRegistry opens the node registry on a server of its own, with a
// context that ends with the test (10 s at most).
func openTestRegistry(t *testing.T) (context.Context, jetstream.JetStream, *Registry) {
	t.Helper()
	js := natstest.RunServer(t).JetStream()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	reg, err := OpenRegistry(ctx, js, RegistryConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, js, reg
}

// TestRegistryKeys: LiveKey, CheckpointKey and LeaseKey name the keys the
// registry writes (NATS permissions are generated from them).
func TestRegistryKeys(t *testing.T) {
	ctx, js, reg := openTestRegistry(t)
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

// TestFloorRecord: the routing floor is created, raised with a
// compare-and-set (a writer on a stale revision gets ErrConflict), and a
// value that does not decode is reported with its revision, so that it can
// be written over; FloorKey names the key (permissions come from it).
func TestFloorRecord(t *testing.T) {
	ctx, js, reg := openTestRegistry(t)
	if f, rev, err := reg.LoadFloor(ctx); err != nil || rev != 0 || f.Seq != 0 {
		t.Fatalf("no floor yet: %+v rev %d, %v", f, rev, err)
	}
	rev1, err := reg.StoreFloor(ctx, Floor{Seq: 10, By: "h/n1"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.StoreFloor(ctx, Floor{Seq: 5}, 0); !errors.Is(err, ErrConflict) {
		t.Errorf("a second create: %v, want ErrConflict", err)
	}
	rev2, err := reg.StoreFloor(ctx, Floor{Seq: 20}, rev1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.StoreFloor(ctx, Floor{Seq: 15}, rev1); !errors.Is(err, ErrConflict) {
		t.Errorf("a write on a stale revision: %v, want ErrConflict", err)
	}
	if f, rev, err := reg.LoadFloor(ctx); err != nil || rev != rev2 || f.Seq != 20 {
		t.Errorf("floor %+v rev %d (%v), want 20 at rev %d", f, rev, err, rev2)
	}
	kv, err := js.KeyValue(ctx, DefaultNodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := kv.Put(ctx, FloorKey, []byte("{not json"))
	if err != nil {
		t.Fatal(err)
	}
	f, rev, err := reg.LoadFloor(ctx)
	if !errors.Is(err, ErrInvalidFloor) || rev != bad || f.Seq != 0 {
		t.Fatalf("invalid floor: %+v rev %d, %v; want ErrInvalidFloor at rev %d", f, rev, err, bad)
	}
	if _, err := reg.StoreFloor(ctx, Floor{Seq: 30}, rev); err != nil {
		t.Errorf("writing over the invalid value: %v", err)
	}
}

// TestLiveRecord: a node's liveness record as announced; none; and a
// value that is not a node's own, reported as invalid with its revision.
func TestLiveRecord(t *testing.T) {
	ctx, js, reg := openTestRegistry(t)
	if _, _, found, err := reg.LiveRecord(ctx, "n1"); found || err != nil {
		t.Fatalf("no record: found %v, %v", found, err)
	}
	if err := reg.Announce(ctx, NodeInfo{Node: "n1", Instance: "i1", Host: "h", PID: 7}, time.Minute); err != nil {
		t.Fatal(err)
	}
	info, rev, found, err := reg.LiveRecord(ctx, "n1")
	if err != nil || !found || rev == 0 || info.Instance != "i1" || info.PID != 7 {
		t.Fatalf("record %+v rev %d found %v: %v", info, rev, found, err)
	}
	kv, err := js.KeyValue(ctx, DefaultNodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{`\x00garbage`, `{"node":"n2","instance":"x"}`} {
		if _, err := kv.Put(ctx, LiveKey("n1"), []byte(v)); err != nil {
			t.Fatal(err)
		}
		if _, rev, found, err := reg.LiveRecord(ctx, "n1"); !errors.Is(err, ErrInvalidNodeInfo) || !found || rev == 0 {
			t.Errorf("value %q: found %v rev %d, %v; want ErrInvalidNodeInfo", v, found, rev, err)
		}
	}
}

// TestCheckpointCopiedUnderAnotherKey: a node's checkpoint stored, as it
// is, under another node's key (a direct get answers with the stored
// record to any reply subject its requester names) is refused there and
// still read under its own; a checkpoint of an earlier release, which
// names no node, is read.
func TestCheckpointCopiedUnderAnotherKey(t *testing.T) {
	ctx, js, reg := openTestRegistry(t)
	if err := reg.SaveCheckpoint(ctx, "n2", Checkpoint{Next: 9}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, DefaultNodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, CheckpointKey("n2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, CheckpointKey("n1"), e.Value()); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := reg.LoadCheckpoint(ctx, "n1"); ok || !errors.Is(err, ErrInvalidCheckpoint) {
		t.Errorf("n2's checkpoint under n1's key: ok %v, err %v", ok, err)
	}
	if c, ok, err := reg.LoadCheckpoint(ctx, "n2"); !ok || err != nil || c.Next != 9 || c.Node != "n2" {
		t.Errorf("n2's own: %+v %v %v", c, ok, err)
	}
	if _, err := kv.Put(ctx, CheckpointKey("n3"), []byte(`{"record":"checkpoint","v":1,"next":4}`)); err != nil {
		t.Fatal(err)
	}
	if c, ok, err := reg.LoadCheckpoint(ctx, "n3"); !ok || err != nil || c.Next != 4 {
		t.Errorf("a checkpoint naming no node: %+v %v %v", c, ok, err)
	}
}

// A checkpoint is read back at the revision an evacuation took its start
// from while the node has saved no other since; a later save (the bucket
// keeps one per key) pins nothing, nor does another node's revision.
func TestLoadCheckpointAt(t *testing.T) {
	ctx, _, reg := openTestRegistry(t)
	want := Checkpoint{Next: 20, Pending: [][2]uint64{{5, 8}, {12, 12}}}
	if err := reg.SaveCheckpoint(ctx, "n1", want); err != nil {
		t.Fatal(err)
	}
	if err := reg.SaveCheckpoint(ctx, "n2", Checkpoint{Next: 3}); err != nil {
		t.Fatal(err)
	}
	c, rev, ok, err := reg.LoadCheckpointRev(ctx, "n1")
	if err != nil || !ok || rev == 0 {
		t.Fatalf("LoadCheckpointRev: %+v %d %v %v", c, rev, ok, err)
	}
	got, ok, err := reg.LoadCheckpointAt(ctx, "n1", rev)
	if err != nil || !ok || got.Next != 20 || len(got.Pending) != 2 {
		t.Fatalf("LoadCheckpointAt(n1, %d): %+v %v %v", rev, got, ok, err)
	}
	for _, seq := range []uint64{4, 9, 11, 13, 19} {
		if !got.Done(seq) {
			t.Errorf("seq %d not done", seq)
		}
	}
	for _, seq := range []uint64{5, 8, 12, 20, 21} {
		if got.Done(seq) {
			t.Errorf("seq %d done", seq)
		}
	}
	if _, ok, err := reg.LoadCheckpointAt(ctx, "n2", rev); ok || err != nil {
		t.Errorf("n2's checkpoint at n1's revision: %v %v", ok, err)
	}
	if err := reg.SaveCheckpoint(ctx, "n1", Checkpoint{Next: 30}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := reg.LoadCheckpointAt(ctx, "n1", rev); ok || err != nil {
		t.Errorf("n1's checkpoint at a revision saved over: %v %v", ok, err)
	}
}

// What a node says of the groups taken from it (Checkpoint.Lost) is read
// back; an entry without its group, sequences or epoch is refused.
func TestCheckpointLost(t *testing.T) {
	ctx, js, reg := openTestRegistry(t)
	want := Checkpoint{Next: 30, Lost: map[string]LostPos{"g": {12, 40, 7}}, Seen: 9}
	if err := reg.SaveCheckpoint(ctx, "n1", want); err != nil {
		t.Fatal(err)
	}
	got, ok, err := reg.LoadCheckpoint(ctx, "n1")
	if err != nil || !ok || got.Seen != 9 || got.Lost["g"].Seq() != 12 || got.Lost["g"].At() != 40 || got.Lost["g"].Epoch() != 7 {
		t.Fatalf("read back %+v %v %v", got, ok, err)
	}
	kv, err := js.KeyValue(ctx, DefaultNodesBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, lost := range []string{`{"":[1,2,3]}`, `{"g":[0,2,3]}`, `{"g":[1,0,3]}`, `{"g":[1,2,0]}`, `{"g":[1,2]}`, `{"g":"x"}`} {
		v := `{"record":"checkpoint","v":1,"node":"n1","next":4,"lost":` + lost + `}`
		if _, err := kv.Put(ctx, CheckpointKey("n1"), []byte(v)); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := reg.LoadCheckpoint(ctx, "n1"); ok || !errors.Is(err, ErrInvalidCheckpoint) {
			t.Errorf("lost %s: ok %v, err %v; want ErrInvalidCheckpoint", lost, ok, err)
		}
	}
}
