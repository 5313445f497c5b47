package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/localnats"
)

// TestMain lets the test binary stand in for the grouprouter command:
// "<test binary> bench-node ..." runs a benchmark child (how TestMainRuns
// starts its router nodes), and "<test binary> bench ..." runs the whole
// benchmark (go test -c -o /tmp/bench.test ./internal/bench &&
// GROUPROUTER_BENCH_CHILD="/tmp/bench.test bench-node" /tmp/bench.test bench).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		var run func(context.Context, []string, *os.File, *os.File) error
		switch os.Args[1] {
		case "bench-node":
			run = func(ctx context.Context, a []string, o, e *os.File) error { return NodeMain(ctx, a, o, e) }
		case "bench":
			run = func(ctx context.Context, a []string, o, e *os.File) error { return Main(ctx, a, o, e) }
		}
		if run != nil {
			// The signal handlers stay installed until the process exits.
			ctx, _ := signal.NotifyContext(context.Background(), stopSignals...)
			err := run(ctx, os.Args[2:], os.Stdout, os.Stderr)
			if err != nil {
				fmt.Fprintln(os.Stderr, "error:", err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

// selfAsChild makes Main start this test binary as its child processes.
func selfAsChild(t *testing.T) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(ChildEnv, exe+" bench-node")
}

// TestMainRuns runs the real command, child processes included, at tiny
// sizes, and checks that every figure is there and plausible.
func TestMainRuns(t *testing.T) {
	selfAsChild(t)
	res, errOut := runJSON(t, "--servers", "1", "--messages", "2000", "--decisions", "1000", "--creates", "1000", "--groups", "100",
		"--warm-start", "2000", "--latency-duration", "500ms", "--zipf-groups", "10000")
	seen := map[string]Row{}
	for _, r := range res.Rows {
		seen[fmt.Sprintf("%s/%d/%s", r.Workload, r.Nodes, strings.SplitN(r.Metric, " @", 2)[0])] = r
	}
	for _, key := range []string{
		"steady/1/end-to-end", "steady/1/latency p99", "steady/1/router CPU per msg (all nodes)", "steady/3/end-to-end",
		"cardinality/1/end-to-end", "cardinality/1/decisions/s end to end", "cardinality/1/decisions/s, decision service alone", "cardinality/1/decision latency p99",
		"zipf/1/end-to-end", "zipf/1/decisions/s", "zipf/1/latency p99.9",
		"baseline/0/relay end-to-end", "baseline/0/raw JetStream async publish",
		"baseline/0/KV create pipelined (1000)", "baseline/0/KV create 32 goroutines (1000)", "baseline/0/KV create pipelined, watched (1000)",
		"cardinality/1/decision service vs watched KV creates",
		"steady/1/end-to-end vs write ceiling", "baseline/0/write ceiling (raw publish / 2)",
		"steady/2/CPU per ingress msg, node routing all (n0)", "steady/2/CPU per ingress msg, node skipping all (n1)",
		"warm-start/1/heap per cached binding (at 2,000)",
		"hot/1/1 group(s) end-to-end", "hot/1/10 group(s) end-to-end",
	} {
		r, ok := seen[key]
		if !ok {
			t.Errorf("no row %q", key)
			continue
		}
		if r.Value <= 0 {
			t.Errorf("row %q: value %v", key, r.Value)
		}
	}
	if r := seen["steady/1/end-to-end"]; r.BaselineName != "relay" || r.Ratio <= 0 || r.Met == nil {
		t.Errorf("steady row has no relay ratio and target: %+v", r)
	}
	if r := seen["cardinality/1/decision service vs watched KV creates"]; r.Ratio <= 0 || r.Met == nil {
		t.Errorf("decisions row has no watched-KV ratio and target: %+v", r)
	}
	if r := seen["steady/1/end-to-end vs write ceiling"]; r.BaselineName != "ceiling" || r.Ratio <= 0 || r.Met == nil {
		t.Errorf("steady row has no write-ceiling ratio and target: %+v", r)
	}
	for _, k := range []string{"hot/1/1 group(s) end-to-end", "hot/1/10 group(s) end-to-end"} {
		if r := seen[k]; r.BaselineName != "relay" || r.Ratio <= 0 {
			t.Errorf("%s has no relay ratio: %+v", k, r)
		}
	}
	// No fault, no alarm: an error logged here teaches an operator to
	// ignore the real one (the routing floor left between phases once had
	// every fresh node report the purged ingress as gone).
	for _, line := range strings.Split(errOut.String(), "\n") {
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("error logged by a run without faults: %s", line)
		}
	}
	if t.Failed() {
		t.Logf("stderr:\n%s", errOut.String())
	}
}

// runJSON runs the bench with args and --json, and returns its result
// and what it wrote on stderr.
func runJSON(t *testing.T, args ...string) (Result, *bytes.Buffer) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := Main(ctx, append([]string{"--json"}, args...), &out, &errOut); err != nil {
		t.Fatalf("Main: %v\nstderr:\n%s", err, errOut.String())
	}
	var res Result
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out.String())
	}
	return res, &errOut
}

// TestFloodWorkload: the flood workload runs and reports the bound
// group's latency beside its own baseline and the node's peak RSS
// against the documented bound.
func TestFloodWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts NATS and a router node, ~15 s")
	}
	res, errOut := runJSON(t, "--servers", "1", "--workloads", "flood", "--flood", "5000", "--scaling=false", "--warm-start", "0",
		"--messages", "2000", "--creates", "1000", "--latency-duration", "500ms")
	seen := map[string]Row{}
	for _, r := range res.Rows {
		seen[r.Metric] = r
	}
	for _, k := range []string{"bound group's latency p50 during the flood", "bound group's latency p99 during the flood"} {
		if r := seen[k]; r.BaselineName != "alone" || r.Ratio <= 0 || r.Met == nil {
			t.Errorf("%s: %+v", k, r)
		}
	}
	if r := seen["node peak RSS"]; r.Value <= 0 || r.Met == nil || r.Target == "" {
		t.Errorf("RSS row: %+v", r)
	}
	if t.Failed() {
		t.Logf("stderr:\n%s", errOut.String())
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		ok   bool
	}{
		{"defaults", nil, true},
		{"one set-up", []string{"--servers", "3"}, true},
		{"bad servers", []string{"--servers", "2"}, false},
		{"bad workload", []string{"--workloads", "steady,storm"}, false},
		{"burst workload", []string{"--workloads", "burst", "--burst", "1000"}, true},
		{"empty burst", []string{"--workloads", "burst", "--burst", "0"}, false},
		{"flood workload", []string{"--workloads", "flood", "--flood", "1000"}, true},
		{"empty flood", []string{"--workloads", "flood", "--flood", "0"}, false},
		{"tiny payload", []string{"--payload", "4"}, false},
		{"zipf exponent", []string{"--zipf-s", "1"}, false},
		{"stray argument", []string{"extra"}, false},
		{"no producer", []string{"--producers", "0"}, false},
		{"sync always", []string{"--sync", "always"}, true},
		{"sync interval", []string{"--sync", "1s"}, true},
		{"bad sync", []string{"--sync", "never"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			c, err := parseFlags(tt.args, &stderr, &stderr)
			if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrUsage)) {
				t.Fatalf("parseFlags(%v) = %+v, %v", tt.args, c, err)
			}
			if tt.name == "defaults" && (len(c.Servers) != 2 || c.Nodes != 1 || c.Payload != 1024 || c.WarmStart != 200_000 || len(c.Workloads) != 4) {
				t.Fatalf("defaults = %+v", c)
			}
			if tt.name == "defaults" && c.Sync != (localnats.Sync{Interval: localnats.ServerDefaultSync}) {
				t.Fatalf("default sync %v, want nats-server's own (2m)", c.Sync)
			}
			if tt.name == "sync always" && !c.Sync.Always {
				t.Fatalf("--sync always gave %v", c.Sync)
			}
		})
	}
}

func TestPercentiles(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 1000; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	p := percentilesOf(ds)
	if p.P50 != 500*time.Millisecond || p.P99 != 990*time.Millisecond || p.P999 != 999*time.Millisecond || p.M != time.Second {
		t.Fatalf("percentiles = %+v", p)
	}
	if (percentilesOf(nil) != percentiles{}) {
		t.Fatal("empty sample")
	}
}

func TestZipfMarksFirstMessages(t *testing.T) {
	zg := newZipfGroups("z-", 1000, 1.1, 1)
	gf := zg.next(5000)
	seen := map[string]bool{}
	firsts := 0
	for i := 0; i < 5000; i++ {
		g, first := gf(i)
		if first == seen[g] {
			t.Fatalf("message %d group %s: first=%v, seen before=%v", i, g, first, seen[g])
		}
		if first {
			firsts++
		}
		seen[g] = true
	}
	if firsts != zg.fresh || firsts == 0 || firsts >= 1000 {
		t.Fatalf("%d first messages, fresh=%d", firsts, zg.fresh)
	}
}
