package router

import (
	"context"
	"os"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// BenchmarkNodeSkip measures a node reading an ingress in which every
// message belongs to another node (1,000 groups bound to n0): what a node
// spends on the messages it skips. The server runs in the same process;
// compare runs of this benchmark, not its figure with the bench command's.
func BenchmarkNodeSkip(b *testing.B) { benchNodeRead(b, "n0") }

// BenchmarkNodeRoute measures a node routing a filled ingress whose 1,000
// groups are all bound to it, onto its queue (nobody consumes it).
func BenchmarkNodeRoute(b *testing.B) { benchNodeRead(b, "n1") }

// benchNodeRead fills the ingress with b.N messages of 1,000 groups bound
// to owner, then times node n1 reading all of them (routing those it owns).
// GROUPROUTER_READ_PROFILE=file writes a CPU profile of the read alone.
func benchNodeRead(b *testing.B, owner string) {
	s := natstest.RunServer(b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	quiet := func(c Config) Config {
		c.Logger = nil
		return c
	}
	// A LOCAL node creates the layout, then leaves.
	{
		r, err := New(s.Connect(), quiet(Config{Name: "h", Type: Local, Address: "jms", Timeout: time.Second, Node: "n0"}))
		if err != nil {
			b.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		<-r.Ready()
		stop()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	nc := s.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	store, err := kvbinding.OpenStore(ctx, js, kvbinding.StoreConfig{})
	if err != nil {
		b.Fatal(err)
	}
	const groups = 1000
	bs := make([]kvbinding.Binding, groups)
	for i := range bs {
		bs[i] = kvbinding.Binding{Group: "g" + strconv.Itoa(i), State: kvbinding.StateBound, Node: owner, FromSeq: 1,
			DecidedAt: time.Now(), DecidedBy: "h/n0", ProposedBy: owner}
	}
	for _, res := range store.CreateMany(ctx, bs) {
		if res.Err != nil {
			b.Fatal(res.Err)
		}
	}
	body := make([]byte, 1024)
	for i := 0; i < b.N; i++ {
		m := &nats.Msg{Subject: "jms.bench", Header: nats.Header{DefaultGroupHeader: []string{"g" + strconv.Itoa(i%groups)}}, Data: body}
		for {
			if _, err := js.PublishMsgAsync(m); err == nil {
				break
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishes not acknowledged")
	}
	st, err := js.Stream(ctx, IngressStream)
	if err != nil {
		b.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	last := info.State.LastSeq

	r, err := New(s.Connect(), quiet(Config{Name: "h", Type: Remote, Address: "jms", Timeout: time.Second, Node: "n1"}))
	if err != nil {
		b.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	if f := os.Getenv("GROUPROUTER_READ_PROFILE"); f != "" {
		// The read alone (-cpuprofile would include the fill).
		out, err := os.Create(f)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(out); err != nil {
			b.Fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); out.Close() }()
	}
	b.ResetTimer()
	go func() { done <- r.Run(rctx) }()
	for {
		st := r.Stats()
		if st.Position > last && st.Held == 0 {
			break
		}
		select {
		case err := <-done:
			b.Fatalf("node stopped: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	if st := r.Stats(); owner == "n1" && st.Routed != uint64(b.N) {
		b.Fatalf("routed %d of %d", st.Routed, b.N)
	}
	stop()
	<-done
}
