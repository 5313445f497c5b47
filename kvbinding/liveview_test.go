package kvbinding

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestLiveViewExpiresByTheBucket: a node whose record is past its TTL by
// the view's clock leaves the live set only once the bucket says it no
// longer holds the record; a lookup that fails or finds the record keeps
// it, and a node announcing itself again is counted as returned.
func TestLiveViewExpiresByTheBucket(t *testing.T) {
	now := time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)
	changes := 0
	v := NewLiveView(LiveViewConfig{Now: func() time.Time { return now }, OnChange: func() { changes++ }})
	f := v.Feed()
	announce := func(rev uint64, has bool) {
		t.Helper()
		b, err := encodeRecord(recordLive, &NodeInfo{Node: "n1", HasConsumer: has, TTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		f.Put(LiveKey("n1"), b, rev)
	}
	announce(1, true)
	f.Ready()
	<-v.Ready()
	if _, ok := v.Live()["n1"]; !ok || changes != 1 || v.SeenRevision("n1") != 1 {
		t.Fatalf("after the announcement: live %v, %d changes, revision %d", v.Live(), changes, v.SeenRevision("n1"))
	}
	announce(2, true) // a heartbeat: nothing changed
	if changes != 1 {
		t.Fatalf("%d changes after a heartbeat, want 1", changes)
	}

	var looked []string
	answer := func(has bool, err error) func(context.Context, string) (bool, error) {
		return func(_ context.Context, node string) (bool, error) {
			looked = append(looked, node)
			return has, err
		}
	}
	ctx := context.Background()
	now = now.Add(3 * time.Second) // the TTL, not the slack
	v.ExpireDue(ctx, answer(false, nil))
	if len(looked) != 0 {
		t.Fatalf("looked up %v before the TTL and its slack passed", looked)
	}
	now = now.Add(time.Second)
	v.ExpireDue(ctx, answer(false, errors.New("timeout")))
	v.ExpireDue(ctx, answer(true, nil)) // not yet due again: the slack
	now = now.Add(time.Second)
	v.ExpireDue(ctx, answer(true, nil))
	if _, ok := v.Live()["n1"]; !ok || len(looked) != 2 {
		t.Fatalf("live %v after %d lookups (a failure, a record still stored); want n1 kept", v.Live(), len(looked))
	}
	now = now.Add(time.Second)
	v.ExpireDue(ctx, answer(false, nil))
	if _, ok := v.Live()["n1"]; ok || changes != 2 {
		t.Fatalf("live %v, %d changes after the bucket lost the record; want n1 gone", v.Live(), changes)
	}
	if v.LastSeen("n1").IsZero() || !v.Seen("n1").IsZero() {
		t.Fatalf("seen %v, last seen %v", v.Seen("n1"), v.LastSeen("n1"))
	}
	now = now.Add(time.Second)
	announce(3, false)
	if !v.Returned("n1").Equal(now) || changes != 3 {
		t.Fatalf("returned %v, %d changes; want %v, 3", v.Returned("n1"), changes, now)
	}
	f.Delete(LiveKey("n1"), 4)
	if _, ok := v.Live()["n1"]; ok || changes != 4 {
		t.Fatalf("live %v, %d changes after a withdrawal", v.Live(), changes)
	}
}
