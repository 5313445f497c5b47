package kvbinding

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
)

func TestScanBindings(t *testing.T) {
	srv := natstest.RunServer(t)
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	err = ScanBindings(ctx, js, "", func(Binding) error { return nil })
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("scan of a missing bucket: %v, want ErrStreamNotFound", err)
	}
	if _, err := js.KeyValue(ctx, DefaultBucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("the scan created the bucket: %v", err)
	}

	s, err := OpenStore(ctx, js, StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var none []string
	if err := ScanBindings(ctx, js, "", func(b Binding) error { none = append(none, b.Group); return nil }); err != nil || none != nil {
		t.Fatalf("empty bucket: %v, %v", none, err)
	}

	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a, err := s.Create(ctx, Binding{Group: "a", State: StateBound, Node: "n1", FromSeq: 1, DecidedAt: at, DecidedBy: "h/n0", ProposedBy: "n2"})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := s.Create(ctx, Binding{Group: "gone", State: StateBound, Node: "n1", FromSeq: 2, DecidedAt: at, DecidedBy: "h/n0"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, Binding{Group: "Zürich \"7\"", State: StateBound, Node: "n2", FromSeq: 3, DecidedAt: at, DecidedBy: "h/n0"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "gone", gone.Revision); err != nil {
		t.Fatal(err)
	}
	moved := a
	moved.State, moved.Node, moved.PrevNode, moved.Reason = StateMoving, "n2", "n1", "operator move"
	if _, err := s.Replace(ctx, moved, a.Revision); err != nil {
		t.Fatal(err)
	}
	// Records that are not bindings of their key are skipped.
	if _, err := s.KV().Put(ctx, "r.foreign", []byte(`{"group":"other","state":"bound","node":"n1","from_seq":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.KV().Put(ctx, "r.junk", []byte(`not json`)); err != nil {
		t.Fatal(err)
	}

	var got []Binding
	if err := ScanBindings(ctx, js, DefaultBucket, func(b Binding) error { got = append(got, b); return nil }); err != nil {
		t.Fatal(err)
	}
	var groups []string
	for _, b := range got {
		groups = append(groups, b.Group)
	}
	// Order of last change: "a" changed last.
	if !slices.Equal(groups, []string{"Zürich \"7\"", "a"}) {
		t.Fatalf("groups %q", groups)
	}
	want, err := s.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if b := got[1]; b.State != StateMoving || b.PrevNode != "n1" || b.Reason != "operator move" || b.ProposedBy != "n2" ||
		!b.DecidedAt.Equal(at) || b.Revision != want.Revision {
		t.Errorf("a = %+v, want %+v", b, want)
	}

	stopErr := errors.New("enough")
	calls := 0
	if err := ScanBindings(ctx, js, "", func(Binding) error { calls++; return stopErr }); !errors.Is(err, stopErr) || calls != 1 {
		t.Errorf("fn error: %v after %d calls, want %v after 1", err, calls, stopErr)
	}
}
