package router

import (
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// A node that starts without a checkpoint reads from the routing floor;
// one with a checkpoint resumes from it, even below the floor (its own
// groups may have messages there to route).
func TestWithFloor(t *testing.T) {
	ckpt := resumePoint{ckpt: kvbinding.Checkpoint{Next: 50, Pending: [][2]uint64{{40, 41}}}}
	for _, tc := range []struct {
		name   string
		resume resumePoint
		floor  uint64
		start  uint64
	}{
		{"no checkpoint, no floor: the ingress's start", resumePoint{}, 0, 0},
		{"no checkpoint: the floor", resumePoint{}, 700, 700},
		{"a checkpoint below the floor: the checkpoint", ckpt, 700, 40},
		{"a checkpoint above the floor: the checkpoint", ckpt, 10, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := withFloor(tc.resume, tc.floor)
			if got.start() != tc.start {
				t.Errorf("start %d, want %d", got.start(), tc.start)
			}
			if tc.resume.ckpt.Next == 0 && tc.floor > 0 && (!got.done(tc.floor-1) || got.done(tc.floor)) {
				t.Errorf("below the floor not done, or the floor itself done")
			}
		})
	}
}

// Messages that no binding covers and that lie below the routing floor
// are dropped as routed (they were, under a binding that has ended since);
// those at or above it wait for a binding as before.
func TestEngineDropsUnboundMessagesBelowTheFloor(t *testing.T) {
	now := testNow
	recs := mapRecords{"mine": {State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 2}}
	e := newTestEngine("n1", recs)
	e.setLive(map[string]proposals.NodeState{"n1": {HasConsumer: true}}, now) // the proposer of every group
	e.floor = 10
	e.ingest("gone", &msgRec{seq: 8}, now)
	e.ingest("mine", &msgRec{seq: 9}, now) // bound here: routed, floor or not
	e.ingest("gone", &msgRec{seq: 12}, now)
	acts := e.take()
	if k := kinds(acts); k[actPublish] != 1 {
		t.Fatalf("actions %+v, want the bound group's message published", acts)
	}
	if e.stats.belowFloor != 1 || e.stats.skipped != 1 {
		t.Errorf("below floor %d, skipped %d; want 1, 1", e.stats.belowFloor, e.stats.skipped)
	}
	batch := e.askBatch(10, now)
	if len(batch) != 1 || batch[0].p.Group != "gone" || batch[0].p.Seq != 12 {
		t.Fatalf("asks %+v, want one bind of gone from 12", batch)
	}
}

// A bind refused below the floor: the node learns the floor, drops the
// group's messages below it and asks again for the first one after it;
// other lanes waiting below it are dropped too. Without messages after
// the floor the lane goes away.
func TestEngineRefusedBelowTheFloor(t *testing.T) {
	now := testNow
	e := newTestEngine("n1", mapRecords{})
	e.setLive(map[string]proposals.NodeState{"n1": {HasConsumer: true}}, now) // the proposer of every group
	ingestAll(e, now, []heldMsg{{"a", 3}, {"b", 4}, {"a", 5}, {"a", 40}, {"c", 41}})
	e.take()
	batch := e.askBatch(10, now)
	if len(batch) != 3 {
		t.Fatalf("asks %+v, want three binds", batch)
	}
	ds := make([]proposals.Decision, len(batch))
	for i, a := range batch {
		ds[i] = proposals.Decision{Group: a.p.Group, Outcome: proposals.Accepted, Revision: 9}
		if a.p.Group == "a" {
			ds[i] = proposals.Decision{Group: "a", Outcome: proposals.Refused, Error: "below the floor", Floor: 30}
		}
	}
	e.replied(batch, ds, nil, now)
	e.take()
	if e.floor != 30 {
		t.Fatalf("floor %d, want 30", e.floor)
	}
	if la := e.lanes["a"]; la == nil || len(la.msgs) != 1 || la.msgs[0].seq != 40 {
		t.Fatalf("lane a %+v, want message 40 only", la)
	}
	if lb := e.lanes["b"]; lb != nil && len(lb.msgs) != 0 {
		t.Errorf("lane b still holds %d messages below the floor", len(lb.msgs))
	}
	if e.stats.belowFloor != 3 {
		t.Errorf("dropped %d below the floor, want 3 (a:3, a:5, b:4)", e.stats.belowFloor)
	}
	if e.stats.decisionErrors != 0 {
		t.Errorf("a refusal below the floor counted as %d decision errors", e.stats.decisionErrors)
	}
	// a asks again, from 40; c's ask is still waiting for its record.
	again := e.askBatch(10, now.Add(time.Millisecond))
	if len(again) != 1 || again[0].p.Group != "a" || again[0].p.Seq != 40 {
		t.Fatalf("asks after the refusal %+v, want a bind of a from 40", again)
	}
	if p := e.position(); p != 42 {
		t.Errorf("position %d, want 42", p)
	}
	if s := e.track.checkpoint().Start(); s != 40 {
		t.Errorf("checkpoint start %d, want 40 (a:40 and c:41 pending)", s)
	}
}
