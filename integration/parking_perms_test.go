package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/permissions"
	"github.com/grouprouter/grouprouter/router"
)

// TestPermsParkingLeastPrivilege runs package consumer as node n0's
// generated consumer user and the parking operations as the operator, on
// a 3-server cluster whose users are read from the generated block: a
// group whose message fails is parked (the consumer creates the parked
// stream and bucket, records the group, parks its messages, publishes the
// event), the operator lists it and asks for a retry, and the consumer
// replays it in order once; no connection reports a permissions
// violation, and the consumer may not park as another node.
func TestPermsParkingLeastPrivilege(t *testing.T) {
	// Not parallel: permtest.NewAuth sets the passwords in the environment.
	layout := permissions.Layout{Address: "jms", Nodes: []string{"n0"}, Handlers: []string{"n0"}, Name: "my-grouping-handler"}
	a := runAuthCluster(t, layout)
	cfg := testConfig("n0", router.Local)
	// The node's and the consumer's debug logs, shown if the test fails.
	nodeLogs := captureLogs(&cfg, slog.LevelDebug)
	consLogs := &lockedBuffer{}
	consLog := slog.New(slog.NewTextHandler(consLogs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("consumer-n0's log:\n%s\nnode n0's log (last 16 KiB):\n%s", consLogs.String(), tail(nodeLogs.String(), 16<<10))
		}
	})
	u := a.users["node-n0"]
	cfg.InboxPrefix = u.InboxPrefix
	n0 := &node{t: t, id: "n0", cfg: cfg, url: a.c.Servers[0].URL(), opts: a.opts(t, u.Name, u.Name)}
	n0.launch()
	n0.waitReady(30 * time.Second)

	cjs := a.js(t, a.connect(t, 1, "consumer-n0", "consumer-n0"), "consumer-n0")
	var (
		fault atomic.Bool
		mu    sync.Mutex
		got   = map[string][]string{}
	)
	fault.Store(true)
	poison := bodies("bad/m", 4)[1] // as sendBatch names them
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- consumer.Consume(ctx, cjs, "n0", func(_ context.Context, m *consumer.Message) error {
			body := string(m.Data)
			if m.Group == "bad" && body == poison && fault.Load() {
				return errors.New("store down")
			}
			mu.Lock()
			got[m.Group] = append(got[m.Group], body)
			mu.Unlock()
			return nil
		}, consumer.WithMaxAttempts(2), consumer.WithBackoff(10*time.Millisecond, 20*time.Millisecond), consumer.WithParkedReplicas(3),
			consumer.WithLogger(consLog))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Consume as consumer-n0: %v", err)
		}
	}()

	pjs, err := jetstream.New(a.connect(t, 2, "producer", "producer"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	sendBatch(t, pjs, "bad", "m", 4, want)
	sendBatch(t, pjs, "good", "m", 4, want)
	ojs, err := jetstream.New(a.connect(t, 0, "operator", "operator"))
	if err != nil {
		t.Fatal(err)
	}
	// Each call has its own deadline: a JetStream API request that gets no
	// answer (a cluster under load) is asked again.
	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 10*time.Second)
	}
	natstest.Eventually(t, 90*time.Second, func() error {
		rctx, rcancel := call()
		defer rcancel()
		groups, err := consumer.ListParked(rctx, ojs)
		if err != nil {
			return err
		}
		if len(groups) != 1 || groups[0].Group != "bad" || groups[0].Messages != 3 {
			return fmt.Errorf("parked %+v", groups)
		}
		return nil
	})
	// A consumer writes parked records (any group's, through its import):
	// a roll-up on one would erase every parked record, "bad"'s with it.
	// The bucket refuses roll-ups.
	rctx, rcancel := call()
	if err := natstest.RollupAll(rctx, cjs, layout.ImportedSubject("$KV."+consumer.ParkedBucket+".r.zz")); err == nil || !strings.Contains(err.Error(), "rollup not permitted") {
		t.Errorf("consumer-n0's roll-up on the parked bucket: %v, want refused", err)
	}
	if _, err := consumer.GetParked(rctx, ojs, "bad"); err != nil {
		t.Errorf("after consumer-n0's roll-up, group bad: %v, want still parked", err)
	}
	rcancel()
	fault.Store(false)
	natstest.Eventually(t, 60*time.Second, func() error {
		rctx, rcancel := call()
		defer rcancel()
		_, err := consumer.Replay(rctx, ojs, "bad", consumer.ReplayRetry, "")
		if errors.Is(err, consumer.ErrReplaying) || errors.Is(err, consumer.ErrNotParked) {
			return nil // an earlier call got through, its answer did not
		}
		return err
	})
	natstest.Eventually(t, 90*time.Second, func() error {
		rctx, rcancel := call()
		defer rcancel()
		mu.Lock()
		defer mu.Unlock()
		if len(got["bad"]) < 4 || len(got["good"]) < 4 {
			return fmt.Errorf("got %v", got)
		}
		if _, err := consumer.GetParked(rctx, ojs, "bad"); !errors.Is(err, consumer.ErrNotParked) {
			return fmt.Errorf("still parked: %v", err)
		}
		return nil
	})
	mu.Lock()
	for g, w := range want {
		if !slices.Equal(got[g], w) {
			t.Errorf("group %s processed %q, want %q once each in order", g, got[g], w)
		}
	}
	mu.Unlock()

	a.deniedPublish(t, "consumer-n0", consumer.ParkedSubjectPrefix+"n1.r.bad.jms.x")
	a.deniedJS(t, "operator", "$JS.API.STREAM.MSG.DELETE."+consumer.ParkedStream, func(ctx context.Context, js jetstream.JetStream) error {
		s, err := js.Stream(ctx, consumer.ParkedStream)
		if err != nil {
			return err
		}
		return s.DeleteMsg(ctx, 1)
	})
	a.errsMu.Lock()
	names := sortedKeys(a.errs)
	a.errsMu.Unlock()
	for _, name := range names {
		if strings.Contains(name, "denied") {
			continue
		}
		if v := a.violations(name); len(v) > 0 {
			t.Errorf("%s: %d permissions violations doing its job: %q", name, len(v), v)
		}
	}
}
