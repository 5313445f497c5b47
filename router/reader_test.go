package router

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
)

// TestIngressReaderRecreatesItsConsumer: the reader delivers every message
// once, in order, across the deletion of its consumer (the server says so
// with a 409, or the heartbeats stop) and from a start sequence.
func TestIngressReaderRecreatesItsConsumer(t *testing.T) {
	s := natstest.RunServer(t)
	nc := s.Connect()
	const n = 6000
	// Room for every publish in flight: the default bound (4,000) stalls
	// them on a loaded machine, and PublishAsync then fails.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2*n))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, err := js.PublishAsync("in.x", []byte(strconv.Itoa(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()

	for _, start := range []uint64{1, 1234} {
		rd := newIngressReader(js, "IN", "", slog.New(slog.DiscardHandler))
		created := make(chan struct{}, 16)
		rd.onCreated = func() { created <- struct{}{} }
		resets := make(chan int, 16)
		rd.onReset = func(cause int) { resets <- cause }
		rctx, stop := context.WithCancel(ctx)
		next := start
		var got int
		done := make(chan error, 1)
		deleted := false
		go func() {
			done <- rd.run(rctx, start, func(batch []ingressMsg) {
				for _, m := range batch {
					if m.seq != next || string(m.msg.Data) != strconv.FormatUint(m.seq, 10) {
						t.Errorf("start %d: got sequence %d (%q), want %d", start, m.seq, m.msg.Data, next)
					}
					next = m.seq + 1
					got++
				}
				if !deleted && got > n/4 {
					// Delete the consumer under the reader's feet.
					deleted = true
					st, err := js.Stream(ctx, "IN")
					if err != nil {
						t.Error(err)
						return
					}
					for info := range st.ListConsumers(ctx).Info() {
						_ = js.DeleteConsumer(ctx, "IN", info.Name)
					}
				}
				if next > n {
					stop()
				}
			})
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatalf("start %d: read %d messages, next %d", start, got, next)
		}
		if want := n - int(start) + 1; got != want {
			t.Errorf("start %d: %d messages, want %d", start, got, want)
		}
		if len(created) < 2 {
			t.Errorf("start %d: consumer created %d times, want a re-creation", start, len(created))
		}
		if len(resets) != len(created)-1 {
			t.Errorf("start %d: %d re-creations counted, %d made", start, len(resets), len(created)-1)
		}
		for len(resets) > 0 {
			if c := <-resets; c != resetStatus && c != resetHeartbeat {
				t.Errorf("start %d: a deleted consumer counted as %q", start, resetCauses[c])
			}
		}
	}
}

// TestIngressReaderReportsGaps: messages removed from the stream before
// the reader reaches them are reported as gaps, from the start it was
// given; without one (gapsFrom 0), what lies before its first delivery is
// not.
func TestIngressReaderReportsGaps(t *testing.T) {
	s := natstest.RunServer(t)
	js, err := jetstream.New(s.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IN", Subjects: []string{"in.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 20; i++ {
		if _, err := js.Publish(ctx, "in.x", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	for _, seq := range []uint64{1, 2, 5, 6, 12, 20} {
		if err := st.DeleteMsg(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name            string
		start, gapsFrom uint64
		want            [][2]uint64
	}{
		{"from a checkpoint at 1", 1, 1, [][2]uint64{{1, 2}, {5, 6}, {12, 12}}},
		{"from a checkpoint at 4", 4, 4, [][2]uint64{{5, 6}, {12, 12}}},
		{"checkpoint next past pending ranges", 4, 10, [][2]uint64{{12, 12}}},
		{"no checkpoint", 1, 0, [][2]uint64{{5, 6}, {12, 12}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rd := newIngressReader(js, "IN", "", slog.New(slog.DiscardHandler))
			var gaps [][2]uint64
			rd.onGap, rd.gapsFrom = func(from, to uint64) { gaps = append(gaps, [2]uint64{from, to}) }, tt.gapsFrom
			rctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- rd.run(rctx, tt.start, func(batch []ingressMsg) {
					if batch[len(batch)-1].seq >= 19 {
						stop()
					}
				})
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-ctx.Done():
				t.Fatal("the reader did not reach sequence 19")
			}
			if fmt.Sprint(gaps) != fmt.Sprint(tt.want) {
				t.Errorf("gaps %v, want %v", gaps, tt.want)
			}
		})
	}
	// A position past the stream's end: the stream went back (its servers
	// lost messages and their sequences); the sequences up to the position
	// are reported when the consumer is created.
	t.Run("stream behind the position", func(t *testing.T) {
		rd := newIngressReader(js, "IN", "", slog.New(slog.DiscardHandler))
		gaps := make(chan [2]uint64, 4)
		rd.onGap, rd.gapsFrom = func(from, to uint64) { gaps <- [2]uint64{from, to} }, 30
		created := make(chan struct{}, 16)
		rd.onCreated = func() { created <- struct{}{} }
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		done := make(chan error, 1)
		go func() { done <- rd.run(rctx, 30, func([]ingressMsg) {}) }()
		select {
		case g := <-gaps:
			if g != [2]uint64{21, 29} {
				t.Errorf("gap %v, want [21 29]", g)
			}
		case err := <-done:
			t.Fatalf("reader ended: %v", err)
		case <-ctx.Done():
			t.Fatal("no gap reported")
		}
		// Once per position: a re-created consumer does not report it again.
		<-created
		for info := range st.ListConsumers(ctx).Info() {
			_ = js.DeleteConsumer(ctx, "IN", info.Name)
		}
		select {
		case <-created:
		case <-ctx.Done():
			t.Fatal("the consumer was not re-created")
		}
		select {
		case g := <-gaps:
			t.Errorf("gap %v reported again after a re-creation", g)
		default:
		}
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}
