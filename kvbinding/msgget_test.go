package kvbinding

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
)

// TestMsgGetIsNeverDirect: the rewind check reads a bucket's message by
// sequence with STREAM.MSG.GET, never with a direct get (whose answer is
// the stored record itself, which a reply subject could aim at another
// key), even on a bucket that allows direct gets; a missing sequence is
// jetstream.ErrMsgNotFound.
func TestMsgGetIsNeverDirect(t *testing.T) {
	s := natstest.RunServer(t)
	nc := s.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, "r.g", []byte("value"))
	if err != nil {
		t.Fatal(err)
	}
	watch := s.Connect()
	direct, err := watch.SubscribeSync("$JS.API.DIRECT.GET.>")
	if err != nil {
		t.Fatal(err)
	}
	get, err := watch.SubscribeSync("$JS.API.STREAM.MSG.GET.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := msgGet(ctx, js, "KV_b", rev)
	if err != nil {
		t.Fatal(err)
	}
	if m.subj != "$KV.b.r.g" || string(m.data) != "value" {
		t.Errorf("got %q %q", m.subj, m.data)
	}
	if _, err := msgGet(ctx, js, "KV_b", rev+5); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("a missing sequence: %v", err)
	}
	if _, err := get.NextMsg(2 * time.Second); err != nil {
		t.Errorf("no STREAM.MSG.GET request seen: %v", err)
	}
	if m, err := direct.NextMsg(200 * time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Errorf("a direct get was sent: %v %v", m, err)
	}
}
