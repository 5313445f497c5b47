package main

import (
	"context"
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// BenchmarkGroups lists GROUPROUTER_BENCH_BINDINGS bindings (default
// 100,000) with 'groups --json' and 'groups --node n1' (a third of them),
// the server in the same process:
//
//	GROUPROUTER_BENCH_BINDINGS=1000000 go test -run '^$' -bench Groups -benchtime 3x ./cmd/grouprouter
func BenchmarkGroups(b *testing.B) {
	n := 100_000
	if s := os.Getenv("GROUPROUTER_BENCH_BINDINGS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatalf("GROUPROUTER_BENCH_BINDINGS: %v", err)
		}
	}
	srv := natstest.RunServer(b)
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	store, err := kvbinding.OpenStore(ctx, js, kvbinding.StoreConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	nodes := []string{"n0", "n1", "n2"}
	at := time.Now().UTC()
	const batch = 10_000
	for i := 0; i < n; i += batch {
		bs := make([]kvbinding.Binding, 0, batch)
		for j := i; j < min(n, i+batch); j++ {
			bs = append(bs, kvbinding.Binding{Group: "order-" + strconv.Itoa(1_000_000+j), State: kvbinding.StateBound,
				Node: nodes[j%3], FromSeq: uint64(j + 1), DecidedAt: at, DecidedBy: "grouping-handler/n0", ProposedBy: nodes[(j+1)%3]})
		}
		for _, r := range store.CreateMany(ctx, bs) {
			if r.Err != nil {
				b.Fatal(r.Err)
			}
		}
	}
	for _, bm := range []struct {
		name string
		args []string
	}{
		{"json", []string{"groups", "--json", "--nats", srv.URL()}},
		{"node", []string{"groups", "--node", "n1", "--nats", srv.URL()}},
	} {
		b.Run(bm.name, func(b *testing.B) {
			for b.Loop() {
				if code := runContext(ctx, bm.args, io.Discard, os.Stderr); code != exitOK {
					b.Fatalf("exit %d", code)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "bindings/s")
		})
	}
}
