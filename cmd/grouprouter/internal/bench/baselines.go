package bench

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/localnats"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// rawPublish is baseline (ii): the producer alone, PublishMsgAsync of the
// same messages into one stream of the same replication, timed from the
// first publish to the last PubAck.
func (b *bencher) rawPublish(ctx context.Context, e *env) (figure, time.Duration, error) {
	const stream, subject = "BENCH_RAW", "bench.raw.x"
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := e.js.CreateStream(cctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"bench.raw.>"},
		Storage: jetstream.FileStorage, Replicas: e.replicas}); err != nil {
		return figure{}, 0, fmt.Errorf("bench: raw stream: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.js.DeleteStream(dctx, stream)
	}()
	hot := hotGroups("raw", b.cfg.Groups)
	b.runID++
	w := startCPUWatch()
	start, err := e.prod.publish(ctx, subject, b.runID, b.cfg.Messages, 0, roundRobin(hot, false))
	if err != nil {
		return figure{}, 0, err
	}
	el := time.Since(start)
	cpu := (selfUsage().CPU() - w.self) / time.Duration(b.cfg.Messages)
	f := b.figure(w, 0, float64(b.cfg.Messages)/el.Seconds())
	b.logf("%-28s %7d msgs in %6.2fs = %8.0f msgs/s, %.1f µs CPU/msg%s", "raw JetStream publish", b.cfg.Messages, el.Seconds(), f.V, us(cpu), f.noise())
	return f, cpu, nil
}

// figure is a measured value and the share of the machine other
// processes took while it was measured (-1: unknown).
type figure struct {
	V, Foreign float64
}

func (f figure) noise() string { return noiseNote(f.Foreign) }

func noiseNote(foreign float64) string {
	if foreign < 0 {
		return ""
	}
	return fmt.Sprintf(" [other processes: %.0f%% of the machine]", 100*foreign)
}

func (b *bencher) figure(w cpuWatch, children time.Duration, v float64) figure {
	f := figure{V: v, Foreign: w.foreign(children, runtime.NumCPU())}
	b.noteForeign(f.Foreign)
	return f
}

// bindingValue is a realistic bucket value for group.
func bindingValue(group, node string, seq uint64) ([]byte, error) {
	return kvbinding.Binding{Group: group, State: kvbinding.StateBound, Node: node, FromSeq: seq,
		DecidedAt: time.Now().UTC(), DecidedBy: handlerName + "/n0", ProposedBy: node}.Marshal()
}

// kvBucket creates a scratch bucket like the bindings bucket.
func (b *bencher) kvBucket(ctx context.Context, e *env, name string) (jetstream.KeyValue, func(), error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	kv, err := e.js.CreateKeyValue(cctx, jetstream.KeyValueConfig{Bucket: name, History: 1,
		Replicas: e.replicas, Storage: jetstream.FileStorage})
	if err != nil {
		return nil, nil, fmt.Errorf("bench: bucket %s: %w", name, err)
	}
	return kv, func() {
		dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = e.js.DeleteKeyValue(dctx, name)
	}, nil
}

// kvCreatePipelined is baseline (iii), pipelined: n creates published
// asynchronously to $KV.<bucket>.<key> with Nats-Expected-Last-Subject-
// Sequence: 0 (what KeyValue.Create sends), on their own connection,
// timed from the first publish to the last PubAck.
//
// With watched set, the bucket is a copy of the bindings bucket and an
// ordered consumer watches it, as every router node does; the run ends
// when it has received every record too. That is the limit of this design
// for decisions: each binding is written once and delivered to a watcher.
func (b *bencher) kvCreatePipelined(ctx context.Context, e *env, n int, watched bool) (figure, error) {
	bucket := "bench-kv-pipelined"
	var (
		drop    func()
		err     error
		applied atomic.Int64
		all     = make(chan struct{})
	)
	if watched {
		bucket = "bench-kv-watched"
		if _, err := kvbinding.OpenStore(ctx, e.js, kvbinding.StoreConfig{Bucket: bucket, Replicas: e.replicas}); err != nil {
			return figure{}, err
		}
		drop = func() {
			dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.js.DeleteKeyValue(dctx, bucket)
		}
		// The watcher only counts deliveries: decoding is the watching
		// node's business, and a node skips the records it wrote itself.
		wnc, err := localnats.Connect(e.ns.URLsFor(0), "bench-kv-watcher")
		if err != nil {
			drop()
			return figure{}, err
		}
		defer wnc.Close()
		wjs, err := jetstream.New(wnc)
		if err != nil {
			drop()
			return figure{}, err
		}
		cons, err := wjs.OrderedConsumer(ctx, "KV_"+bucket, jetstream.OrderedConsumerConfig{})
		if err != nil {
			drop()
			return figure{}, err
		}
		cc, err := cons.Consume(func(jetstream.Msg) {
			if applied.Add(1) == int64(n) {
				close(all)
			}
		}, jetstream.PullMaxMessages(4096))
		if err != nil {
			drop()
			return figure{}, err
		}
		defer cc.Stop()
	} else if _, drop, err = b.kvBucket(ctx, e, bucket); err != nil {
		return figure{}, err
	}
	defer drop()
	nc, err := localnats.Connect(e.ns.URLsFor(0), "bench-kv-pipelined")
	if err != nil {
		return figure{}, err
	}
	defer nc.Close()
	var failed atomic.Int64
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { failed.Add(1) }))
	if err != nil {
		return figure{}, err
	}
	msgs := make([]*nats.Msg, n)
	for i := range msgs {
		g := "kvp-" + strconv.Itoa(i)
		val, err := bindingValue(g, "n0", uint64(i+1))
		if err != nil {
			return figure{}, err
		}
		key, _ := kvbinding.Key(g)
		msgs[i] = &nats.Msg{Subject: "$KV." + bucket + "." + key, Data: val,
			Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}}}
	}
	w := startCPUWatch()
	start := time.Now()
	for _, m := range msgs {
		for {
			if _, err := js.PublishMsgAsync(m); err == nil {
				break
			}
			if ctx.Err() != nil {
				return figure{}, ctx.Err()
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		return figure{}, fmt.Errorf("bench: KV creates still pending after a minute")
	}
	if watched {
		select {
		case <-all:
		case <-time.After(time.Minute):
			return figure{}, fmt.Errorf("bench: watcher has %d of %d records after a minute", applied.Load(), n)
		}
	}
	el := time.Since(start)
	if f := failed.Load(); f > 0 {
		return figure{}, fmt.Errorf("bench: %d pipelined KV creates failed", f)
	}
	f := b.figure(w, 0, float64(n)/el.Seconds())
	name := "KV create pipelined"
	if watched {
		name += ", watched"
	}
	b.logf("%-28s %7d in %6.2fs = %8.0f creates/s, bench process %.1f µs/create%s", name, n, el.Seconds(), f.V,
		us((selfUsage().CPU()-w.self)/time.Duration(n)), f.noise())
	return f, nil
}

// kvCreateConcurrent is baseline (iii) as most code would write it:
// workers goroutines calling KeyValue.Create.
func (b *bencher) kvCreateConcurrent(ctx context.Context, e *env, n, workers int) (figure, error) {
	const bucket = "bench-kv-concurrent"
	kv, drop, err := b.kvBucket(ctx, e, bucket)
	if err != nil {
		return figure{}, err
	}
	defer drop()
	vals := make([][]byte, n)
	keys := make([]string, n)
	for i := range vals {
		g := "kvc-" + strconv.Itoa(i)
		if vals[i], err = bindingValue(g, "n0", uint64(i+1)); err != nil {
			return figure{}, err
		}
		keys[i], _ = kvbinding.Key(g)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	w := startCPUWatch()
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := kv.Create(cctx, keys[i], vals[i])
				cancel()
				if err != nil {
					errs <- fmt.Errorf("bench: KV create %s: %w", keys[i], err)
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	select {
	case err := <-errs:
		return figure{}, err
	default:
	}
	f := b.figure(w, 0, float64(n)/el.Seconds())
	b.logf("%-28s %7d in %6.2fs = %8.0f creates/s%s", fmt.Sprintf("KV create %d goroutines", workers), n, el.Seconds(), f.V, f.noise())
	return f, nil
}

// warmPhase writes cfg.WarmStart bindings into the bindings bucket
// (asynchronous publishes of valid records), then has a child process load
// them into a fresh cache and report time and heap.
func (b *bencher) warmPhase(ctx context.Context, e *env) (*warmResult, error) {
	if err := b.resetRouting(ctx, e); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	store, err := kvbinding.OpenStore(cctx, e.js, kvbinding.StoreConfig{Replicas: e.replicas})
	cancel()
	if err != nil {
		return nil, err
	}
	nc, err := localnats.Connect(e.ns.URLsFor(0), "bench-warm-fill")
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	var failed atomic.Int64
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { failed.Add(1) }))
	if err != nil {
		return nil, err
	}
	n := b.cfg.WarmStart
	prefix := "$KV." + store.Bucket() + "."
	nodes := []string{"n0", "n1", "n2"}
	start := time.Now()
	for i := 0; i < n; i++ {
		// Group ids like an application's: "order-" and a number.
		g := "order-" + strconv.Itoa(1_000_000+i)
		val, err := bindingValue(g, nodes[i%len(nodes)], uint64(i+1))
		if err != nil {
			return nil, err
		}
		key, err := kvbinding.Key(g)
		if err != nil {
			return nil, err
		}
		m := &nats.Msg{Subject: prefix + key, Data: val}
		for {
			if _, err := js.PublishMsgAsync(m); err == nil {
				break
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(2 * time.Minute):
		return nil, fmt.Errorf("bench: warm-start fill still pending after 2 minutes")
	}
	if f := failed.Load(); f > 0 {
		return nil, fmt.Errorf("bench: %d warm-start writes failed", f)
	}
	fill := time.Since(start)
	b.logf("%-28s %7d in %6.2fs = %8.0f writes/s", "warm-start fill", n, fill.Seconds(), float64(n)/fill.Seconds())

	args := []string{"--mode", modeWarm, "--nats", strings.Join(e.ns.URLsFor(0), ","), "--node", "warm"}
	if b.cfg.CPUProfile != "" {
		args = append(args, "--cpuprofile", profileName(b.cfg.CPUProfile, "warm"))
	}
	wat := startCPUWatch()
	k, err := startChild(b.prefix, args, "warm start", b.stderr)
	if err != nil {
		return nil, err
	}
	rep, _, err := k.wait(3 * time.Minute)
	if err != nil {
		return nil, err
	}
	if rep.Event != "warm" || rep.Bindings == 0 {
		return nil, fmt.Errorf("bench: warm start reported %+v", rep)
	}
	w := &warmResult{count: rep.Bindings, fillRate: float64(n) / fill.Seconds(), load: rep.WarmNS,
		heapDelta: int64(rep.HeapAfter) - int64(rep.HeapBefore), rss: rep.Usage.MaxRSS}
	w.foreign = wat.foreign(rep.Usage.CPU(), runtime.NumCPU())
	b.noteForeign(w.foreign)
	b.logf("%-28s %7d in %6.2fs, heap %+d B = %.0f B/binding, max RSS %.1f MiB%s", "warm start (child)", w.count,
		w.load.Seconds(), w.heapDelta, float64(w.heapDelta)/float64(w.count), float64(w.rss)/(1<<20), figure{Foreign: w.foreign}.noise())
	return w, nil
}

// decisionService measures the LOCAL handler's decision throughput on its
// own: proposals of new groups sent straight to grouping.propose in the
// router's batching (1024 per request, 8 requests in flight), each answered
// once its binding is written — to compare with raw pipelined KV creates.
// The handler runs in the router child; its CPU counts as ours, not foreign.
func (b *bencher) decisionService(ctx context.Context, e *env, kids []*child, tag string, n int) (figure, error) {
	nc, err := localnats.Connect(e.ns.URLsFor(0), "bench-proposer")
	if err != nil {
		return figure{}, err
	}
	defer nc.Close()
	c := proposals.NewClient(nc, "bench", 30*time.Second)
	// Each proposal names an ingress sequence past the stream's end: the
	// handler refuses a bind below the routing floor (the messages the
	// nodes routed already), fast and without a write.
	s, err := e.js.Stream(ctx, router.IngressStream)
	if err != nil {
		return figure{}, err
	}
	base := s.CachedInfo().State.LastSeq
	before, err := snapshots(ctx, kids)
	if err != nil {
		return figure{}, err
	}
	const batch, inFlight = proposals.MaxProposalsPerRequest, 8
	sem := make(chan struct{}, inFlight)
	var (
		wg      sync.WaitGroup
		failed  atomic.Int64
		lastErr atomic.Value
	)
	w := startCPUWatch()
	start := time.Now()
	for off := 0; off < n; off += batch {
		ps := make([]proposals.Proposal, 0, batch)
		for i := off; i < min(off+batch, n); i++ {
			ps = append(ps, proposals.Proposal{Group: "svc-" + tag + "-" + strconv.Itoa(i), Node: "n0", Seq: base + uint64(i+1)})
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			ds, err := c.Propose(ctx, ps)
			if err != nil {
				failed.Add(int64(len(ps)))
				lastErr.Store(err)
				return
			}
			for _, d := range ds {
				if d.Outcome != proposals.Accepted {
					failed.Add(1)
					lastErr.Store(fmt.Errorf("group %s: %s (%s, floor %d, limit %d)", d.Group, d.Outcome, d.Error, d.Floor, d.Limit))
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if f := failed.Load(); f > 0 {
		return figure{}, fmt.Errorf("bench: %d of %d proposals not accepted (last error: %v)", f, n, lastErr.Load())
	}
	after, err := snapshots(ctx, kids)
	if err != nil {
		return figure{}, err
	}
	var childCPU time.Duration
	for i := range after {
		childCPU += after[i].Usage.CPU() - before[i].Usage.CPU()
	}
	f := b.figure(w, childCPU, float64(n)/el.Seconds())
	b.logf("%-28s %7d in %6.2fs = %8.0f decisions/s, node CPU %.1f µs/decision, bench process %.1f µs/decision%s", "decision service", n, el.Seconds(), f.V,
		us(childCPU/time.Duration(n)), us((selfUsage().CPU()-w.self)/time.Duration(n)), f.noise())
	return f, nil
}
