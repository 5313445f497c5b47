package router

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// progressEvents subscribes to progress events on the router's connection
// and returns a function that flushes and returns those received so far.
func progressEvents(t *testing.T, r *Router) func() []proposals.Event {
	t.Helper()
	sub, err := r.nc.SubscribeSync(proposals.SubjectEventsPrefix + proposals.EventProgress)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	var got []proposals.Event
	return func() []proposals.Event {
		t.Helper()
		if err := r.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := sub.NextMsg(50 * time.Millisecond)
			if err != nil {
				return got
			}
			var e proposals.Event
			if err := json.Unmarshal(m.Data, &e); err != nil {
				t.Fatalf("progress event %s: %v", m.Data, err)
			}
			got = append(got, e)
		}
	}
}

// A drain of hundreds of messages reports its progress after every
// progressEvery messages and once more when it is done; a short one
// reports nothing.
func TestDrainReportsProgress(t *testing.T) {
	r, js := testRouter(t, "n1")
	r.nc = js.Conn()
	r.ho.nc = r.nc
	events := progressEvents(t, r)
	ctx := context.Background()
	const n = 250
	for seq := uint64(1); seq <= n; seq++ {
		publishQueued(t, js, "n9", "g", seq)
	}
	for seq := uint64(n + 1); seq <= n+3; seq++ {
		publishQueued(t, js, "n9", "short", seq)
	}
	drain := func(group string) {
		t.Helper()
		route := record(t, r, kvbinding.Binding{Group: group, State: kvbinding.StateBound, Node: "n1", FromSeq: n + 4, PrevNode: "n9",
			Step: kvbinding.StepDrain, Drain: []string{"n9"}, Revision: 5})
		routes := map[string]kvbinding.Binding{group: route}
		pctx, prog := r.ho.startProgress(ctx, proposals.DutyDrain, routes)
		counts, err := r.ho.drainQueues(pctx, routes, nil)
		prog.end(err)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]int{"short": 3, "g": n}[group]; counts[group] != want {
			t.Fatalf("drain of %s moved %v, want %d", group, counts, want)
		}
	}

	drain("short")
	if got := events(); len(got) != 0 {
		t.Fatalf("a drain of 3 messages sent progress events: %+v", got)
	}
	drain("g")
	got := events()
	if len(got) < 2 {
		t.Fatalf("%d progress events, want one after %d messages and a last one: %+v", len(got), progressEvery, got)
	}
	first, last := got[0], got[len(got)-1]
	if first.Count < progressEvery || first.Total != n || first.Reason != "" {
		t.Errorf("first event %+v, want count >= %d of %d", first, progressEvery, n)
	}
	want := proposals.Event{Kind: proposals.EventProgress, Group: "g", Node: "n1", PrevNode: "n9", By: "n1",
		Step: "drain", Count: n, Total: n, Groups: 1, Reason: "done"}
	last.ID, last.At = "", time.Time{}
	if last != want {
		t.Errorf("last event\n got %+v\nwant %+v", last, want)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Count < got[i-1].Count {
			t.Errorf("event %d counts %d after %d", i, got[i].Count, got[i-1].Count)
		}
	}
}

// A catch-up of a batch of groups reports one event for the batch: the
// number of groups and the totals, no group named.
func TestCatchUpBatchReportsProgress(t *testing.T) {
	r, js := testRouter(t, "n1")
	r.nc = js.Conn()
	r.ho.nc = r.nc
	events := progressEvents(t, r)
	ctx := context.Background()
	const perGroup = 120
	for i := 0; i < perGroup; i++ {
		for _, g := range []string{"a", "b"} {
			m := nats.NewMsg("jms.x")
			m.Header.Set(DefaultGroupHeader, g)
			if _, err := js.PublishMsg(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.step(inBegin{resume: resumePoint{ckpt: kvbinding.Checkpoint{Next: 2*perGroup + 1}}}) // read past them
	routes := map[string]kvbinding.Binding{}
	for i, g := range []string{"a", "b"} {
		routes[g] = record(t, r, kvbinding.Binding{Group: g, State: kvbinding.StateBound, Node: "n1", FromSeq: 1, PrevNode: "n0",
			Step: kvbinding.StepCatchUp, Revision: uint64(7 + i)})
	}
	pctx, prog := r.ho.startProgress(ctx, proposals.DutyCatchUp, routes)
	counts, err := r.ho.catchUp(pctx, routes)
	prog.end(err)
	if err != nil {
		t.Fatal(err)
	}
	if counts["a"] != perGroup || counts["b"] != perGroup {
		t.Fatalf("caught up %v, want %d each", counts, perGroup)
	}
	got := events()
	if len(got) < 2 {
		t.Fatalf("%d progress events, want at least 2: %+v", len(got), got)
	}
	last := got[len(got)-1]
	last.ID, last.At = "", time.Time{}
	want := proposals.Event{Kind: proposals.EventProgress, Node: "n1", By: "n1", Step: "catchup",
		Count: 2 * perGroup, Total: 2 * perGroup, Groups: 2, Reason: "done"}
	if last != want {
		t.Errorf("last event\n got %+v\nwant %+v", last, want)
	}
}
