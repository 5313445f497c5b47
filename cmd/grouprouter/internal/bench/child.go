package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/localnats"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// Child modes (NodeMain --mode).
const (
	modeRouter = "router" // one router node
	modeRelay  = "relay"  // the relay baseline: ingress -> queue, no grouping
	modeWarm   = "warm"   // load a fresh binding cache once and report
)

// usage is CPU time and peak memory of a process.
type usage struct {
	User   time.Duration `json:"user_ns"`
	Sys    time.Duration `json:"sys_ns"`
	MaxRSS int64         `json:"max_rss"` // bytes (VmHWM where there is /proc)
	// Syscalls counts the read and write system calls the process made
	// (syscr + syscw of /proc/self/io; 0 where there is none): how many
	// socket reads and writes its messages took.
	Syscalls uint64 `json:"syscalls,omitempty"`
}

// CPU is user + system time.
func (u usage) CPU() time.Duration { return u.User + u.Sys }

// report is one JSON line a child writes on stdout: "ready" once it
// works, "stats" in answer to a "stats" line on stdin, "warm" with the
// cache load figures, "exit" when it has drained.
type report struct {
	Event string `json:"event"`
	Mode  string `json:"mode"`
	Node  string `json:"node,omitempty"`
	Error string `json:"error,omitempty"`

	// Router and relay counters.
	Routed         uint64 `json:"routed,omitempty"`
	Skipped        uint64 `json:"skipped,omitempty"`
	Proposals      uint64 `json:"proposals,omitempty"`
	DecisionErrors uint64 `json:"decision_errors,omitempty"`
	PublishErrors  uint64 `json:"publish_errors,omitempty"`
	Held           int    `json:"held,omitempty"`
	Spilled        int    `json:"spilled,omitempty"`
	Position       uint64 `json:"position,omitempty"` // next ingress sequence to read
	Bindings       int    `json:"bindings,omitempty"` // records in the binding cache
	// Atomic batches (router.Stats): published, failed, messages stored in
	// them.
	Batches       uint64 `json:"batches,omitempty"`
	BatchFailures uint64 `json:"batch_failures,omitempty"`
	Batched       uint64 `json:"batched,omitempty"`

	// Process figures at the time of the report.
	Usage     usage  `json:"usage"`
	HeapInuse uint64 `json:"heap_inuse"`
	HeapAlloc uint64 `json:"heap_alloc"`

	// Warm start (mode warm).
	WarmNS     time.Duration `json:"warm_ns,omitempty"`
	HeapBefore uint64        `json:"heap_before,omitempty"`
	HeapAfter  uint64        `json:"heap_after,omitempty"`
}

// reporter writes reports as JSON lines, one writer at a time.
type reporter struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (r *reporter) send(rep report) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.enc.Encode(rep)
}

// processFigures fills the process part of a report.
func processFigures(rep *report) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rep.Usage = selfUsage()
	rep.Usage.Syscalls = ioSyscalls()
	if rss, ok := peakRSS(); ok {
		rep.Usage.MaxRSS = rss
	}
	rep.HeapInuse, rep.HeapAlloc = ms.HeapInuse, ms.HeapAlloc
}

// NodeMain is the entry point of a benchmark child process (the hidden
// "grouprouter bench-node" command). It runs one router node, the relay
// baseline, or a binding-cache warm start, as --mode says, connected to
// the NATS URLs in --nats (loopback only). It writes JSON lines on stdout:
// "ready" when it routes, a "stats" line for each "stats" line read on
// stdin, and "exit" after it drained on SIGTERM/SIGINT, on ctx's end or
// when stdin closes (the parent is gone). Logs (warnings) go to stderr.
func NodeMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench-node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		mode       = fs.String("mode", modeRouter, "router, relay or warm")
		urls       = fs.String("nats", "", "NATS URLs, comma-separated, own server first")
		node       = fs.String("node", "n0", "node id (router), or the node whose queue the relay fills")
		typ        = fs.String("type", string(router.Local), "LOCAL or REMOTE (router)")
		address    = fs.String("address", benchAddress, "grouping-handler address (router)")
		name       = fs.String("name", "bench", "grouping-handler name (router)")
		timeout    = fs.Duration("timeout", router.DefaultTimeout, "proposal timeout (router)")
		replicas   = fs.Int("replicas", 0, "replicas of streams and buckets, 0 = auto (router)")
		startSeq   = fs.Uint64("start-seq", 0, "first ingress sequence to relay (relay)")
		maxBatch   = fs.Int("max-batch", 0, "messages of a group per batch, 1 = off, 0 = the default (router)")
		groupShare = fs.Int("group-share", 0, "a group's share of the queue window, -1 = no bound, 0 = the default (router)")
		maxSpilled = fs.Int64("max-spilled-bytes", 0, "bytes of spilled messages, -1 = never spill, 0 = the default (router)")
		cpuprofile = fs.String("cpuprofile", "", "write a CPU profile of this process to `file`")
		memprofile = fs.String("memprofile", "", "write a heap profile of this process to `file` each time its heap in use reaches a new peak (checked every 200 ms)")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	list := strings.Split(*urls, ",")
	for _, u := range list {
		if err := mustLoopback(u); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(ctx, stopSignals...)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}

	if *memprofile != "" {
		stopPeak := heapPeakProfile(ctx, *memprofile)
		defer stopPeak()
	}
	out := &reporter{enc: json.NewEncoder(stdout)}
	nc, err := localnats.Connect(list, "bench-"+*mode+"-"+*node)
	if err != nil {
		return err
	}
	defer nc.Close()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("child", *mode, "node", *node)

	// The stats protocol: a "stats" line on stdin is answered with a
	// report; EOF means the parent is gone.
	var snapshot atomic.Pointer[func() report]
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "stats" {
				rep := report{Event: "stats", Mode: *mode, Node: *node}
				if f := snapshot.Load(); f != nil {
					rep = (*f)()
					rep.Event = "stats"
				}
				processFigures(&rep)
				out.send(rep)
			}
		}
		cancel()
	}()

	switch *mode {
	case modeRouter:
		t, err := router.ParseHandlerType(*typ)
		if err != nil {
			return err
		}
		cfg := router.Config{Name: *name, Type: t, Address: *address, Timeout: *timeout, Node: *node,
			Replicas: *replicas, MaxBatch: *maxBatch, MaxSpilledBytes: *maxSpilled, GroupShare: *groupShare, Logger: log}
		r, err := router.New(nc, cfg)
		if err != nil {
			return err
		}
		snap := func() report { return routerReport(r) }
		snapshot.Store(&snap)
		errc := make(chan error, 1)
		go func() { errc <- r.Run(ctx) }()
		select {
		case <-r.Ready():
			rep := snap()
			rep.Event = "ready"
			processFigures(&rep)
			out.send(rep)
		case err := <-errc:
			if err == nil {
				err = errors.New("stopped before it was ready")
			}
			return fmt.Errorf("bench-node %s: %w", *node, err)
		}
		err = <-errc
		rep := snap()
		rep.Event = "exit"
		if err != nil {
			rep.Error = err.Error()
		}
		processFigures(&rep)
		out.send(rep)
		return err

	case modeRelay:
		rl := &relay{node: *node, startSeq: *startSeq, log: log}
		snap := func() report {
			return report{Mode: modeRelay, Node: *node, Routed: rl.relayed.Load(), Position: rl.next.Load(),
				PublishErrors: rl.errs.Load()}
		}
		snapshot.Store(&snap)
		err := rl.run(ctx, nc, func() {
			rep := snap()
			rep.Event = "ready"
			processFigures(&rep)
			out.send(rep)
		})
		rep := snap()
		rep.Event = "exit"
		if err != nil {
			rep.Error = err.Error()
		}
		processFigures(&rep)
		out.send(rep)
		return err

	case modeWarm:
		rep, err := warmStart(ctx, nc)
		if err != nil {
			return err
		}
		rep.Node = *node
		out.send(rep)
		return nil
	}
	return fmt.Errorf("bench-node: unknown mode %q", *mode)
}

func routerReport(r *router.Router) report {
	st := r.Stats()
	rep := report{Mode: modeRouter, Node: r.Node(), Routed: st.Routed, Skipped: st.Skipped,
		Proposals: st.Proposals, DecisionErrors: st.DecisionErrors, PublishErrors: st.PublishErrors,
		Held: st.Held, Spilled: st.Spilled, Position: st.Position,
		Batches: st.Batches, BatchFailures: st.BatchFailures, Batched: st.BatchedMessages}
	if c := r.Cache(); c != nil {
		rep.Bindings = c.Len()
	}
	return rep
}

// warmStart measures how long a fresh binding cache takes to load the
// bindings bucket and how much heap it holds afterwards.
func warmStart(ctx context.Context, nc *nats.Conn) (report, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return report{}, err
	}
	store, err := kvbinding.OpenStore(ctx, js, kvbinding.StoreConfig{})
	if err != nil {
		return report{}, err
	}
	before := settledHeap()
	cache := kvbinding.NewCache(kvbinding.CacheConfig{})
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- cache.Run(runCtx, store) }()
	select {
	case <-cache.Ready():
	case err := <-done:
		stopRun()
		return report{}, fmt.Errorf("warm start: cache stopped: %v", err)
	case <-ctx.Done():
		stopRun()
		return report{}, ctx.Err()
	}
	elapsed := time.Since(start)
	// Stop the watch so that only the cache itself stays on the heap.
	stopRun()
	<-done
	after := settledHeap()
	rep := report{Event: "warm", Mode: modeWarm, Bindings: cache.Len(), WarmNS: elapsed,
		HeapBefore: before, HeapAfter: after}
	processFigures(&rep)
	runtime.KeepAlive(cache)
	return rep, nil
}

// settledHeap returns HeapInuse after two collections.
func settledHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// heapPeakProfile writes a heap profile to file each time the heap in use
// reaches a new peak (by more than 5 %), until the returned function is
// called: where the memory of a burst goes at its height.
func heapPeakProfile(ctx context.Context, file string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var peak uint64
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse <= peak+peak/20 {
				continue
			}
			peak = ms.HeapInuse
			if f, err := os.Create(file); err == nil {
				_ = pprof.WriteHeapProfile(f)
				f.Close()
			}
		}
	}()
	return func() { cancel(); <-done }
}
