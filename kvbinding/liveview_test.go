package kvbinding

import (
	"context"
	"errors"
	"reflect"
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

// TestFastLiveTakesAnnouncements: what a node announces decodes without
// reflection, to what encoding/json decodes.
func TestFastLiveTakesAnnouncements(t *testing.T) {
	at := time.Date(2026, 12, 8, 1, 2, 3, 456789, time.UTC)
	for _, info := range []NodeInfo{
		{Node: "n1"},
		{Node: "n1", Instance: "9b7c", Host: "h", PID: 42, Type: "LOCAL", Handler: "h1", HasConsumer: true, Started: at,
			Heartbeat: at.Add(time.Second), Every: time.Second, Position: 7, Held: 3, Routed: 1 << 40, DecisionErrors: 2,
			DeadLettered: 1, WaitingGroups: 5, QueuePending: 9, QueueUnacked: 4, Busy: []string{"a", "b"}, BusyMore: true,
			Retrying: []string{"c"}, HeldBackGroups: 1},
	} {
		v, err := LiveValue(info, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := fastLive(v)
		if !ok {
			t.Fatalf("fastLive refused %s", v)
		}
		var want NodeInfo
		if err := decodeRecord(v, recordLive, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("fastLive %+v, encoding/json %+v", got, want)
		}
	}
}

// FuzzDecodeLive: the one-pass decode of a liveness record gives the same
// verdict and the same record as decodeRecord, whatever the bytes.
func FuzzDecodeLive(f *testing.F) {
	started := time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC)
	typed, _ := LiveValue(NodeInfo{Node: "n1", Instance: "i", HasConsumer: true, Started: started, Every: time.Second,
		Busy: []string{"g"}, HeldBack: []HeldGroup{{Group: "h", Count: 3}}}, 3*time.Second)
	f.Add(typed)
	plain, _ := LiveValue(NodeInfo{Node: "n2", Started: started, Heartbeat: started, Every: time.Second, Position: 3,
		Busy: []string{"a"}, Retrying: []string{}}, time.Second)
	f.Add(plain)
	f.Add([]byte(`{"record":"live","v":1,"node":"n1","started":"2026-12-08T24:00:00Z"}`))
	f.Add([]byte(`{"record":"live","v":1,"node":"n1","every":9223372036854775808}`))
	f.Add([]byte(`{"record":"binding","v":1,"record":"live","node":"n1"}`))
	f.Add([]byte(`{"node":"n1","type":"LOCAL","handler":"h","has_consumer":true}`)) // untyped
	f.Add([]byte(`{"node":"n1","type":"LOCAL","extra":1}`))                         // untyped, an unknown field
	f.Add([]byte(`{"record":"live","v":2,"node":"n1","later":true}`))
	f.Add([]byte(`{"record":"live","v":3,"node":"n1"}`))
	f.Add([]byte(`{"record":"binding","v":1,"node":"n1"}`))
	f.Add([]byte(`{"record":"live","v":1,"node":"n1","record":"lease"}`))
	f.Add([]byte(`{"record":"live","v":1,"node":5}`))
	f.Add([]byte(`{"Record":"live","V":1,"Node":"n1"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var want NodeInfo
		werr := decodeRecord(data, recordLive, &want)
		got, gerr := decodeLive(data)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%q: decodeRecord %v, decodeLive %v", data, werr, gerr)
		}
		if werr == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: decodeLive %+v, decodeRecord %+v", data, got, want)
		}
	})
}
