package router

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"grouprouter/internal/natstest"
)

// TestIsGoneOnTheLibrarysErrors checks isGone against the errors the
// JetStream client really returns: a drain tells "the old consumer acked it
// meanwhile" from a failure by them, and Stream.DeleteMsg does not wrap the
// server's API error.
func TestIsGoneOnTheLibrarysErrors(t *testing.T) {
	s := natstest.RunServer(t)
	js, err := jetstream.New(s.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, "t.a", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, ack.Sequence); err != nil {
		t.Fatal(err)
	}
	err = st.DeleteMsg(ctx, ack.Sequence)
	if err == nil || !isGone(err) {
		t.Errorf("second delete: isGone(%v) = false", err)
	}
	if _, err = st.GetMsg(ctx, ack.Sequence); err == nil || !isGone(err) {
		t.Errorf("get of a deleted message: isGone(%v) = false", err)
	}
	if err := js.DeleteStream(ctx, "T"); err != nil {
		t.Fatal(err)
	}
	if err = st.DeleteMsg(ctx, ack.Sequence); err == nil || isGone(err) {
		t.Errorf("delete in a deleted stream: isGone(%v) = true, want a real failure", err)
	}
}
