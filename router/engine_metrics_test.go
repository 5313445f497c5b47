package router

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// fakeRecords is the engine's view of the binding records, set by the test.
type fakeRecords map[string]kvbinding.Binding

func (f fakeRecords) Lookup(g string) (kvbinding.Binding, bool) {
	r, ok := f[g]
	return r, ok
}

func testEngine(recs fakeRecords, live ...string) *engine {
	e := newEngine(engineConfig{node: "n1", maxHeldMessages: 100, maxHeldBytes: 1 << 20, maxInFlight: 100, timeout: time.Second},
		recs, rand.New(rand.NewPCG(1, 2)))
	state := map[string]proposals.NodeState{}
	for _, n := range live {
		state[n] = proposals.NodeState{HasConsumer: true}
	}
	e.setLive(state, time.Now())
	e.take()
	return e
}

// observed returns the decision latencies among acts.
func observed(acts []action) []time.Duration {
	var out []time.Duration
	for _, a := range acts {
		if a.kind == actDecided {
			out = append(out, a.took)
		}
	}
	return out
}

func TestEngineObservesDecisionLatency(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	bound := func(rev uint64) kvbinding.Binding {
		return kvbinding.Binding{State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: rev}
	}
	accepted := func(rev uint64) []proposals.Decision {
		return []proposals.Decision{{Group: "g", Outcome: proposals.Accepted, Revision: rev}}
	}
	tests := []struct {
		name string
		// run drives the engine after the ask for group g was sent at
		// t0+5ms; it returns the actions of the step that decides g.
		run  func(e *engine, recs fakeRecords, batch []sentAsk) []action
		want []time.Duration
	}{
		{
			name: "record before the reply",
			run: func(e *engine, recs fakeRecords, batch []sentAsk) []action {
				recs["g"] = bound(1)
				e.changed("g", t0.Add(35*time.Millisecond))
				acts := e.take()
				e.replied(batch, accepted(1), nil, t0.Add(40*time.Millisecond)) // late: observes nothing more
				return append(acts, e.take()...)
			},
			want: []time.Duration{30 * time.Millisecond},
		},
		{
			name: "reply before the record",
			run: func(e *engine, recs fakeRecords, batch []sentAsk) []action {
				e.replied(batch, accepted(1), nil, t0.Add(20*time.Millisecond))
				acts := e.take()
				recs["g"] = bound(1)
				e.changed("g", t0.Add(45*time.Millisecond))
				return append(acts, e.take()...)
			},
			want: []time.Duration{40 * time.Millisecond},
		},
		{
			name: "reply naming a record already seen",
			run: func(e *engine, recs fakeRecords, batch []sentAsk) []action {
				recs["g"] = bound(1)
				e.replied(batch, accepted(1), nil, t0.Add(15*time.Millisecond))
				return e.take()
			},
			want: []time.Duration{10 * time.Millisecond},
		},
		{
			name: "retried after a timeout: from the attempt that got it",
			run: func(e *engine, recs fakeRecords, batch []sentAsk) []action {
				e.replied(batch, nil, fmt.Errorf("%w after 1s", proposals.ErrDecisionTimeout), t0.Add(time.Second))
				e.take()
				retry := e.askBatch(10, t0.Add(5*time.Second)) // past the backoff
				if len(retry) != 1 {
					t.Fatalf("retry batch: %d asks, want 1", len(retry))
				}
				recs["g"] = bound(1)
				e.changed("g", t0.Add(5*time.Second+7*time.Millisecond))
				acts := e.take()
				if e.stats.timeouts != 1 || e.stats.decisionErrors != 1 || e.stats.noHandler != 0 {
					t.Errorf("stats %+v: want one failure, a timeout", e.stats)
				}
				return acts
			},
			want: []time.Duration{7 * time.Millisecond},
		},
		{
			name: "bound by another node's proposal: nothing asked, nothing observed",
			run: func(e *engine, recs fakeRecords, _ []sentAsk) []action {
				return nil
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			recs := fakeRecords{}
			live := []string{"n1"}
			if tc.want == nil {
				live = []string{"n1", "n2", "n3", "n4", "n5"}
			}
			e := testEngine(recs, live...)
			group := "g"
			if tc.want == nil {
				// A group another node proposes: this node asks only
				// after the timeout, and the record comes first.
				for i := 0; e.isProposer(group); i++ {
					group = fmt.Sprintf("g%d", i)
				}
			}
			e.ingest(group, &msgRec{seq: 1, size: 10}, t0)
			e.take()
			batch := e.askBatch(10, t0.Add(5*time.Millisecond))
			var acts []action
			if tc.want == nil {
				if len(batch) != 0 {
					t.Fatalf("a non-proposer asked at once: %d asks", len(batch))
				}
				recs[group] = kvbinding.Binding{State: kvbinding.StateBound, Node: "n2", FromSeq: 1, Revision: 1}
				e.changed(group, t0.Add(50*time.Millisecond))
				acts = e.take()
			} else {
				if len(batch) != 1 {
					t.Fatalf("batch: %d asks, want 1", len(batch))
				}
				acts = tc.run(e, recs, batch)
			}
			if got := observed(acts); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("observed %v, want %v", got, tc.want)
			}
		})
	}
}

func TestEngineCountsFailuresByReason(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	e := testEngine(fakeRecords{}, "n1")
	e.ingest("g", &msgRec{seq: 1, size: 10}, t0)
	now := t0
	for _, err := range []error{
		fmt.Errorf("%w after 1s", proposals.ErrDecisionTimeout),
		fmt.Errorf("%w (1 proposals)", proposals.ErrNoHandler),
		fmt.Errorf("%w: disk full", proposals.ErrHandlerFailed),
		fmt.Errorf("%w (1 proposals)", proposals.ErrNoHandler),
	} {
		now = now.Add(10 * time.Second) // past any backoff
		batch := e.askBatch(10, now)
		if len(batch) != 1 {
			t.Fatalf("batch: %d asks, want 1", len(batch))
		}
		e.replied(batch, nil, err, now)
	}
	if got := e.stats; got.decisionErrors != 4 || got.timeouts != 1 || got.noHandler != 2 {
		t.Errorf("stats %+v: want 4 failures, 1 timeout, 2 without handler", got)
	}
}
