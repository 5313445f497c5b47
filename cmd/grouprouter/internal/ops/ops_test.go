package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// opsNode is a router node with its operator endpoints on a real HTTP
// listener.
type opsNode struct {
	id     string
	r      *router.Router
	url    string // base URL of its HTTP server
	cancel context.CancelFunc
	done   chan error
}

func testConfig(node string, typ router.HandlerType) router.Config {
	cfg := router.Config{
		Name: "h", Type: typ, Address: "jms", Timeout: time.Second, Node: node,
		Heartbeat: 100 * time.Millisecond, LeaseTTL: time.Second, CheckpointInterval: 200 * time.Millisecond,
		PinnedTTL: time.Second,
	}
	if os.Getenv("GROUPROUTER_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return cfg
}

// newOpsNode creates a node and serves its endpoints, without running it.
func newOpsNode(t *testing.T, s *natstest.Server, cfg router.Config) *opsNode {
	t.Helper()
	nc := s.Connect()
	reg := prometheus.NewRegistry()
	cfg.Metrics = reg
	r, err := router.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Node: r, Gatherer: reg, Conn: nc, Logger: cfg.Logger})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	ctx, stopOps := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = srv.Run(ctx) }()
	n := &opsNode{id: cfg.Node, r: r, url: hs.URL, cancel: func() {}}
	t.Cleanup(func() {
		n.stop(t)
		stopOps()
		<-runDone
		hs.Close()
	})
	return n
}

// run starts the node and waits until it is ready.
func (n *opsNode) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan error, 1)
	go func() { n.done <- n.r.Run(ctx) }()
	select {
	case <-n.r.Ready():
	case err := <-n.done:
		t.Fatalf("node %s stopped while starting: %v", n.id, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("node %s not ready", n.id)
	}
}

func (n *opsNode) stop(t *testing.T) {
	n.cancel()
	if n.done != nil {
		if err := <-n.done; err != nil {
			t.Errorf("node %s: %v", n.id, err)
		}
		n.done = nil
	}
}

// get requests path and returns the status code and body.
func (n *opsNode) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(n.url + path)
	if err != nil {
		t.Fatalf("GET %s%s: %v", n.id, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// metrics scrapes the node's /metrics and parses the text format.
type metrics map[string]*dto.MetricFamily

func (n *opsNode) scrape(t *testing.T) metrics {
	t.Helper()
	code, body := n.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, body)
	}
	return mfs
}

// matches reports whether m has the given label values (name, value pairs).
func matches(m *dto.Metric, labels ...string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// value returns the value of the counter or gauge name with the labels,
// and whether it is there.
func (ms metrics) value(name string, labels ...string) (float64, bool) {
	mf := ms[name]
	if mf == nil {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		if !matches(m, labels...) {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// must returns value's value, failing the test when the metric is missing.
func (ms metrics) must(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, ok := ms.value(name, labels...)
	if !ok {
		t.Fatalf("metric %s%v missing", name, labels)
	}
	return v
}

// histogramCount returns the sample count of histogram name.
func (ms metrics) histogramCount(name string) uint64 {
	if mf := ms[name]; mf != nil && mf.GetType() == dto.MetricType_HISTOGRAM && len(mf.GetMetric()) == 1 {
		return mf.GetMetric()[0].GetHistogram().GetSampleCount()
	}
	return 0
}

func publish(t *testing.T, js jetstream.JetStream, group string, n int) {
	t.Helper()
	for i := range n {
		m := nats.NewMsg("jms.orders")
		m.Header.Set("Group-Id", group)
		m.Data = fmt.Appendf(nil, "%s-%d", group, i)
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOperatorEndpoints runs a REMOTE node and then a LOCAL one, each with
// its endpoints on a real HTTP listener, and checks what an operator
// reads there: readiness before and after start, metrics (scraped and
// parsed) against what was published, decided and moved, and the status
// page.
func TestOperatorEndpoints(t *testing.T) {
	s := natstest.RunServer(t)
	js, err := jetstream.New(s.Connect())
	if err != nil {
		t.Fatal(err)
	}

	// A LOCAL node creates the streams and buckets (a REMOTE node does
	// not), then goes away.
	setup := newOpsNode(t, s, testConfig("n0", router.Local))
	setup.run(t)
	setup.stop(t)

	// A node not started yet: alive, not ready, metrics say so.
	n1 := newOpsNode(t, s, testConfig("n1", router.Remote))
	if code, body := n1.get(t, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz before start: %d %q", code, body)
	}
	code, body := n1.get(t, "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") || strings.Count(body, "\n") != 1 {
		t.Errorf("/readyz before start: %d %q, want 503 and one line saying it is starting", code, body)
	}
	if m := n1.scrape(t); m.must(t, "grouprouter_ready") != 0 || m.must(t, "grouprouter_node_info", "node", "n1", "type", "REMOTE") != 1 {
		t.Errorf("metrics before start: ready %v", m.must(t, "grouprouter_ready"))
	}
	if code, body := n1.get(t, "/"); code != http.StatusOK || !strings.Contains(body, "not ready: ") {
		t.Errorf("status page before start: %d, not saying it is not ready:\n%s", code, body)
	}

	n1.run(t)
	natstest.Eventually(t, 10*time.Second, func() error {
		if code, body := n1.get(t, "/readyz"); code != http.StatusOK || body != "ready\n" {
			return fmt.Errorf("/readyz: %d %q", code, body)
		}
		return nil
	})

	// No LOCAL handler yet: the group's messages are held, its proposals
	// find no handler.
	publish(t, js, "g1", 5)
	natstest.Eventually(t, 10*time.Second, func() error {
		m := n1.scrape(t)
		held, _ := m.value("grouprouter_held_messages")
		bytes, _ := m.value("grouprouter_held_bytes")
		noHandler, _ := m.value("grouprouter_proposal_failures_total", "reason", "no_handler")
		if held != 5 || bytes < 5*float64(len("jms.orders")) || noHandler < 1 {
			return fmt.Errorf("held %v messages (%v bytes), %v proposals without handler", held, bytes, noHandler)
		}
		return nil
	})
	if m := n1.scrape(t); m["grouprouter_handler_active"] != nil || m["grouprouter_decisions_total"] != nil {
		t.Error("a REMOTE node exports handler metrics")
	}

	// The LOCAL node: the group is decided and routed.
	n0 := newOpsNode(t, s, testConfig("n0", router.Local))
	n0.run(t)
	nodes := []*opsNode{n0, n1}
	sum := func(name string, labels ...string) float64 {
		total := 0.0
		for _, n := range nodes {
			v, _ := n.scrape(t).value(name, labels...)
			total += v
		}
		return total
	}
	natstest.Eventually(t, 20*time.Second, func() error {
		if routed, held := sum("grouprouter_messages_routed_total"), sum("grouprouter_held_messages"); routed != 5 || held != 0 {
			return fmt.Errorf("routed %v, held %v; want 5 routed, none held", routed, held)
		}
		return nil
	})
	m0 := n0.scrape(t)
	// One server: the queue stream is R1, where a group's backlog goes in
	// fast-ingest batches.
	if v := m0.must(t, "grouprouter_queue_max_batch"); v != router.DefaultMaxBatch {
		t.Errorf("on an R1 queue stream: grouprouter_queue_max_batch %v; want %d", v, router.DefaultMaxBatch)
	}
	if v := m0.must(t, "grouprouter_handler_active"); v != 1 {
		t.Errorf("grouprouter_handler_active on the LOCAL node: %v", v)
	}
	if v := m0.must(t, "grouprouter_decisions_total", "op", "bind", "outcome", "accepted"); v < 1 {
		t.Errorf("accepted binds: %v", v)
	}
	var latency uint64
	for _, n := range nodes {
		latency += n.scrape(t).histogramCount("grouprouter_decision_latency_seconds")
	}
	if latency < 1 {
		t.Error("no decision latency observed on either node")
	}
	// Both nodes read all 5 messages: routed by one, skipped by the other.
	if skipped := sum("grouprouter_messages_skipped_total"); skipped != 5 {
		t.Errorf("skipped %v, want 5 (the node that does not own the group)", skipped)
	}

	route, ok := n0.r.Cache().Lookup("g1")
	if !ok || route.Node == "" {
		t.Fatalf("g1 not bound: %+v", route)
	}
	from, to := route.Node, "n0"
	if from == "n0" {
		to = "n1"
	}
	// The queues have no consumer: the 5 messages wait on the owner's.
	natstest.Eventually(t, 10*time.Second, func() error {
		m := n0.scrape(t)
		pending, _ := m.value("grouprouter_queue_backlog_messages", "node", from, "state", "pending")
		bound, _ := m.value("grouprouter_bindings", "node", from)
		lag, _ := m.value("grouprouter_ingress_lag_messages")
		if pending != 5 || bound != 1 || lag != 0 {
			return fmt.Errorf("queue of %s: %v pending; %v groups bound to it; lag %v", from, pending, bound, lag)
		}
		return nil
	})

	// An operator moves the group: its waiting messages go along, and the
	// handler measures the move.
	nc := s.Connect()
	if _, err := proposals.Move(context.Background(), nc, "g1", to, 5*time.Second); err != nil {
		t.Fatalf("move g1 %s -> %s: %v", from, to, err)
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		m := n0.scrape(t)
		moves, _ := m.value("grouprouter_moves_total", "cause", "operator")
		done := m.histogramCount("grouprouter_move_duration_seconds")
		bound, _ := m.value("grouprouter_bindings", "node", to)
		if moves != 1 || done != 1 || bound != 1 {
			return fmt.Errorf("moves %v, moves done %d, groups bound to %s %v", moves, done, to, bound)
		}
		return nil
	})
	publish(t, js, "g1", 2)
	natstest.Eventually(t, 20*time.Second, func() error {
		pending, _ := n0.scrape(t).value("grouprouter_queue_backlog_messages", "node", to, "state", "pending")
		if routed := sum("grouprouter_messages_routed_total"); routed != 7 || pending != 7 {
			return fmt.Errorf("routed %v, %v waiting on %s's queue; want 7 and 7", routed, pending, to)
		}
		return nil
	})

	// The status page: both nodes, the group count, the move.
	rowRE := regexp.MustCompile(`(?s)<tr[^>]*data-node="` + to + `">.*?<td class="n groups">(\d+)</td>`)
	natstest.Eventually(t, 15*time.Second, func() error {
		code, page := n0.get(t, "/")
		if code != http.StatusOK {
			return fmt.Errorf("GET /: %d", code)
		}
		for _, want := range []string{`data-node="n0"`, `data-node="n1"`, "handler <span class=\"ok\">active</span>", `data-kind="move"`, ">g1<"} {
			if !strings.Contains(page, want) {
				return fmt.Errorf("status page lacks %q:\n%s", want, page)
			}
		}
		if m := rowRE.FindStringSubmatch(page); m == nil || m[1] != "1" {
			return fmt.Errorf("status page: row of %s with 1 group not found (%v):\n%s", to, m, page)
		}
		return nil
	})
	code, body = n1.get(t, "/status.json")
	var v view
	if err := json.Unmarshal([]byte(body), &v); code != http.StatusOK || err != nil {
		t.Fatalf("/status.json: %d %v\n%s", code, err, body)
	}
	groups := map[string]int{}
	for _, n := range v.Nodes {
		groups[n.Node] = n.Groups
	}
	if v.Node != "n1" || !v.Ready || v.ActiveHandler != "h/n0" || groups[to] != 1 || groups[from] != 0 || len(v.Nodes) != 2 {
		t.Errorf("/status.json of n1: node %s ready %v active handler %q groups %v", v.Node, v.Ready, v.ActiveHandler, groups)
	}

	// A stopped node is not ready.
	n1.stop(t)
	if code, body := n1.get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "stopped") {
		t.Errorf("/readyz after stop: %d %q", code, body)
	}
}
