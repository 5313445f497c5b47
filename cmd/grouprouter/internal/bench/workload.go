package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Workload names (--workloads).
const (
	wlSteady      = "steady"
	wlCardinality = "cardinality"
	wlZipf        = "zipf"
	// wlHot: the steady state of a few hot groups (hotGroupCounts), each
	// with a backlog: what one group's order costs against the relay.
	wlHot = "hot"
)

// hotGroupCounts are the group counts of the hot workload's runs.
var hotGroupCounts = [...]int{1, 10}

// maxHotMessages bounds the messages of a hot throughput run (at most
// --messages): one group published one message per round trip runs at a
// few thousand a second.
const maxHotMessages = 20_000

// hotGroups returns the ids of the steady state's hot groups.
func hotGroups(tag string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "hot-" + tag + "-" + strconv.Itoa(i)
	}
	return out
}

// roundRobin cycles over groups; first marks every message as the first
// of its group (the warm-up run that creates the bindings).
func roundRobin(groups []string, first bool) groupFunc {
	return func(i int) (string, bool) { return groups[i%len(groups)], first }
}

// fresh gives every message a new group (decision throughput).
func fresh(prefix string) groupFunc {
	return func(i int) (string, bool) { return prefix + strconv.Itoa(i), true }
}

// zipfGroups draws groups from n distinct ids with a Zipf distribution of
// exponent s, remembering which groups it has produced already so that the
// first message of each is marked.
type zipfGroups struct {
	prefix string
	z      *rand.Zipf
	seen   []uint64 // bitmap over ranks
	fresh  int      // first messages produced by the last func
}

func newZipfGroups(prefix string, n int, s float64, seed uint64) *zipfGroups {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return &zipfGroups{prefix: prefix, z: rand.NewZipf(r, s, 1, uint64(n-1)), seen: make([]uint64, (n+63)/64)}
}

// next returns a groupFunc drawing count messages; it precomputes them so
// that drawing costs nothing while publishing.
func (zg *zipfGroups) next(count int) groupFunc {
	ids := make([]string, count)
	first := make([]bool, count)
	zg.fresh = 0
	for i := range ids {
		k := zg.z.Uint64()
		ids[i] = zg.prefix + strconv.FormatUint(k, 10)
		if zg.seen[k/64]&(1<<(k%64)) == 0 {
			zg.seen[k/64] |= 1 << (k % 64)
			first[i] = true
			zg.fresh++
		}
	}
	return func(i int) (string, bool) { return ids[i], first[i] }
}

// measure is what one run measured.
type measure struct {
	N        int           // messages
	Elapsed  time.Duration // first publish -> last message consumed
	Rate     float64       // messages/s end to end
	Paced    float64       // publish rate asked (0 = as fast as possible)
	NewGroup int           // messages that were the first of their group
	Binds    int64         // bindings created during the run (bind events)
	BindRate float64       // Binds / (last bind event - first publish)
	Lat      percentiles   // publish -> consume, all messages
	FirstLat percentiles   // publish -> consume, first message of a new group
	CPU      time.Duration // CPU time of the measured processes during the run
	SelfCPU  time.Duration // CPU time of this process (servers, producers, consumers) during the run
	Syscalls uint64        // read and write system calls of the measured processes during the run
	SelfSys  uint64        // the same of this process
	Routed   uint64        // messages republished by the measured processes
	Batches  uint64        // atomic batches they stored (router nodes)
	Batched  uint64        // messages in those batches
	BatchErr uint64        // atomic batches that failed
	Heap     uint64        // largest HeapInuse of a measured process at the end
	RSS      int64         // largest peak RSS of a measured process so far
	Foreign  float64       // share of the machine other processes used (-1: unknown)
}

// SelfCPUPerMsg returns this process's CPU time per message.
func (m measure) SelfCPUPerMsg() time.Duration {
	if m.N == 0 {
		return 0
	}
	return m.SelfCPU / time.Duration(m.N)
}

// perMsg returns n per message of the run (0 without messages).
func (m measure) perMsg(n uint64) float64 {
	if m.N == 0 {
		return 0
	}
	return float64(n) / float64(m.N)
}

// CPUPerMsg returns the measured processes' CPU time per message.
func (m measure) CPUPerMsg() time.Duration {
	if m.N == 0 {
		return 0
	}
	return m.CPU / time.Duration(m.N)
}

// runSpec describes one measured run.
type runSpec struct {
	label       string
	n           int
	rate        float64 // 0 = as fast as possible
	keepLat     bool
	groupPrefix string // bind events counted for groups with this prefix
	groups      groupFunc
	newGroups   int // first messages in groups (bindings to expect)
}

// measureRun publishes spec's messages, waits until the consumers got
// them all, and collects the figures; kids (may be nil) are the processes
// whose CPU and memory it measures.
func (b *bencher) measureRun(ctx context.Context, e *env, kids []*child, spec runSpec) (measure, error) {
	before, err := snapshots(ctx, kids)
	if err != nil {
		return measure{}, err
	}
	b.runID++
	watch := startCPUWatch()
	r := newRun(b.runID, spec.n, spec.keepLat, spec.groupPrefix)
	if spec.groupPrefix != "" {
		stop, err := e.sink.countBinds()
		if err != nil {
			return measure{}, fmt.Errorf("%s: %w", spec.label, err)
		}
		defer stop()
	}
	e.sink.cur.Store(r)
	defer e.sink.cur.Store(nil)
	start, err := e.prod.publish(ctx, benchSubject, r.id, spec.n, spec.rate, spec.groups)
	if err != nil {
		return measure{}, fmt.Errorf("%s: %w", spec.label, err)
	}
	progress := func() string {
		var parts []string
		for _, k := range kids {
			if rep, err := k.stats(ctx); err == nil {
				parts = append(parts, fmt.Sprintf("%s routed=%d skipped=%d held=%d position=%d decision_errors=%d publish_errors=%d",
					k.name, rep.Routed, rep.Skipped, rep.Held, rep.Position, rep.DecisionErrors, rep.PublishErrors))
			}
		}
		return strings.Join(parts, "; ")
	}
	if err := waitRun(ctx, r, 30*time.Second, progress); err != nil {
		return measure{}, fmt.Errorf("%s: %w", spec.label, err)
	}
	end := time.Unix(0, r.lastNano.Load())
	// Bind events travel apart from the messages: give the last ones a moment.
	deadline := time.Now().Add(2 * time.Second)
	for r.binds.Load() < int64(spec.newGroups) && spec.groupPrefix != "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	after, err := snapshots(ctx, kids)
	if err != nil {
		return measure{}, err
	}
	m := measure{N: spec.n, Elapsed: end.Sub(start), Paced: spec.rate, NewGroup: spec.newGroups, Binds: r.binds.Load()}
	if m.Elapsed > 0 {
		m.Rate = float64(m.N) / m.Elapsed.Seconds()
	}
	if m.Binds > 0 {
		if d := time.Unix(0, r.lastBind.Load()).Sub(start); d > 0 {
			m.BindRate = float64(m.Binds) / d.Seconds()
		}
	}
	r.mu.Lock()
	m.Lat, m.FirstLat = percentilesOf(r.lat), percentilesOf(r.firstLat)
	r.mu.Unlock()
	for i := range after {
		m.CPU += after[i].Usage.CPU() - before[i].Usage.CPU()
		m.Syscalls += after[i].Usage.Syscalls - before[i].Usage.Syscalls
		m.Routed += after[i].Routed - before[i].Routed
		m.Batches += after[i].Batches - before[i].Batches
		m.Batched += after[i].Batched - before[i].Batched
		m.BatchErr += after[i].BatchFailures - before[i].BatchFailures
		m.Heap = max(m.Heap, after[i].HeapInuse)
		m.RSS = max(m.RSS, after[i].Usage.MaxRSS)
	}
	m.SelfCPU = selfUsage().CPU() - watch.self
	m.SelfSys = ioSyscalls() - watch.syscalls
	m.Foreign = watch.foreign(m.CPU, runtime.NumCPU())
	b.noteForeign(m.Foreign)
	b.logf("%-28s %7d msgs in %6.2fs = %8.0f msgs/s%s%s%s", spec.label, m.N, m.Elapsed.Seconds(), m.Rate,
		func() string {
			if m.Binds == 0 {
				return ""
			}
			return fmt.Sprintf(", %d bindings at %.0f/s", m.Binds, m.BindRate)
		}(),
		func() string {
			if !spec.keepLat {
				return ""
			}
			return fmt.Sprintf(", p50 %v p99 %v", m.Lat.P50.Round(time.Microsecond), m.Lat.P99.Round(time.Microsecond))
		}(),
		noiseNote(m.Foreign))
	return m, nil
}

func snapshots(ctx context.Context, kids []*child) ([]report, error) {
	out := make([]report, len(kids))
	for i, k := range kids {
		rep, err := k.stats(ctx)
		if err != nil {
			return nil, err
		}
		out[i] = rep
	}
	return out, nil
}
