// Package routertest starts router nodes for the tests of programs that
// use package router, as net/http/httptest starts servers.
package routertest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/router"
)

// Start runs a router node on nc with cfg until the test ends, and returns
// it once it is ready. Zero timings get short test values (1 s timeout and
// lease, 100 ms heartbeat, 200 ms checkpoints, 1 s pinned TTL). The node's
// Run error, if any, fails the test at its end.
func Start(t testing.TB, nc *nats.Conn, cfg router.Config) *router.Router {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 100 * time.Millisecond
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = time.Second
	}
	if cfg.CheckpointInterval == 0 {
		cfg.CheckpointInterval = 200 * time.Millisecond
	}
	if cfg.PinnedTTL == 0 {
		cfg.PinnedTTL = time.Second
	}
	r, done := Launch(t, nc, cfg)
	WaitReady(t, r, done)
	return r
}

// Launch runs a router node on nc with cfg, as given, until the test ends,
// without waiting for it to be ready; done yields Run's error should the
// node stop before. The node's Run error, if any, fails the test at its
// end, as does a node that does not stop within 30 s.
func Launch(t testing.TB, nc *nats.Conn, cfg router.Config) (r *router.Router, done <-chan error) {
	t.Helper()
	r, err := router.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-ran:
			if err != nil {
				t.Errorf("node %s: %v", cfg.Node, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("node %s did not stop", cfg.Node)
		}
	})
	return r, ran
}

// WaitReady waits up to 30 s until r routes; done is Launch's.
func WaitReady(t testing.TB, r *router.Router, done <-chan error) {
	t.Helper()
	select {
	case <-r.Ready():
	case err := <-done:
		t.Fatalf("node stopped before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("node not ready within 30 s")
	}
}

// PublishGroups publishes perGroup messages of each of groups groups
// (named prefix0, prefix1, …) on subject, interleaved, each with body
// "<group>:<i>" (i from 0) and the default group header.
func PublishGroups(ctx context.Context, t testing.TB, js jetstream.JetStream, subject, prefix string, groups, perGroup int) {
	t.Helper()
	for i := range perGroup {
		for g := range groups {
			m := nats.NewMsg(subject)
			group := prefix + strconv.Itoa(g)
			m.Header.Set(router.DefaultGroupHeader, group)
			m.Data = []byte(group + ":" + strconv.Itoa(i))
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
}
