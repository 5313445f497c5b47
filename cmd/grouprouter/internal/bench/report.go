package bench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Result is the whole benchmark outcome (the --json output).
type Result struct {
	Command    string  `json:"command"`
	Machine    Machine `json:"machine"`
	Sizes      Sizes   `json:"sizes"`
	Rows       []Row   `json:"rows"`
	ElapsedSec float64 `json:"elapsed_s"`
}

// Machine describes where the benchmark ran.
type Machine struct {
	CPU    string `json:"cpu"`
	CPUs   int    `json:"cpus"`
	OS     string `json:"os"`
	Arch   string `json:"arch"`
	Go     string `json:"go"`
	Layout string `json:"layout"`
}

// Sizes are the run sizes used.
type Sizes struct {
	Servers         []int   `json:"servers"`
	Nodes           int     `json:"nodes"`
	Messages        int     `json:"messages"`
	Decisions       int     `json:"decisions"` // cardinality and zipf runs
	Creates         int     `json:"creates"`   // decision service runs, KV creates
	HotGroups       int     `json:"hot_groups"`
	PayloadBytes    int     `json:"payload_bytes"`
	ZipfGroups      int     `json:"zipf_groups"`
	ZipfS           float64 `json:"zipf_s"`
	LatencyRunSec   float64 `json:"latency_run_s"`
	Repeat          int     `json:"repeat"`
	LatencyRate     float64 `json:"latency_rate,omitempty"` // --rate; 0 = half of each measured peak
	WarmStart       int     `json:"warm_start"`
	Workloads       string  `json:"workloads"`
	QueueConsumers  string  `json:"queue_consumers"`
	Producers       int     `json:"producers"`
	ProducerPending int     `json:"producer_max_pending"`
	Sync            string  `json:"sync"` // the servers' fsync policy (--sync)
}

func (s Sizes) String() string {
	rate := "half of the relay's peak (other node counts: half their own)"
	if s.LatencyRate > 0 {
		rate = fmt.Sprintf("%.0f msgs/s", s.LatencyRate)
	}
	return fmt.Sprintf("servers=%v nodes=%d (+3 for steady) messages=%d decisions(cardinality,zipf)=%d creates(decision service, KV)=%d hot-groups=%d payload=%dB zipf=%d groups s=%.2f "+
		"latency runs=%gs at %s repeat=%d (median) warm-start=%d workloads=%s producers=%d sync=%s",
		s.Servers, s.Nodes, s.Messages, s.Decisions, s.Creates, s.HotGroups, s.PayloadBytes, s.ZipfGroups, s.ZipfS,
		s.LatencyRunSec, rate, s.Repeat, s.WarmStart, s.Workloads, s.Producers, s.Sync)
}

func (b *bencher) sizes() Sizes {
	return Sizes{Servers: b.cfg.Servers, Nodes: b.cfg.Nodes, Messages: b.cfg.Messages, Decisions: b.cfg.Decisions, Creates: b.cfg.Creates,
		HotGroups: b.cfg.Groups, PayloadBytes: b.cfg.Payload, ZipfGroups: b.cfg.ZipfGroups, ZipfS: b.cfg.ZipfS,
		LatencyRunSec: b.cfg.LatencyFor.Seconds(), Repeat: b.cfg.Repeat, LatencyRate: b.cfg.Rate, WarmStart: b.cfg.WarmStart,
		Workloads: strings.Join(b.cfg.Workloads, ","), QueueConsumers: "one per node, priority group, ack each",
		Producers: b.cfg.Producers, ProducerPending: 4000, Sync: b.cfg.Sync.String()}
}

func machineInfo() Machine {
	m := Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH, Go: runtime.Version(),
		Layout: "NATS servers, producer and consumers in the bench process; each router node and the relay in its own child process"}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	return m
}

// Row is one measurement.
type Row struct {
	Workload string  `json:"workload"`
	Servers  int     `json:"servers"`
	Nodes    int     `json:"nodes"`
	Metric   string  `json:"metric"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	// Baseline is the value of the same metric for BaselineName (0: none).
	Baseline     float64 `json:"baseline,omitempty"`
	BaselineName string  `json:"baseline_name,omitempty"`
	Ratio        float64 `json:"ratio,omitempty"` // Value / Baseline
	Target       string  `json:"target,omitempty"`
	Met          *bool   `json:"met,omitempty"`
	// OtherCPU is the largest share (percent) of the machine that other
	// processes used while this figure or its baseline was measured: the
	// benchmark shares its cores, and a busy neighbour skews a figure.
	OtherCPU *float64 `json:"other_cpu_pct,omitempty"`
}

// noise records that other processes took foreign (0..1, <0 unknown) of
// the machine while the row's figures were measured.
func (r *Row) noise(foreign float64) *Row {
	if foreign < 0 {
		return r
	}
	pct := 100 * foreign
	if r.OtherCPU == nil || pct > *r.OtherCPU {
		r.OtherCPU = &pct
	}
	return r
}

// Units.
const (
	unitMsgs      = "msgs/s"
	unitDecisions = "decisions/s"
	unitCreates   = "creates/s"
	unitWrites    = "writes/s"
	unitMs        = "ms"
	unitUsPerMsg  = "µs/msg"
	unitPerMsg    = "/msg"
	unitPerBatch  = "msgs/batch"
	unitMiB       = "MiB"
	unitBytes     = "B/binding"
	unitSec       = "s"
	unitCount     = ""
	unitPercent   = "%"
)

func (r Row) valueString() string { return formatValue(r.Value, r.Unit) }
func (r Row) baseString() string {
	if r.BaselineName == "" {
		return ""
	}
	return formatValue(r.Baseline, r.Unit) + " " + r.BaselineName
}

func formatValue(v float64, unit string) string {
	var s string
	switch unit {
	case unitMsgs, unitDecisions, unitCreates, unitWrites, unitCount:
		s = thousands(int64(math.Round(v)))
	case unitMs, unitUsPerMsg, unitSec, unitPerMsg, unitPerBatch:
		switch {
		case v >= 100:
			s = strconv.FormatFloat(v, 'f', 0, 64)
		case v >= 10:
			s = strconv.FormatFloat(v, 'f', 1, 64)
		default:
			s = strconv.FormatFloat(v, 'f', 2, 64)
		}
	default:
		s = strconv.FormatFloat(v, 'f', 1, 64)
	}
	if unit == "" {
		return s
	}
	return s + " " + unit
}

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

func (res Result) writeTable(w io.Writer) error {
	fmt.Fprintf(w, "grouprouter bench — %s, %d CPUs, %s/%s, %s\n", res.Machine.CPU, res.Machine.CPUs, res.Machine.OS, res.Machine.Arch, res.Machine.Go)
	fmt.Fprintf(w, "layout: %s\n", res.Machine.Layout)
	fmt.Fprintf(w, "sizes: %s\n\n", res.Sizes)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKLOAD\tSERVERS\tNODES\tMETRIC\tVALUE\tBASELINE\tRATIO\tTARGET\tMET\tOTHER CPU")
	for _, r := range res.Rows {
		ratio, met := "", ""
		if r.Ratio != 0 {
			ratio = strconv.FormatFloat(r.Ratio, 'f', 2, 64) + "x"
		}
		if r.Met != nil {
			met = "no"
			if *r.Met {
				met = "yes"
			}
		}
		nodes := strconv.Itoa(r.Nodes)
		if r.Nodes == 0 {
			nodes = "-"
		}
		other := ""
		if r.OtherCPU != nil {
			other = strconv.FormatFloat(*r.OtherCPU, 'f', 0, 64) + "%"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Workload, r.Servers, nodes, r.Metric,
			r.valueString(), r.baseString(), ratio, r.Target, met, other)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nOTHER CPU: share of the machine other processes used while the figure (or its baseline) was measured.\ntotal %.0fs\n", res.ElapsedSec)
	return err
}

// rowBuilder adds rows for one set-up.
type rowBuilder struct {
	servers int
	rows    []Row
}

func (rb *rowBuilder) add(wl string, nodes int, metric string, v float64, unit string) *Row {
	rb.rows = append(rb.rows, Row{Workload: wl, Servers: rb.servers, Nodes: nodes, Metric: metric, Value: v, Unit: unit})
	return &rb.rows[len(rb.rows)-1]
}

// vs sets the baseline and ratio.
func (r *Row) vs(name string, base float64) *Row {
	r.BaselineName, r.Baseline = name, base
	if base != 0 {
		r.Ratio = r.Value / base
	}
	return r
}

// atLeast marks the row met when ratio >= x.
func (r *Row) atLeast(x float64) *Row {
	r.Target = ">= " + strconv.FormatFloat(x, 'f', -1, 64) + "x"
	met := r.Ratio >= x
	r.Met = &met
	return r
}

// atMost marks the row met when ratio <= x.
func (r *Row) atMost(x float64) *Row {
	r.Target = "<= " + strconv.FormatFloat(x, 'f', -1, 64) + "x"
	met := r.Ratio != 0 && r.Ratio <= x
	r.Met = &met
	return r
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func mib(b float64) float64      { return b / (1 << 20) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// rows turns one set-up's measurements into rows. A row's OtherCPU is the
// most other processes took of the machine during its run or its
// baseline's.
func (sr *serverResults) rows(cfg config) []Row {
	rb := &rowBuilder{servers: sr.servers}
	relay := sr.relay
	at := func(rate float64) string { return "@" + thousands(int64(math.Round(rate))) + "/s" }
	latRows := func(wl string, nodes int, what string, m measure, first bool, base *measure, withTarget bool) {
		p := m.Lat
		if first {
			p = m.FirstLat
		}
		for _, q := range []struct {
			name string
			of   func(percentiles) time.Duration
		}{{"p50", func(x percentiles) time.Duration { return x.P50 }},
			{"p99", func(x percentiles) time.Duration { return x.P99 }},
			{"p99.9", func(x percentiles) time.Duration { return x.P999 }}} {
			r := rb.add(wl, nodes, fmt.Sprintf("%s %s %s", what, q.name, at(m.Paced)), ms(q.of(p)), unitMs).noise(m.Foreign)
			if base != nil && base.Lat.N > 0 && base.Paced == m.Paced {
				r.vs("relay", ms(q.of(base.Lat))).noise(base.Foreign)
				if withTarget && q.name == "p99" {
					r.Target = "<= relay+2ms"
					met := q.of(p) <= q.of(base.Lat)+2*time.Millisecond
					r.Met = &met
				}
			}
		}
	}
	var relayLat *measure
	if relay != nil {
		relayLat = &relay.lat
	}
	ceiling := sr.raw.V / 2 // every routed message is written twice: ingress and queue
	common := func(wl string, nodes int, res *wlResult) {
		thr := res.thr
		r := rb.add(wl, nodes, "end-to-end", thr.Rate, unitMsgs).noise(thr.Foreign)
		if relay != nil {
			r.vs("relay", relay.thr.Rate).noise(relay.thr.Foreign)
			if wl == wlSteady && nodes == 1 {
				r.atLeast(0.95)
			}
			if wl == wlSteady && nodes == 3 {
				r.atLeast(0.8)
			}
		}
		if wl == wlSteady && ceiling > 0 {
			r := rb.add(wl, nodes, "end-to-end vs write ceiling", thr.Rate, unitMsgs).noise(thr.Foreign).vs("ceiling", ceiling).noise(sr.raw.Foreign)
			if nodes == 1 && sr.servers == 1 {
				r.atLeast(0.6)
			}
		}
		type memFig struct {
			metric string
			v      func(measure) float64
			unit   string
		}
		for _, f := range []memFig{
			{"router CPU per msg (all nodes)", func(m measure) float64 { return us(m.CPUPerMsg()) }, unitUsPerMsg},
			{"servers+load CPU per msg (bench process)", func(m measure) float64 { return us(m.SelfCPUPerMsg()) }, unitUsPerMsg},
			{"router read+write syscalls per msg (all nodes)", func(m measure) float64 { return m.perMsg(m.Syscalls) }, unitPerMsg},
			{"servers+load read+write syscalls per msg (bench process)", func(m measure) float64 { return m.perMsg(m.SelfSys) }, unitPerMsg},
			{"router heap in use (max node)", func(m measure) float64 { return mib(float64(m.Heap)) }, unitMiB},
			{"router max RSS (max node)", func(m measure) float64 { return mib(float64(m.RSS)) }, unitMiB},
		} {
			r := rb.add(wl, nodes, f.metric, f.v(thr), f.unit).noise(thr.Foreign)
			if relay != nil {
				r.vs("relay", f.v(relay.thr)).noise(relay.thr.Foreign)
			}
		}
	}
	kvBest, kvName := sr.kvPipe, "kv-pipelined"
	if sr.kvConc.V > kvBest.V {
		kvBest, kvName = sr.kvConc, "kv-32-goroutines"
	}
	for _, wl := range cfg.Workloads {
		res := sr.wl[wl]
		if res == nil {
			continue
		}
		n := sr.nodes
		if wl == wlHot {
			for _, h := range res.hot {
				r := rb.add(wl, n, fmt.Sprintf("%d group(s) end-to-end", h.groups), h.thr.Rate, unitMsgs).noise(h.thr.Foreign)
				if relay == nil {
					continue
				}
				r.vs("relay", relay.thr.Rate).noise(relay.thr.Foreign)
				if sr.servers >= 3 { // the targets are on replicated streams
					switch h.groups {
					case 1:
						r.atLeast(0.5)
					case 10:
						r.atLeast(0.8)
					}
				}
				rb.add(wl, n, fmt.Sprintf("%d group(s) router CPU per msg (all nodes)", h.groups), us(h.thr.CPUPerMsg()), unitUsPerMsg).
					noise(h.thr.Foreign).vs("relay", us(relay.thr.CPUPerMsg())).noise(relay.thr.Foreign)
				rb.add(wl, n, fmt.Sprintf("%d group(s) servers+load CPU per msg (bench process)", h.groups), us(h.thr.SelfCPUPerMsg()), unitUsPerMsg).
					noise(h.thr.Foreign).vs("relay", us(relay.thr.SelfCPUPerMsg())).noise(relay.thr.Foreign)
				if t := h.thr; t.Batches > 0 {
					// How the backlog went: the mean stored batch, and the
					// share of the messages that went in one.
					kind := "atomic" // replicated queue stream
					if sr.servers < 2 {
						kind = "fast-ingest" // R1
					}
					rb.add(wl, n, fmt.Sprintf("%d group(s) mean %s batch (%.0f%% of msgs batched, %d batches failed)",
						h.groups, kind, 100*float64(t.Batched)/float64(max(t.Routed, 1)), t.BatchErr),
						float64(t.Batched)/float64(t.Batches), unitPerBatch)
				}
			}
			continue
		}
		common(wl, n, res)
		switch wl {
		case wlSteady:
			latRows(wl, n, "latency", res.lat, false, relayLat, sr.servers >= 3) // the target is on replicated streams
		case wlCardinality:
			rb.add(wl, n, "decisions/s end to end", res.thr.BindRate, unitDecisions).noise(res.thr.Foreign).vs(kvName, kvBest.V).noise(kvBest.Foreign)
			rb.add(wl, n, "decision service vs watched KV creates", res.svc.V, unitDecisions).noise(res.svc.Foreign).vs("kv-watched", sr.kvWatched.V).noise(sr.kvWatched.Foreign).atLeast(0.9)
			rb.add(wl, n, "decisions/s, decision service alone", res.svc.V, unitDecisions).noise(res.svc.Foreign).vs(kvName, kvBest.V).noise(kvBest.Foreign)
			if res.svcNoEvents.V > 0 {
				rb.add(wl, n, "decision service, bind events not stored, vs watched KV creates", res.svcNoEvents.V, unitDecisions).noise(res.svcNoEvents.Foreign).vs("kv-watched", sr.kvWatched.V).noise(sr.kvWatched.Foreign)
			}
			latRows(wl, n, "decision latency", res.lat, true, nil, false)
		case wlZipf:
			rb.add(wl, n, "new groups in run", float64(res.thr.NewGroup), unitCount)
			rb.add(wl, n, "decisions/s", res.thr.BindRate, unitDecisions).noise(res.thr.Foreign).vs(kvName, kvBest.V).noise(kvBest.Foreign)
			latRows(wl, n, "latency", res.lat, false, nil, false)
			if relay != nil && relay.lat.Lat.N > 0 && res.lat.Lat.N > 0 {
				// A hot group's latency against the relay's paced run: the
				// zipf run is paced at half its own peak, the relay's at half
				// the relay's, so the two rates differ (both in the rows).
				r := rb.add(wl, n, "latency p99 "+at(res.lat.Paced)+" vs the relay's paced p99", ms(res.lat.Lat.P99), unitMs).
					noise(res.lat.Foreign).vs("relay "+at(relay.lat.Paced), ms(relay.lat.Lat.P99)).noise(relay.lat.Foreign)
				if sr.servers >= 3 { // the target is on replicated streams
					r.atMost(2)
				}
			}
			latRows(wl, n, "decision latency", res.lat, true, nil, false)
		}
	}
	sr.burstRows(rb)
	sr.floodRows(rb)
	sr.busyRows(rb)
	if s3 := sr.steady3; s3 != nil {
		common(wlSteady, 3, s3)
		latRows(wlSteady, 3, "latency", s3.lat, false, relayLat, false)
	}
	if sk := sr.skip; sk != nil {
		rb.add(wlSteady, 2, "CPU per ingress msg, node routing all (n0)", us(sk.routeCPU), unitUsPerMsg).noise(sk.thr.Foreign)
		rb.add(wlSteady, 2, "CPU per ingress msg, node skipping all (n1)", us(sk.skipCPU), unitUsPerMsg).noise(sk.thr.Foreign).vs("routing", us(sk.routeCPU))
	}
	if relay != nil {
		rb.add("baseline", 0, "relay end-to-end", relay.thr.Rate, unitMsgs).noise(relay.thr.Foreign).vs("ceiling", ceiling).noise(sr.raw.Foreign)
		latRows("baseline", 0, "relay latency", relay.lat, false, nil, false)
		rb.add("baseline", 0, "relay CPU per msg", us(relay.thr.CPUPerMsg()), unitUsPerMsg).noise(relay.thr.Foreign)
		rb.add("baseline", 0, "relay max RSS", mib(float64(relay.thr.RSS)), unitMiB).noise(relay.thr.Foreign)
	}
	rb.add("baseline", 0, "raw JetStream async publish", sr.raw.V, unitMsgs).noise(sr.raw.Foreign)
	rb.add("baseline", 0, "raw publish CPU per msg (bench process)", us(sr.rawCPU), unitUsPerMsg).noise(sr.raw.Foreign)
	rb.add("baseline", 0, "write ceiling (raw publish / 2)", ceiling, unitMsgs).noise(sr.raw.Foreign)
	rb.add("baseline", 0, fmt.Sprintf("KV create pipelined (%d)", sr.kvN), sr.kvPipe.V, unitCreates).noise(sr.kvPipe.Foreign)
	rb.add("baseline", 0, fmt.Sprintf("KV create 32 goroutines (%d)", sr.kvConcN), sr.kvConc.V, unitCreates).noise(sr.kvConc.Foreign)
	rb.add("baseline", 0, fmt.Sprintf("KV create pipelined, watched (%d)", sr.kvN), sr.kvWatched.V, unitCreates).noise(sr.kvWatched.Foreign)
	if w := sr.warm; w != nil {
		rb.add("warm-start", 1, "bindings written (async KV publish)", w.fillRate, unitWrites)
		rb.add("warm-start", 1, fmt.Sprintf("cache warm start, %s bindings", thousands(int64(w.count))), w.load.Seconds(), unitSec).noise(w.foreign)
		per1M := w.load.Seconds() * 1e6 / float64(w.count)
		r := rb.add("warm-start", 1, "cache warm start per 1M bindings", per1M, unitSec).noise(w.foreign)
		if w.count < 1_000_000 {
			r.Metric += " (extrapolated)"
		}
		r.Target = "< 10 s"
		fast := per1M < 10
		r.Met = &fast
		bpb := float64(w.heapDelta) / float64(w.count)
		r = rb.add("warm-start", 1, fmt.Sprintf("heap per cached binding (at %s)", thousands(int64(w.count))), bpb, unitBytes)
		r.Target = "<= 200 B"
		small := bpb <= 200
		r.Met = &small
		rb.add("warm-start", 1, "warm-start process max RSS", mib(float64(w.rss)), unitMiB)
	}
	return rb.rows
}
