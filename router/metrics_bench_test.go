package router

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// scrapeRouter returns a ready router whose cache holds n bindings spread
// over three live nodes, set up directly (loading n bindings through a
// bucket would take most of the benchmark): what a scrape reads is there,
// nothing runs.
func scrapeRouter(b testing.TB, n int) *Router {
	b.Helper()
	s := natstest.RunServer(b)
	nc := s.Connect()
	cfg := Config{Name: "h", Type: Local, Address: "jms", Timeout: time.Second, Node: "n0"}
	r, err := New(nc, cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	if err := ensureStreams(ctx, r.js, r.cfg, 1); err != nil {
		b.Fatal(err)
	}
	if r.reg, err = kvbinding.OpenRegistry(ctx, r.js, kvbinding.RegistryConfig{}, nil); err != nil {
		b.Fatal(err)
	}
	go func() { _ = r.reg.Run(ctx) }()
	<-r.reg.Ready()
	nodes := []string{"n0", "n1", "n2"}
	for _, id := range nodes {
		if err := r.reg.Announce(ctx, kvbinding.NodeInfo{Node: id, Type: "LOCAL", Handler: "h", HasConsumer: true, Position: 1}, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	natstest.Eventually(b, 10*time.Second, func() error {
		if len(r.reg.Live()) < len(nodes) {
			return natstest.ErrNotYet
		}
		return nil
	})
	r.cache = kvbinding.NewCache(kvbinding.CacheConfig{})
	for i := range n {
		if !r.cache.Apply(kvbinding.Binding{Group: fmt.Sprintf("order-%d", i), State: kvbinding.StateBound,
			Node: nodes[i%len(nodes)], FromSeq: uint64(i + 1), Revision: uint64(i + 1)}) {
			b.Fatalf("binding %d not applied", i)
		}
	}
	r.eng = newEngine(engineConfig{node: cfg.Node, maxHeldMessages: 10, maxHeldBytes: 1 << 20, maxInFlight: 10}, r.cache, nil)
	r.rs.up.Store(true)
	close(r.life.ready)
	return r
}

// BenchmarkScrape measures what one Prometheus scrape of a node costs (the
// node's own metrics, gathered and written in the text format), with 1,000
// and 1,000,000 bindings in its cache. The figures do not depend on the
// number of bindings: a scrape reads counters and the cache's per-node
// counts, O(nodes). (The ingress stream's info is read at most every 2 s,
// so a loop of scrapes makes almost no request.)
//
//	go test -run XXX -bench Scrape -benchmem ./router
func BenchmarkScrape(b *testing.B) {
	for _, n := range []int{1_000, 1_000_000} {
		b.Run(fmt.Sprintf("bindings=%d", n), func(b *testing.B) {
			r := scrapeRouter(b, n)
			reg := prometheus.NewRegistry()
			if err := r.registerMetrics(reg); err != nil {
				b.Fatal(err)
			}
			var bytes int
			b.ReportAllocs()
			for b.Loop() {
				mfs, err := reg.Gather()
				if err != nil {
					b.Fatal(err)
				}
				w := &countingWriter{}
				enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
				for _, mf := range mfs {
					if err := enc.Encode(mf); err != nil {
						b.Fatal(err)
					}
				}
				bytes = w.n
			}
			b.ReportMetric(float64(bytes), "bytes/scrape")
		})
	}
}

// BenchmarkStatus measures Router.Status, what the status page reads per
// request (one KV get of the handler lease included), with 1,000,000
// bindings.
func BenchmarkStatus(b *testing.B) {
	r := scrapeRouter(b, 1_000_000)
	b.ReportAllocs()
	for b.Loop() {
		if st := r.Status(context.Background()); len(st.Nodes) != 3 || st.Records != 1_000_000 {
			b.Fatalf("status: %d nodes, %d records", len(st.Nodes), st.Records)
		}
	}
}

type countingWriter struct{ n int }

func (w *countingWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

var _ io.Writer = (*countingWriter)(nil)

// TestScrapeIsConsistent gathers a ready node's metrics through a pedantic
// registry, which fails a metric collected under a description Describe
// did not announce: the four held-back metrics were once collected and
// never described. Every metric the table describes shows in the scrape.
func TestScrapeIsConsistent(t *testing.T) {
	r := scrapeRouter(t, 10)
	reg := prometheus.NewPedanticRegistry()
	if err := r.registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range families {
		got[f.GetName()] = true
	}
	c := newCollector(r)
	for _, m := range c.metrics {
		name := m.desc.String() // Desc{fqName: "grouprouter_…", …}
		i := strings.Index(name, `fqName: "`) + len(`fqName: "`)
		name = name[i : i+strings.IndexByte(name[i:], '"')]
		if !got[name] && name != "grouprouter_ingress_lag_messages" {
			t.Errorf("%s is described but not collected", name)
		}
	}
	for _, want := range []string{"grouprouter_held_back_groups", "grouprouter_group_share", "grouprouter_bindings", "grouprouter_queue_backlog_messages"} {
		if !got[want] {
			t.Errorf("%s not collected", want)
		}
	}
}
