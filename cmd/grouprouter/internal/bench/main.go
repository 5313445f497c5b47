package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/localnats"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// ErrUsage is wrapped by Main's errors about its command line (nothing
// was started then); -h returns flag.ErrHelp.
var ErrUsage = errors.New("bench: usage")

// config is the parsed command line.
type config struct {
	JSON       bool
	Servers    []int
	Nodes      int
	Messages   int
	Decisions  int
	Burst      int
	Flood      int
	FloodRate  float64
	FloodSpill bool
	Creates    int
	Groups     int
	Payload    int
	Rate       float64
	Workloads  []string
	WarmStart  int
	ZipfGroups int
	ZipfS      float64
	LatencyFor time.Duration
	Repeat     int
	Producers  int
	Scaling    bool
	Keep       bool
	CPUProfile string
	Sync       localnats.Sync
	MaxBatch   int
	GroupShare int
}

// Defaults: the steady state runs the 100,000 messages; the whole
// default run (both server set-ups) takes about five minutes on a 2-core
// machine.
const (
	defaultMessages   = 100_000
	defaultDecisions  = 20_000
	defaultCreates    = 50_000
	defaultGroups     = 1_000
	defaultPayload    = 1024
	defaultWarmStart  = 200_000
	defaultZipfGroups = 1_000_000
	defaultZipfS      = 1.1
	defaultLatencyFor = 3 * time.Second
	defaultRepeat     = 3
	defaultProducers  = 4
	handlerName       = "bench"
)

func parseFlags(args []string, stdout, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			fs.SetOutput(stdout) // asked-for help goes to stdout
		}
	}
	var (
		c         config
		servers   string
		workloads string
	)
	fs.BoolVar(&c.JSON, "json", false, "print the results as JSON instead of a table")
	fs.StringVar(&servers, "servers", "1,3", "NATS set-ups to run on: 1 (one server), 3 (a 3-server cluster) or both")
	fs.IntVar(&c.Nodes, "nodes", 1, "router nodes for every workload (the steady state also runs with 3)")
	fs.IntVar(&c.Messages, "messages", defaultMessages, "messages per throughput run of the steady state, the relay and raw publish")
	fs.IntVar(&c.Decisions, "decisions", defaultDecisions, "messages per throughput run of the decision-bound workloads (cardinality: each a new group; zipf) and KV creates of their baseline")
	fs.IntVar(&c.Burst, "burst", defaultBurst, "new groups of each run of the burst workload (ids of 64, then 1000 bytes)")
	fs.IntVar(&c.Flood, "flood", defaultFlood, "new groups of the flood workload (64-byte ids), published as fast as the producers can beside a bound group")
	fs.Float64Var(&c.FloodRate, "flood-rate", 0, "pace of the flood (msgs/s); 0 = as fast as the producers can")
	fs.BoolVar(&c.FloodSpill, "flood-spill", true, "the flood's router node spills messages waiting for a decision (--max-spilled-bytes); false: it never does, for a comparison")
	fs.IntVar(&c.Creates, "creates", defaultCreates, "proposals per run of the decision service alone, and KV creates per run of its baselines")
	fs.IntVar(&c.Groups, "groups", defaultGroups, "hot groups of the steady state")
	fs.IntVar(&c.Payload, "payload", defaultPayload, "message body size in bytes")
	fs.Float64Var(&c.Rate, "rate", 0, "publish rate (msgs/s) of the latency runs; 0 = half the measured peak")
	fs.StringVar(&workloads, "workloads", "steady,cardinality,zipf,hot", "workloads to run: steady, cardinality, zipf, hot (1 and 10 groups), burst, flood, busy (quiet groups beside one group's backlog)")
	fs.IntVar(&c.GroupShare, "group-share", 0, "the router nodes' --group-share (-1: no group is held back for its share of the queue window); 0 = the router's default")
	fs.IntVar(&c.MaxBatch, "max-batch", 0, "the router nodes' MaxBatch (messages of a group per batch: atomic on R3, fast-ingest on R1; 1 turns batches off); 0 = the router's default")
	fs.IntVar(&c.WarmStart, "warm-start", defaultWarmStart, "bindings written before the cache warm start (0 skips it)")
	fs.IntVar(&c.ZipfGroups, "zipf-groups", defaultZipfGroups, "distinct groups of the zipf workload")
	fs.Float64Var(&c.ZipfS, "zipf-s", defaultZipfS, "exponent of the zipf workload (> 1)")
	fs.DurationVar(&c.LatencyFor, "latency-duration", defaultLatencyFor, "length of each paced latency run")
	fs.IntVar(&c.Repeat, "repeat", defaultRepeat, "runs of each figure a target compares (steady and relay throughput, their paced p99, raw publish, decision service, KV creates); the median is reported")
	fs.IntVar(&c.Producers, "producers", defaultProducers, "producer connections publishing the load (spread over the servers)")
	fs.BoolVar(&c.Scaling, "scaling", true, "with steady: also measure a node that skips every message and the steady state with 3 nodes")
	c.Sync = localnats.Sync{Interval: localnats.ServerDefaultSync}
	fs.Var(&c.Sync, "sync", "the NATS servers' fsync policy: always (every write on disk before its PubAck), or the interval between background flushes (default: nats-server's own)")
	fs.BoolVar(&c.Keep, "keep", false, "keep the temporary directory (NATS stores) and print its path")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of router node n0's process to `file` (-s1/-s3 inserted when both set-ups run), of the relay's to file-relay, of the node skipping every message to file-skip, of the warm start's to file-warm, and of this process (servers, producers, consumers) during the relay, the router and the 3-node phases to file-nats-relay, file-nats-router, file-nats-3nodes; with several workloads, each router phase's files get -<workload> inserted (file-steady, file-nats-router-steady)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: grouprouter bench [flags]\n\n"+
			"Starts its own NATS (in this process) and router nodes (child processes), runs the\n"+
			"workloads and their same-run baselines, and prints one row per measurement.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%w: unexpected argument %q", ErrUsage, fs.Arg(0))
	}
	for _, s := range strings.Split(servers, ",") {
		switch strings.TrimSpace(s) {
		case "1":
			c.Servers = append(c.Servers, 1)
		case "3":
			c.Servers = append(c.Servers, 3)
		default:
			return c, fmt.Errorf("%w: --servers %q: want 1, 3 or 1,3", ErrUsage, servers)
		}
	}
	for _, w := range strings.Split(workloads, ",") {
		switch w = strings.TrimSpace(w); w {
		case wlSteady, wlCardinality, wlZipf, wlHot, wlBurst, wlFlood, wlBusy:
			if !slices.Contains(c.Workloads, w) {
				c.Workloads = append(c.Workloads, w)
			}
		case "":
		default:
			return c, fmt.Errorf("%w: unknown workload %q (want steady, cardinality, zipf, hot, burst, flood, busy)", ErrUsage, w)
		}
	}
	switch {
	case len(c.Workloads) == 0:
		return c, fmt.Errorf("%w: no workload", ErrUsage)
	case c.MaxBatch < 0:
		return c, fmt.Errorf("%w: --max-batch %d: want >= 0", ErrUsage, c.MaxBatch)
	case c.Nodes < 1 || c.Nodes > 16:
		return c, fmt.Errorf("%w: --nodes %d: want 1 to 16", ErrUsage, c.Nodes)
	case c.Messages < 1, c.Decisions < 1, c.Creates < 1, c.Groups < 1, c.Burst < 1, c.Flood < 1:
		return c, fmt.Errorf("%w: --messages, --decisions, --creates, --groups, --burst and --flood must be >= 1", ErrUsage)
	case c.Payload < minBody || c.Payload > 1<<20:
		return c, fmt.Errorf("%w: --payload %d: want %d to 1048576 bytes", ErrUsage, c.Payload, minBody)
	case c.Rate < 0, c.WarmStart < 0, c.FloodRate < 0:
		return c, fmt.Errorf("%w: --rate, --flood-rate and --warm-start must be >= 0", ErrUsage)
	case c.ZipfGroups < 2 || c.ZipfS <= 1:
		return c, fmt.Errorf("%w: --zipf-groups must be >= 2 and --zipf-s > 1", ErrUsage)
	case c.Producers < 1 || c.Producers > 64:
		return c, fmt.Errorf("%w: --producers %d: want 1 to 64", ErrUsage, c.Producers)
	case c.Repeat < 1 || c.Repeat > 9:
		return c, fmt.Errorf("%w: --repeat %d: want 1 to 9", ErrUsage, c.Repeat)
	case c.LatencyFor <= 0:
		return c, fmt.Errorf("%w: --latency-duration must be > 0", ErrUsage)
	}
	return c, nil
}

// Main runs the benchmark (the "grouprouter bench" command) with args
// (without the command name), printing the results on stdout and progress
// on stderr. It starts NATS servers in this process and router nodes as
// child processes of the command in GROUPROUTER_BENCH_CHILD (default: this
// executable with "bench-node"); see the package documentation.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stdout, stderr)
	if err != nil {
		return err
	}
	prefix, err := childPrefix()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "grouprouter-bench-*")
	if err != nil {
		return err
	}
	if cfg.Keep {
		defer fmt.Fprintf(stderr, "bench: kept %s\n", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	stderr = &lockedWriter{w: stderr}
	b := &bencher{cfg: cfg, prefix: prefix, stdout: stdout, stderr: stderr, tmp: tmp, started: time.Now()}
	res := Result{Machine: machineInfo(), Sizes: b.sizes(), Command: "grouprouter bench " + strings.Join(args, " ")}
	b.logf("sizes: %s", res.Sizes)
	for i, s := range cfg.Servers {
		sr, err := b.runServers(ctx, s, i == 0)
		if err != nil {
			return fmt.Errorf("servers=%d: %w", s, err)
		}
		res.Rows = append(res.Rows, sr.rows(cfg)...)
		if f, ok := b.foreign[s]; ok && f >= 0 {
			res.Rows = append(res.Rows, Row{Workload: "machine", Servers: s, Metric: "CPU taken by other processes (worst run)",
				Value: 100 * f, Unit: unitPercent, Target: "~0 for clean figures"})
		}
	}
	res.ElapsedSec = time.Since(b.started).Seconds()
	if cfg.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	return res.writeTable(stdout)
}

// lockedWriter serializes writes: the children's stderr (copied by
// os/exec goroutines) and the progress lines share one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// bencher runs the benchmark.
type bencher struct {
	cfg            config
	prefix         []string
	stdout, stderr io.Writer
	tmp            string
	started        time.Time
	runID          uint32
	servers        int             // set-up being measured (for logs)
	foreign        map[int]float64 // per set-up: the most other processes took during a run
}

func (b *bencher) noteForeign(f float64) {
	if b.foreign == nil {
		b.foreign = map[int]float64{}
	}
	if cur, ok := b.foreign[b.servers]; !ok || f > cur {
		b.foreign[b.servers] = f
	}
}

func (b *bencher) logf(format string, args ...any) {
	where := ""
	if b.servers > 0 {
		where = fmt.Sprintf("[s%d] ", b.servers)
	}
	fmt.Fprintf(b.stderr, "bench %5.1fs %s%s\n", time.Since(b.started).Seconds(), where, fmt.Sprintf(format, args...))
}

// env is one NATS set-up and the parent's clients on it.
type env struct {
	ns        *localnats.Cluster
	servers   int
	replicas  int
	mon       *nats.Conn // sink consumers, events, admin
	js        jetstream.JetStream
	sink      *sink
	prodConns []*nats.Conn
	prod      *producer
}

func (e *env) close() {
	if e.sink != nil {
		e.sink.stop()
	}
	for _, nc := range e.prodConns {
		nc.Close()
	}
	if e.mon != nil {
		e.mon.Close()
	}
	if e.ns != nil {
		e.ns.Close()
	}
}

// wlResult is a workload's throughput run and paced latency run.
type wlResult struct {
	thr, lat measure
	svc      figure // decision service alone (cardinality)
	// svcNoEvents is the decision service while the events stream is
	// deleted: the events are published, not stored.
	svcNoEvents figure
	// hot: the hot workload's throughput runs, one per hotGroupCounts.
	hot []hotRun
}

// hotRun is a throughput run of the hot workload over groups groups.
type hotRun struct {
	groups int
	thr    measure
}

// serverResults holds everything measured on one NATS set-up.
type serverResults struct {
	servers, nodes int
	wl             map[string]*wlResult // with cfg.Nodes nodes
	steady3        *wlResult            // steady state with 3 nodes (when cfg.Nodes != 3)
	relay          *wlResult
	steadyRate     float64 // publish rate of the steady latency runs: half the relay's peak
	skip           *skipResult
	raw            figure        // raw JetStream async publish, msgs/s
	rawCPU         time.Duration // this process's CPU per raw publish (servers and producers)
	kvPipe, kvConc figure        // raw KV Create, pipelined / 32 goroutines, creates/s
	kvWatched      figure        // pipelined KV Create into a watched copy of the bindings bucket
	kvN, kvConcN   int
	burst          []burstRun // the burst workload, one run per id length
	flood          *floodRun  // the flood workload
	busy           *busyRun   // the busy-group workload
	warm           *warmResult
}

type warmResult struct {
	count     int
	fillRate  float64
	load      time.Duration
	heapDelta int64
	rss       int64
	foreign   float64
}

func (b *bencher) runServers(ctx context.Context, servers int, first bool) (*serverResults, error) {
	b.servers = servers
	e := &env{servers: servers, replicas: 1}
	if servers >= 3 {
		e.replicas = 3
	}
	defer e.close()
	t0 := time.Now()
	var err error
	if e.ns, err = localnats.Start(ctx, filepath.Join(b.tmp, "s"+strconv.Itoa(servers)), "bench", servers, localnats.WithSync(b.cfg.Sync)); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	b.logf("NATS up in %v (sync %s): %s", time.Since(t0).Round(time.Millisecond), b.cfg.Sync, strings.Join(e.ns.URLs(), ","))
	if e.mon, err = localnats.Connect(e.ns.URLsFor(0), "bench-consumers"); err != nil {
		return nil, err
	}
	if e.js, err = jetstream.New(e.mon); err != nil {
		return nil, err
	}
	if e.sink, err = newSink(e.mon); err != nil {
		return nil, err
	}
	for i := range b.cfg.Producers {
		nc, err := localnats.Connect(e.ns.URLsFor(i), "bench-producer-"+strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		e.prodConns = append(e.prodConns, nc)
	}
	if e.prod, err = newProducer(e.prodConns, b.cfg.Payload); err != nil {
		return nil, err
	}
	sr := &serverResults{servers: servers, nodes: b.cfg.Nodes, wl: map[string]*wlResult{}}

	// (A) The relay baseline: its peak sets the rate of the paced runs.
	profile := b.cfg.CPUProfile
	if len(b.cfg.Servers) > 1 {
		profile = profileName(profile, "s"+strconv.Itoa(servers))
	}
	stop := b.profileSelf(profileName(profile, "nats-relay"))
	err = b.relayPhase(ctx, e, sr, profileName(profile, "relay"))
	stop()
	if err != nil {
		return nil, err
	}
	scaling := b.cfg.Scaling && slices.Contains(b.cfg.Workloads, wlSteady)
	if scaling {
		// (B) What a node spends on messages it skips: n1 reads the
		// steady state beside n0 and routes none of it (it runs before
		// any phase consumes n1's queue).
		if sr.skip, err = b.skipPhase(ctx, e, profileName(profile, "skip")); err != nil {
			return nil, err
		}
	}
	// (C) The router with cfg.Nodes nodes, each workload in a phase of its
	// own, from fresh streams and nodes as the relay's: the queue stream's
	// duplicate window and the servers' caches otherwise carry one
	// workload's hundreds of thousands of messages into the next (the hot
	// groups measured 0.42x the relay after the steady state and zipf,
	// 0.94x alone, in the same hour).
	routed := slices.DeleteFunc(slices.Clone(b.cfg.Workloads), func(w string) bool { return w == wlBurst || w == wlFlood || w == wlBusy })
	for i, wl := range routed {
		nodeProfile, selfProfile := profile, profileName(profile, "nats-router")
		if len(routed) > 1 {
			nodeProfile, selfProfile = profileName(profile, wl), profileName(profile, "nats-router-"+wl)
		}
		stop = b.profileSelf(selfProfile)
		err = b.routerPhase(ctx, e, b.cfg.Nodes, "a"+strconv.Itoa(i), []string{wl}, nodeProfile, sr, sr.wl)
		stop()
		if err != nil {
			return nil, err
		}
	}
	if slices.Contains(b.cfg.Workloads, wlBurst) {
		if err := b.burstPhase(ctx, e, sr, profile); err != nil {
			return nil, err
		}
	}
	if slices.Contains(b.cfg.Workloads, wlFlood) {
		if err := b.floodPhase(ctx, e, sr, profile); err != nil {
			return nil, err
		}
	}
	if slices.Contains(b.cfg.Workloads, wlBusy) {
		if err := b.busyPhase(ctx, e, sr); err != nil {
			return nil, err
		}
	}
	// (D) Steady state with 3 nodes.
	if scaling && b.cfg.Nodes != 3 {
		m := map[string]*wlResult{}
		stop = b.profileSelf(profileName(profile, "nats-3nodes"))
		err = b.routerPhase(ctx, e, 3, "c", []string{wlSteady}, "", sr, m)
		stop()
		if err != nil {
			return nil, err
		}
		sr.steady3 = m[wlSteady]
	}
	// (E) Raw JetStream async publish (the write ceiling), (F) raw KV Create.
	b.phase("raw JetStream publish, raw KV creates")
	// The ceiling is compared with: the median of cfg.Repeat runs.
	type rawRun struct {
		f   figure
		cpu time.Duration
	}
	raw, err := median(b.cfg.Repeat, func() (rawRun, error) {
		f, cpu, err := b.rawPublish(ctx, e)
		return rawRun{f, cpu}, err
	}, func(r rawRun) float64 { return r.f.V })
	if err != nil {
		return nil, err
	}
	sr.raw, sr.rawCPU = raw.f, raw.cpu
	sr.kvN = b.cfg.Creates
	if sr.kvPipe, err = b.medianFigure(func() (figure, error) { return b.kvCreatePipelined(ctx, e, sr.kvN, false) }); err != nil {
		return nil, err
	}
	if sr.kvWatched, err = b.medianFigure(func() (figure, error) { return b.kvCreatePipelined(ctx, e, sr.kvN, true) }); err != nil {
		return nil, err
	}
	sr.kvConcN = b.cfg.Decisions // informative only: the smaller size
	if sr.kvConc, err = b.kvCreateConcurrent(ctx, e, sr.kvConcN, 32); err != nil {
		return nil, err
	}
	// (G) Cache warm start, on the first set-up only.
	if first && b.cfg.WarmStart > 0 {
		b.phase("warm start of %d bindings", b.cfg.WarmStart)
		if sr.warm, err = b.warmPhase(ctx, e); err != nil {
			return nil, err
		}
	}
	return sr, nil
}

// withoutEventStore runs fn with the events stream deleted, then creates
// it again as it was (empty).
func (b *bencher) withoutEventStore(ctx context.Context, e *env, fn func() error) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := e.js.Stream(cctx, router.EventsStream)
	if err != nil {
		return fmt.Errorf("bench: events stream: %w", err)
	}
	cfg := st.CachedInfo().Config
	if err := e.js.DeleteStream(cctx, router.EventsStream); err != nil {
		return fmt.Errorf("bench: delete the events stream: %w", err)
	}
	runErr := fn()
	cctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := e.js.CreateStream(cctx, cfg); err != nil {
		return errors.Join(runErr, fmt.Errorf("bench: create the events stream again: %w", err))
	}
	return runErr
}

// profileSelf writes a CPU profile of this process (the NATS servers, the
// producers and the consumers) to file until the returned function is
// called; "" does nothing.
func (b *bencher) profileSelf(file string) (stop func()) {
	if file == "" {
		return func() {}
	}
	f, err := os.Create(file)
	if err != nil {
		b.logf("no profile %s: %v", file, err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.logf("no profile %s: %v", file, err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}

// profileName inserts "-"+suffix before file's extension ("" stays "").
func profileName(file, suffix string) string {
	if file == "" {
		return ""
	}
	ext := filepath.Ext(file)
	return strings.TrimSuffix(file, ext) + "-" + suffix + ext
}

// resetRouting clears what an earlier phase left: the ingress (purged; its
// sequence numbers go on), every binding, the nodes' checkpoints, the
// routing floor and the queue stream (deleted with its consumers, which the sink stops pulling:
// its duplicate window holds every message id of the last two minutes, a
// heap that would make each later phase's server slower than the
// earlier's), so that every phase starts from the same state on the same
// servers. The next phase's LOCAL node creates the queue stream again.
func (b *bencher) resetRouting(ctx context.Context, e *env) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	purge := func(stream string, opts ...jetstream.StreamPurgeOpt) error {
		s, err := e.js.Stream(ctx, stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return s.Purge(ctx, opts...)
	}
	if err := purge(router.IngressStream); err != nil {
		return fmt.Errorf("bench: purge ingress: %w", err)
	}
	if err := purge("KV_" + kvbinding.DefaultBucket); err != nil {
		return fmt.Errorf("bench: purge bindings: %w", err)
	}
	// The registry bucket denies purges: each checkpoint is deleted, and
	// the routing floor with them. Left in place, the floor lies below the
	// purged ingress's first sequence (the handler raises it from the
	// nodes' checkpoints once a second, and stops with the last phase's
	// node: seen 226 to 17,928 behind), so a fresh node, which has no
	// checkpoint, starts reading at the floor and reports the purged
	// messages in between, all routed by the last phase, as gone: an
	// ERROR per node and phase.
	if err := deleteCheckpointsAndFloor(ctx, e.js); err != nil {
		return fmt.Errorf("bench: delete checkpoints and the routing floor: %w", err)
	}
	e.sink.forget()
	if err := e.js.DeleteStream(ctx, router.QueueStream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("bench: delete the queue stream: %w", err)
	}
	return nil
}

// startNodes starts n router nodes (n0 LOCAL, the others REMOTE), node i
// connected to server i mod servers, and waits until they route, the
// queues of the first consumed nodes are consumed, the registry shows them
// with a consumer (the others live, without one) and the handler holds its
// lease. profile names n0's CPU profile; with skipProfile also n1's.
func (b *bencher) startNodes(ctx context.Context, e *env, n, consumed int, profile, skipProfile string) ([]*child, error) {
	var kids []*child
	fail := func(err error) ([]*child, error) {
		for _, k := range kids {
			_, _, _ = k.stop(10 * time.Second)
		}
		return nil, err
	}
	for i := 0; i < n; i++ {
		node := "n" + strconv.Itoa(i)
		typ := router.Remote
		if i == 0 {
			typ = router.Local
		}
		args := []string{"--mode", modeRouter, "--nats", strings.Join(e.ns.URLsFor(i), ","), "--node", node,
			"--type", string(typ), "--name", handlerName, "--address", benchAddress}
		if i == 0 && profile != "" {
			args = append(args, "--cpuprofile", profile)
		}
		if b.cfg.GroupShare != 0 {
			args = append(args, "--group-share", strconv.Itoa(b.cfg.GroupShare))
		}
		if b.cfg.MaxBatch > 0 {
			args = append(args, "--max-batch", strconv.Itoa(b.cfg.MaxBatch))
		}
		if i == 1 && skipProfile != "" {
			args = append(args, "--cpuprofile", skipProfile)
		}
		k, err := startChild(b.prefix, args, "router "+node, b.stderr)
		if err != nil {
			return fail(err)
		}
		kids = append(kids, k)
	}
	for _, k := range kids {
		if _, err := k.next(ctx, "ready", 60*time.Second); err != nil {
			return fail(err)
		}
	}
	names := make([]string, n)
	for i := range names {
		names[i] = "n" + strconv.Itoa(i)
		if i >= consumed {
			continue
		}
		if err := e.sink.consume(ctx, names[i]); err != nil {
			return fail(err)
		}
	}
	if err := waitRegistry(ctx, e.js, names, consumed, 20*time.Second); err != nil {
		return fail(err)
	}
	return kids, nil
}

// waitRegistry polls the node registry until every node is live, the
// first consumed of them with a consumer and the others without, and the
// handler lease is held.
func waitRegistry(ctx context.Context, js jetstream.JetStream, nodes []string, consumed int, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for {
		last = func() error {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			kv, err := js.KeyValue(cctx, kvbinding.DefaultNodesBucket)
			if err != nil {
				return err
			}
			for i, n := range nodes {
				en, err := kv.Get(cctx, "live."+n)
				if err != nil {
					return fmt.Errorf("node %s: %w", n, err)
				}
				var info kvbinding.NodeInfo
				if err := json.Unmarshal(en.Value(), &info); err != nil {
					return err
				}
				if want := i < consumed; info.HasConsumer != want {
					return fmt.Errorf("node %s: consumer %v, want %v", n, info.HasConsumer, want)
				}
			}
			if _, err := kv.Get(cctx, "lease."+handlerName); err != nil {
				return fmt.Errorf("handler lease: %w", err)
			}
			return nil
		}()
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: nodes not ready after %v: %w", d, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stopAll terminates the children together (they drain in parallel) and
// waits for them, logging each one's lifetime CPU time (rusage).
func (b *bencher) stopAll(kids []*child) error {
	var errs []error
	for _, k := range kids {
		k.terminate()
	}
	for _, k := range kids {
		last, u, err := k.stop(20 * time.Second)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		b.logf("%s stopped: CPU %v user + %v sys over its life, peak RSS %.1f MiB, routed %d",
			k.name, u.User.Round(time.Millisecond), u.Sys.Round(time.Millisecond), mib(float64(last.Usage.MaxRSS)), last.Routed)
	}
	return errors.Join(errs...)
}

// median runs a measurement runs times and returns the run with the
// median value: on a shared 2-core machine one run can be off by 10%,
// enough to flip a target either way.
func median[T any](runs int, run func() (T, error), value func(T) float64) (T, error) {
	out := make([]T, 0, runs)
	for range runs {
		m, err := run()
		if err != nil {
			var zero T
			return zero, err
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, c T) int { return cmp.Compare(value(a), value(c)) })
	return out[len(out)/2], nil
}

// medianRun is median for throughput runs, by rate.
func (b *bencher) medianRun(runs int, run func() (measure, error)) (measure, error) {
	return median(runs, run, func(m measure) float64 { return m.Rate })
}

// medianLatency is median for paced runs, by p99.
func (b *bencher) medianLatency(runs int, run func() (measure, error)) (measure, error) {
	return median(runs, run, func(m measure) float64 { return float64(m.Lat.P99) })
}

// medianFigure is median for figures, cfg.Repeat runs.
func (b *bencher) medianFigure(run func() (figure, error)) (figure, error) {
	return median(b.cfg.Repeat, run, func(f figure) float64 { return f.V })
}

// latencyCount is the size of a paced run at rate: LatencyFor worth of
// messages, at least 1,000 (or all), at most the throughput run's size.
func (b *bencher) latencyCount(rate float64, limit int) int {
	n := int(rate * b.cfg.LatencyFor.Seconds())
	return min(max(n, 1000), limit)
}

func (b *bencher) pace(peak float64) float64 {
	if b.cfg.Rate > 0 {
		return b.cfg.Rate
	}
	return max(peak/2, 100)
}

// routerPhase runs workloads on n fresh router nodes.
func (b *bencher) routerPhase(ctx context.Context, e *env, n int, tag string, workloads []string, profile string, sr *serverResults, out map[string]*wlResult) error {
	b.phase("router, %d node(s): %s", n, strings.Join(workloads, ", "))
	if err := b.resetRouting(ctx, e); err != nil {
		return err
	}
	t0 := time.Now()
	kids, err := b.startNodes(ctx, e, n, n, profile, "")
	if err != nil {
		return err
	}
	b.logf("%d router node(s) ready in %v", n, time.Since(t0).Round(time.Millisecond))
	runErr := func() error {
		label := func(wl, kind string) string { return fmt.Sprintf("%s n=%d %s", wl, n, kind) }
		for _, wl := range workloads {
			res := &wlResult{}
			var err error
			switch wl {
			case wlSteady:
				hot := hotGroups(tag, b.cfg.Groups)
				pref := "hot-" + tag + "-"
				if _, err = b.measureRun(ctx, e, kids, runSpec{label: label(wl, "warm-up"), n: len(hot), groupPrefix: pref,
					groups: roundRobin(hot, true), newGroups: len(hot)}); err != nil {
					return err
				}
				if res.thr, err = b.medianRun(b.cfg.Repeat, func() (measure, error) {
					return b.measureRun(ctx, e, kids, runSpec{label: label(wl, "throughput"), n: b.cfg.Messages,
						groupPrefix: pref, groups: roundRobin(hot, false)})
				}); err != nil {
					return err
				}
				// With cfg.Nodes nodes, the paced runs go at the relay's
				// rate (half its peak) so that their latencies compare, and
				// the p99 is a median; other node counts at half their own
				// peak.
				rate, runs := b.pace(res.thr.Rate), 1
				if n == b.cfg.Nodes && sr.steadyRate > 0 {
					rate, runs = sr.steadyRate, b.cfg.Repeat
				}
				if res.lat, err = b.medianLatency(runs, func() (measure, error) {
					return b.measureRun(ctx, e, kids, runSpec{label: label(wl, "latency"), n: b.latencyCount(rate, b.cfg.Messages),
						rate: rate, keepLat: true, groupPrefix: pref, groups: roundRobin(hot, false)})
				}); err != nil {
					return err
				}
			case wlHot:
				for _, k := range hotGroupCounts {
					htag := tag + "h" + strconv.Itoa(k)
					hot := hotGroups(htag, k)
					pref := "hot-" + htag + "-"
					if _, err = b.measureRun(ctx, e, kids, runSpec{label: label(wl, fmt.Sprintf("%d group(s) warm-up", k)), n: k,
						groupPrefix: pref, groups: roundRobin(hot, true), newGroups: k}); err != nil {
						return err
					}
					thr, err := b.medianRun(b.cfg.Repeat, func() (measure, error) {
						return b.measureRun(ctx, e, kids, runSpec{label: label(wl, fmt.Sprintf("%d group(s) throughput", k)),
							n: min(b.cfg.Messages, maxHotMessages), groupPrefix: pref, groups: roundRobin(hot, false)})
					})
					if err != nil {
						return err
					}
					res.hot = append(res.hot, hotRun{groups: k, thr: thr})
				}
			case wlCardinality:
				pref := "new-" + tag + "-"
				if res.thr, err = b.measureRun(ctx, e, kids, runSpec{label: label(wl, "throughput"), n: b.cfg.Decisions,
					groupPrefix: pref, groups: fresh(pref), newGroups: b.cfg.Decisions}); err != nil {
					return err
				}
				rep := 0
				if res.svc, err = b.medianFigure(func() (figure, error) {
					rep++
					return b.decisionService(ctx, e, kids, tag+strconv.Itoa(rep), b.cfg.Creates)
				}); err != nil {
					return err
				}
				rate := b.pace(res.thr.Rate)
				pref = "newl-" + tag + "-"
				cnt := b.latencyCount(rate, b.cfg.Decisions)
				if res.lat, err = b.measureRun(ctx, e, kids, runSpec{label: label(wl, "latency"), n: cnt,
					rate: rate, keepLat: true, groupPrefix: pref, groups: fresh(pref), newGroups: cnt}); err != nil {
					return err
				}
				// What the events stream costs: the decision service with
				// the bind events published but not stored.
				if err := b.withoutEventStore(ctx, e, func() error {
					res.svcNoEvents, err = b.medianFigure(func() (figure, error) {
						rep++
						return b.decisionService(ctx, e, kids, tag+strconv.Itoa(rep), b.cfg.Creates)
					})
					return err
				}); err != nil {
					return err
				}
			case wlZipf:
				pref := "z-" + tag + "-"
				zg := newZipfGroups(pref, b.cfg.ZipfGroups, b.cfg.ZipfS, uint64(e.servers)*1000+uint64(n))
				gf := zg.next(b.cfg.Decisions)
				if res.thr, err = b.measureRun(ctx, e, kids, runSpec{label: label(wl, "throughput"), n: b.cfg.Decisions,
					groupPrefix: pref, groups: gf, newGroups: zg.fresh}); err != nil {
					return err
				}
				// The paced run goes on with the same groups: the head is
				// bound by now, the tail still brings new groups.
				rate := b.pace(res.thr.Rate)
				cnt := b.latencyCount(rate, b.cfg.Decisions)
				gf = zg.next(cnt)
				if res.lat, err = b.measureRun(ctx, e, kids, runSpec{label: label(wl, "latency"), n: cnt,
					rate: rate, keepLat: true, groupPrefix: pref, groups: gf, newGroups: zg.fresh}); err != nil {
					return err
				}
			}
			out[wl] = res
		}
		return nil
	}()
	stopErr := b.stopAll(kids)
	if runErr != nil {
		return runErr
	}
	return stopErr
}

// skipResult is what a node costs per ingress message when it routes all of
// them (n0) and when it routes none (n1, whose queue has no consumer, so
// that no group is bound to it).
type skipResult struct {
	thr            measure
	routeCPU       time.Duration // n0's CPU per message
	skipCPU        time.Duration // n1's CPU per message
	routed, skiped uint64        // by n0, by n1
}

// skipPhase measures what a node spends on messages it skips: the steady
// state with two nodes, n1 without a consumer (every group is bound to
// n0), throughput runs, per-node CPU.
func (b *bencher) skipPhase(ctx context.Context, e *env, skipProfile string) (*skipResult, error) {
	b.phase("skip cost: n1 reads beside n0 and routes nothing")
	if err := b.resetRouting(ctx, e); err != nil {
		return nil, err
	}
	t0 := time.Now()
	kids, err := b.startNodes(ctx, e, 2, 1, "", skipProfile)
	if err != nil {
		return nil, err
	}
	b.logf("2 router nodes (n1 without consumer) ready in %v", time.Since(t0).Round(time.Millisecond))
	res := &skipResult{}
	runErr := func() error {
		hot := hotGroups("s", b.cfg.Groups)
		pref := "hot-s-"
		if _, err := b.measureRun(ctx, e, kids, runSpec{label: "skip warm-up", n: len(hot), groupPrefix: pref,
			groups: roundRobin(hot, true), newGroups: len(hot)}); err != nil {
			return err
		}
		before, err := snapshots(ctx, kids)
		if err != nil {
			return err
		}
		if res.thr, err = b.measureRun(ctx, e, kids, runSpec{label: "skip throughput", n: b.cfg.Messages,
			groupPrefix: pref, groups: roundRobin(hot, false)}); err != nil {
			return err
		}
		after, err := snapshots(ctx, kids)
		if err != nil {
			return err
		}
		n := time.Duration(b.cfg.Messages)
		res.routeCPU = (after[0].Usage.CPU() - before[0].Usage.CPU()) / n
		res.skipCPU = (after[1].Usage.CPU() - before[1].Usage.CPU()) / n
		res.routed, res.skiped = after[0].Routed-before[0].Routed, after[1].Skipped-before[1].Skipped
		if after[1].Routed != before[1].Routed {
			return fmt.Errorf("bench: the skipping node routed %d messages", after[1].Routed-before[1].Routed)
		}
		b.logf("%-28s n0 %.2f µs/msg (routed %d), n1 %.2f µs/msg (skipped %d)", "skip CPU per message",
			us(res.routeCPU), res.routed, us(res.skipCPU), res.skiped)
		return nil
	}()
	stopErr := b.stopAll(kids)
	if runErr != nil {
		return nil, runErr
	}
	return res, stopErr
}

// relayPhase measures baseline (i): the relay in a child process, fed and
// consumed exactly like the router (hot-group headers, node n0's queue).
// relayArgs prepares the relay's run: the streams and n0's queue
// consumer from a LOCAL node started and stopped, and returns the relay
// child's arguments, from the ingress's next sequence on.
func (b *bencher) relayArgs(ctx context.Context, e *env) ([]string, error) {
	kids, err := b.startNodes(ctx, e, 1, 1, "", "")
	if err != nil {
		return nil, err
	}
	if err := b.stopAll(kids); err != nil {
		return nil, err
	}
	// The sink consumes n0's queue since startNodes: it stops before its
	// consumer goes with the stream, and consumes the new one later.
	e.sink.forget()
	if err := limitsQueue(ctx, e.js); err != nil {
		return nil, err
	}
	var start uint64 = 1
	if s, err := e.js.Stream(ctx, router.IngressStream); err == nil {
		info, err := s.Info(ctx)
		if err != nil {
			return nil, err
		}
		start = info.State.LastSeq + 1
	}
	return []string{"--mode", modeRelay, "--nats", strings.Join(e.ns.URLsFor(0), ","),
		"--node", "n0", "--start-seq", strconv.FormatUint(start, 10)}, nil
}

// limitsQueue replaces the queue stream the node created, and its
// consumers, with a stream of limits retention and otherwise the same
// configuration, for the relay.
// The router's queue is a work queue: every acknowledged message is
// removed, and the file store writes a tombstone for each removal. A relay
// needs no such queue (nothing reads what is still stored), and
// peerbench's relay, the strongest baseline, writes to a limits stream; on
// a work queue it routed 17-22 % fewer messages a second here
// (docs/performance.md). The next phase's reset deletes the stream, and
// the next node creates the work queue again.
func limitsQueue(ctx context.Context, js jetstream.JetStream) error {
	s, err := js.Stream(ctx, router.QueueStream)
	if err != nil {
		return fmt.Errorf("bench: the queue stream: %w", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fmt.Errorf("bench: the queue stream: %w", err)
	}
	var consumers []jetstream.ConsumerConfig
	lister := s.ListConsumers(ctx)
	for ci := range lister.Info() {
		consumers = append(consumers, ci.Config)
	}
	if err := lister.Err(); err != nil {
		return fmt.Errorf("bench: the queue stream's consumers: %w", err)
	}
	cfg := info.Config
	if err := js.DeleteStream(ctx, router.QueueStream); err != nil {
		return fmt.Errorf("bench: delete the queue stream: %w", err)
	}
	cfg.Retention = jetstream.LimitsPolicy
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		return fmt.Errorf("bench: the relay's queue stream: %w", err)
	}
	for _, cc := range consumers {
		if _, err := js.CreateConsumer(ctx, router.QueueStream, cc); err != nil {
			return fmt.Errorf("bench: the relay's queue consumer %s: %w", cc.Durable, err)
		}
	}
	return nil
}

// loneRouterArgs returns the arguments of a lone LOCAL router node n0
// (the burst and flood workloads' fresh node).
func loneRouterArgs(e *env) []string {
	return []string{"--mode", modeRouter, "--nats", strings.Join(e.ns.URLsFor(0), ","), "--node", "n0",
		"--type", "LOCAL", "--name", handlerName, "--address", benchAddress}
}

func (b *bencher) relayPhase(ctx context.Context, e *env, sr *serverResults, profile string) error {
	b.phase("relay baseline")
	if err := b.resetRouting(ctx, e); err != nil {
		return err
	}
	args, err := b.relayArgs(ctx, e)
	if err != nil {
		return err
	}
	if profile != "" {
		args = append(args, "--cpuprofile", profile)
	}
	k, err := startChild(b.prefix, args, "relay", b.stderr)
	if err != nil {
		return err
	}
	kids := []*child{k}
	runErr := func() error {
		if _, err := k.next(ctx, "ready", 60*time.Second); err != nil {
			return err
		}
		if err := e.sink.consume(ctx, "n0"); err != nil {
			return err
		}
		hot := hotGroups("r", b.cfg.Groups)
		res := &wlResult{}
		var err error
		if _, err = b.measureRun(ctx, e, kids, runSpec{label: "relay warm-up", n: len(hot), groups: roundRobin(hot, true)}); err != nil {
			return err
		}
		if res.thr, err = b.medianRun(b.cfg.Repeat, func() (measure, error) {
			return b.measureRun(ctx, e, kids, runSpec{label: "relay throughput", n: b.cfg.Messages, groups: roundRobin(hot, false)})
		}); err != nil {
			return err
		}
		sr.steadyRate = b.pace(res.thr.Rate)
		if res.lat, err = b.medianLatency(b.cfg.Repeat, func() (measure, error) {
			return b.measureRun(ctx, e, kids, runSpec{label: "relay latency", n: b.latencyCount(sr.steadyRate, b.cfg.Messages),
				rate: sr.steadyRate, keepLat: true, groups: roundRobin(hot, false)})
		}); err != nil {
			return err
		}
		sr.relay = res
		return nil
	}()
	stopErr := b.stopAll(kids)
	if runErr != nil {
		return runErr
	}
	return stopErr
}

// deleteCheckpointsAndFloor deletes every node's checkpoint and the
// routing floor from the registry bucket, if there is one.
func deleteCheckpointsAndFloor(ctx context.Context, js jetstream.JetStream) error {
	kv, err := js.KeyValue(ctx, kvbinding.DefaultNodesBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	keys, err := kv.ListKeysFiltered(ctx, kvbinding.CheckpointKey(">"), kvbinding.FloorKey)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer keys.Stop()
	var names []string
	for k := range keys.Keys() {
		names = append(names, k)
	}
	for _, k := range names {
		if err := kv.Delete(ctx, k); err != nil {
			return err
		}
	}
	return nil
}
