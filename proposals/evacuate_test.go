package proposals

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// TestEvacuationNamesLongIDs: the cache keeps no settled long id, so the
// evacuation of a gone node reads the ids of its long groups back from
// their records: every group of the node, long or short, is moved off it,
// and the records written name the full ids. While n1 is live, its groups
// stay.
func TestEvacuationNamesLongIDs(t *testing.T) {
	s := natstest.RunServer(t)
	env := startHandler(t, s, "n2", liveNodes)
	h := env.h
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, _ := jetstream.New(env.nc)
	st, err := kvbinding.OpenStore(ctx, js, kvbinding.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	groups := []string{"short-1"}
	for i := range 12 { // more than Names reads one by one
		groups = append(groups, fmt.Sprintf("long-%02d-", i)+strings.Repeat("x", 990))
	}
	for _, g := range groups {
		if _, err := st.Create(ctx, kvbinding.Binding{Group: g, State: kvbinding.StateBound, Node: "n1", FromSeq: 1, DecidedBy: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	// (The handler may rebalance some of them meanwhile: n2 has none.)
	natstest.Eventually(t, 10*time.Second, func() error {
		for _, g := range groups {
			if _, ok := h.cache.Lookup(g); !ok {
				return fmt.Errorf("%.12s not in the cache yet", g)
			}
		}
		return nil
	})
	// A guard that fails (stillGone: the node announced itself again)
	// fails every write, after the pauses: nothing is written.
	live := h.liveState()
	delete(live, "n1")
	written, failed := h.applyMany(ctx, groups[:2], []Input{{Op: OpEvacuate, By: h.id, From: "n1", Node: "n2", Seq: 1, Reason: "guarded"},
		{Op: OpEvacuate, By: h.id, From: "n1", Node: "n2", Seq: 1, Reason: "guarded"}}, live, causeNodeGone,
		func(context.Context) error { return errAnnouncedAgain })
	if written != 0 || failed != 2 {
		t.Fatalf("a failing guard: %d written, %d failed, want 0 and 2", written, failed)
	}
	for _, g := range groups[:2] {
		if r, err := st.Get(ctx, g); err != nil || r.Reason == "guarded" {
			t.Fatalf("%.12s written although the guard failed: %+v %v", g, r, err)
		}
	}
	// n1 is live: its groups stay.
	h.evacuate(ctx, "n1", nil, "test: n1 gone", causeNodeGone)
	for _, g := range groups {
		if r, err := st.Get(ctx, g); err != nil || r.Reason == "test: n1 gone" {
			t.Fatalf("%.12s evacuated from n1, which is live: %+v %v", g, r, err)
		}
	}
	if err := h.reg.Withdraw(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() error {
		if _, live := h.liveState()["n1"]; live {
			return natstest.ErrNotYet
		}
		return nil
	})
	h.evacuate(ctx, "n1", nil, "test: n1 gone", causeNodeGone)
	for _, g := range groups {
		r, err := st.Get(ctx, g)
		if err != nil {
			t.Fatalf("%.12s: %v", g, err)
		}
		if r.Group != g || (r.Settled() && r.Node == "n1") {
			t.Fatalf("%.12s is still on n1 after the evacuation: %+v", g, r)
		}
	}
}

// TestStillGone: before an evacuation of a gone node is written, the
// node's liveness record is read again. A record at the revision the
// handler had seen when it decided is the lapsed one (a replica that has
// not expired it yet): the node is still gone. A record stored since is
// an announcement (a link that healed): the evacuation is not written. No
// record: gone.
func TestStillGone(t *testing.T) {
	s := natstest.RunServer(t)
	nc := s.Connect()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reg, err := kvbinding.OpenRegistry(ctx, js, kvbinding.RegistryConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Announce(ctx, kvbinding.NodeInfo{Node: "n1", HasConsumer: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	go func() { _ = reg.Run(ctx) }()
	<-reg.Ready()
	_, seen, _, err := reg.LiveRecord(ctx, "n1")
	if err != nil || seen == 0 || reg.SeenRevision("n1") != seen {
		t.Fatalf("the registry saw revision %d of n1's record, stored at %d (%v)", reg.SeenRevision("n1"), seen, err)
	}
	h := &Handler{reg: reg, log: slog.New(slog.DiscardHandler)}

	if err := h.stillGone(ctx, "n1", seen); err != nil {
		t.Fatalf("the record the handler had seen: %v, want the node still gone", err)
	}
	if err := reg.Announce(ctx, kvbinding.NodeInfo{Node: "n1", HasConsumer: true}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := h.stillGone(ctx, "n1", seen); !errors.Is(err, errAnnouncedAgain) {
		t.Fatalf("after a new announcement: %v, want %v", err, errAnnouncedAgain)
	}
	natstest.Eventually(t, 5*time.Second, func() error {
		if reg.SeenRevision("n1") <= seen {
			return natstest.ErrNotYet
		}
		return nil
	})
	if err := reg.Withdraw(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := h.stillGone(ctx, "n1", seen); err != nil {
		t.Fatalf("no record: %v, want the node gone", err)
	}
}

// TestEvacuateNewReadsAgain: the early take-over of a gone node's new
// groups reads the node's checkpoint; a read that fails (here the server is
// down for longer than one attempt) is tried again, and the group bound
// after the checkpoint moves as soon as a read succeeds, not at the grace.
// The group the checkpoint covers stays for the grace.
func TestEvacuateNewReadsAgain(t *testing.T) {
	s := natstest.RunServer(t)
	var logs natstest.Buffer
	env := startHandler(t, s, "n2", liveNodes[1:], func(c *HandlerConfig) {
		c.LeaseTTL = time.Minute // its authority outlasts the outage
		c.NodeGrace = time.Hour
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	h := env.h
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	natstest.Eventually(t, 10*time.Second, func() error {
		if !h.Active() {
			return natstest.ErrNotYet
		}
		return nil
	})
	js, _ := jetstream.New(env.nc)
	st, err := kvbinding.OpenStore(ctx, js, kvbinding.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for g, from := range map[string]uint64{"old": 1, "fresh": 10} {
		if _, err := st.Create(ctx, kvbinding.Binding{Group: g, State: kvbinding.StateBound, Node: "n1", FromSeq: from, DecidedBy: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.reg.SaveCheckpoint(ctx, "n1", kvbinding.Checkpoint{Next: 5}); err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		for _, g := range []string{"old", "fresh"} {
			if _, ok := h.cache.Lookup(g); !ok {
				return fmt.Errorf("%s not in the cache yet", g)
			}
		}
		return nil
	})
	s.Stop()
	done := make(chan struct{})
	go func() { defer close(done); h.evacuateNew(ctx, "n1") }()
	time.Sleep(evacuateReadTimeout + 500*time.Millisecond) // one attempt fails
	s.Restart()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the early take-over did not end")
	}
	if !strings.Contains(logs.String(), "reading again") {
		t.Fatalf("no read was tried again: the test shows nothing; log:\n%s", logs.String())
	}
	if r, err := st.Get(ctx, "fresh"); err != nil || (r.Settled() && r.Node == "n1") {
		t.Fatalf("the group bound after n1's checkpoint is still on n1: %+v %v", r, err)
	}
	if r, err := st.Get(ctx, "old"); err != nil || r.Node != "n1" {
		t.Fatalf("the group n1's checkpoint covers moved before the grace: %+v %v", r, err)
	}
}
