package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// TestBurstOfLongIDsLogsAggregatedWarnings: a burst of new groups with
// 1000-byte ids meets a decision service that answers nothing (a
// subscriber on the proposal subjects that never replies), so every
// proposal times out, again and again, until a real handler starts. The
// node's log then holds aggregated warnings only: a few "no routing
// decision" lines for hundreds of failed attempts, at least one with its
// count ("repeated="), the cut of the window of proposals in flight
// logged the same way, and no line naming a full id (truncated to 64
// bytes). The counters carry the full numbers. Then every group is
// routed.
func TestBurstOfLongIDsLogsAggregatedWarnings(t *testing.T) {
	t.Parallel() // see doc.go
	begin := time.Now()
	s := natstest.RunServer(t)
	logs := &lockedBuffer{}
	var w io.Writer = logs
	if os.Getenv("GROUPROUTER_TEST_LOG") != "" {
		w = io.MultiWriter(logs, os.Stderr)
	}
	nc := s.Connect()
	// The production heartbeat and lease: this test is about decisions
	// that time out, not about leases and liveness, which the tests'
	// shorter ones let lapse on a loaded machine (two busy loops beside
	// the race detector: the handler stood down every few seconds).
	steady := func(cfg router.Config) router.Config {
		cfg.Heartbeat, cfg.LeaseTTL = router.DefaultHeartbeat, router.DefaultLeaseTTL
		return cfg
	}
	n1 := startNode(t, s.URL(), steady(testConfig("n1", router.Local)))
	cfg := steady(testConfig("n0", router.Remote))
	cfg.Logger = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
	n0 := startNode(t, s.URL(), cfg)
	var got collector
	startConsumer(t, s.URL(), "n0", &got)
	// The decision service gets stuck: it takes every request and never
	// answers (n1, the handler, stops; a subscriber that never replies
	// takes its place).
	stuck, err := nc.QueueSubscribe(proposals.SubjectPropose, "grouping-handlers", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	n1.stop()
	waitEligible(t, nc, []string{"n0"}, []string{"n0"})

	const groups = 300
	ids := make([]string, groups)
	js, _ := jetstream.New(nc)
	for i := range ids {
		ids[i] = fmt.Sprintf("long-%04d-", i) + strings.Repeat("x", 990)
		publish(t, js, "jms.orders", ids[i], "m"+strconv.Itoa(i))
	}
	// Every group times out at least twice.
	natstest.Eventually(t, 60*time.Second, func() error {
		if st := n0.r.Stats(); st.DecisionTimeouts < 2*groups {
			return fmt.Errorf("%d decision timeouts so far", st.DecisionTimeouts)
		}
		return nil
	})
	st := n0.r.Stats()
	if st.WindowCuts == 0 || st.ProposalWindow >= 8*proposals.MaxProposalsPerRequest {
		t.Errorf("timeouts did not narrow the window: %d cuts, window %d", st.WindowCuts, st.ProposalWindow)
	}

	// The decision service comes back: every group is routed.
	if err := stuck.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	n1.restart()
	startConsumer(t, s.URL(), "n1", &got)
	want := map[string][]string{}
	for i, id := range ids {
		want[id] = []string{"m" + strconv.Itoa(i)}
	}
	checkGrouping(t, got.waitCount(t, groups, 120*time.Second), want)
	defer func() {
		if t.Failed() {
			t.Logf("n0's log:\n%s", logs.String())
		}
	}()
	failures := n0.r.Stats().DecisionErrors
	n0.stop() // flushes the aggregated warnings
	n1.stop()

	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	var noDecision, aggregated, window int
	repeated := regexp.MustCompile(`repeated=(\d+)`)
	for _, l := range lines {
		for _, id := range ids {
			if strings.Contains(l, id) {
				t.Fatalf("a log line names a full id: %.200s...", l)
			}
		}
		if len(l) > 2048 {
			t.Errorf("a log line of %d bytes: %.200s...", len(l), l)
		}
		if strings.Contains(l, "no routing decision") {
			noDecision++
			if m := repeated.FindStringSubmatch(l); m != nil {
				if n, _ := strconv.Atoi(m[1]); n > 0 {
					aggregated++
				}
			}
		}
		if strings.Contains(l, "fewer proposals are kept in flight") {
			window++
		}
	}
	t.Logf("%d failed attempts, %d window cuts; %d log lines, %d of them 'no routing decision' (%d aggregated), %d window lines",
		failures, st.WindowCuts, len(lines), noDecision, aggregated, window)
	// A line at once, then one per 10 s interval while they repeat (after
	// a quiet interval, the next is logged at once again), one at the
	// node's stop.
	intervals := int(time.Since(begin)/logagg.DefaultEvery) + 1
	if noDecision > 2*intervals+1 || uint64(noDecision)*20 > failures {
		t.Errorf("%d 'no routing decision' lines for %d failed attempts: not aggregated", noDecision, failures)
	}
	if aggregated == 0 {
		t.Errorf("no aggregated 'no routing decision' line with a count:\n%s", logs.String())
	}
	if window == 0 || window > 2*intervals+1 {
		t.Errorf("%d lines about the window of proposals in flight in %d intervals", window, intervals)
	}
}

// TestDigestKeyHoldingAnotherGroupNeverRoutesIt: a fake collision. The
// digest key of a long group id b holds the record of another group a
// (what two ids with the same SHA-256 would give; here written by hand).
// b's message is never routed by it: the handler finds the key taken by
// another group's record and answers failed (ErrKeyCollision), the node
// retries, and another long group flows meanwhile. Once the record is
// deleted, b is bound and routed.
func TestDigestKeyHoldingAnotherGroupNeverRoutesIt(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	cfg := testConfig("n0", router.Local)
	logs := captureLogs(&cfg, slog.LevelWarn)
	n0 := startNode(t, s.URL(), cfg)
	var got collector
	startConsumer(t, s.URL(), "n0", &got)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0"}, []string{"n0"})

	a, b, c := "a-"+strings.Repeat("x", 998), "b-"+strings.Repeat("x", 998), "c-"+strings.Repeat("x", 998)
	st := openStore(t, nc)
	kb, _ := kvbinding.Key(b)
	forged, err := kvbinding.Binding{Group: a, State: kvbinding.StateBound, Node: "n0", FromSeq: 1, DecidedBy: "forger"}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := st.KV().Put(ctx, kb, forged); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	publish(t, js, "jms.orders", b, "b1")
	publish(t, js, "jms.orders", c, "c1")
	got.waitGroup(t, c, 1, 20*time.Second)
	natstest.Eventually(t, 30*time.Second, func() error {
		if n := n0.r.Stats().DecisionErrors; n < 2 {
			return fmt.Errorf("%d failed attempts", n)
		}
		return nil
	})
	for _, m := range got.all() {
		if m.group == b {
			t.Fatalf("b was routed while its key held a's record: %+v", m)
		}
	}
	if !strings.Contains(logs.String(), "holds another group's record") {
		t.Errorf("the failure does not name the collision; log:\n%s", logs.String())
	}
	if _, err := st.Get(ctx, b); !errors.Is(err, kvbinding.ErrKeyCollision) {
		t.Errorf("Get(b) = %v, want ErrKeyCollision", err)
	}

	// The forged record goes: b is bound and routed.
	if err := st.KV().Delete(ctx, kb); err != nil {
		t.Fatal(err)
	}
	got.waitGroup(t, b, 1, 30*time.Second)
	if r := waitBound(t, st, b, 10*time.Second); r.Group != b {
		t.Fatalf("b's record names %.10q", r.Group)
	}
}
