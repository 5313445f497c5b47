package router

import (
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// heldMsg is a message of group g at ingress sequence seq, for ingestAll.
type heldMsg struct {
	g   string
	seq uint64
}

// ingestAll gives the engine msgs in order.
func ingestAll(e *engine, now time.Time, msgs []heldMsg) {
	for _, m := range msgs {
		e.ingest(m.g, &msgRec{seq: m.seq}, now)
	}
}

// A bind refused at the cluster's group limit: the group's proposer puts
// the messages it holds on the dead-letter stream at once (no retries: a
// flood of new groups leaves memory as fast as it is refused), with the
// reason; other groups go on.
func TestEngineDeadLettersAtTheGroupLimit(t *testing.T) {
	now := testNow
	e := newTestEngine("n1", mapRecords{})
	e.setLive(map[string]proposals.NodeState{"n1": {HasConsumer: true}}, now) // the proposer of every group
	ingestAll(e, now, []heldMsg{{"a", 3}, {"b", 4}, {"a", 5}})
	e.take()
	batch := e.askBatch(10, now)
	if len(batch) != 2 {
		t.Fatalf("asks %+v, want two binds", batch)
	}
	ds := make([]proposals.Decision, len(batch))
	for i, a := range batch {
		ds[i] = proposals.Decision{Group: a.p.Group, Outcome: proposals.Accepted, Revision: 9}
		if a.p.Group == "a" {
			ds[i] = proposals.Decision{Group: "a", Outcome: proposals.Refused, Error: "bind: 10 groups are bound, the limit (--max-groups) is 10", Limit: 10}
		}
	}
	e.replied(batch, ds, nil, now)
	var dead []uint64
	for _, act := range e.take() {
		if act.kind == actPublish && act.dlq {
			if act.group != "a" || !strings.Contains(act.reason, "group limit") || !strings.Contains(act.reason, "--max-groups") {
				t.Errorf("dead letter of %q: %q", act.group, act.reason)
			}
			dead = append(dead, act.msg.seq)
		}
	}
	if len(dead) != 2 || dead[0] != 3 || dead[1] != 5 {
		t.Fatalf("dead-lettered %v, want a's 3 and 5 at once", dead)
	}
	if la := e.lanes["a"]; la == nil || !la.deadLettering {
		t.Fatalf("lane a %+v, want it dead-lettering", la)
	}
	if e.stats.limitRefused != 1 || e.stats.decisionErrors != 0 {
		t.Errorf("limit refusals %d, decision errors %d; want 1 and 0", e.stats.limitRefused, e.stats.decisionErrors)
	}
	if lb := e.lanes["b"]; lb == nil || lb.deadLettering {
		t.Errorf("lane b %+v: it was accepted, it waits for its record", lb)
	}
}

// A node that does not hold the group's first message after its ended
// record (it skipped some while another node owned the group) does not
// dead-letter what it holds: a record through its messages would make
// the others drop earlier ones. It retries, as after any failed ask.
func TestEngineWithoutTheFirstMessageWaitsAtTheGroupLimit(t *testing.T) {
	now := testNow
	recs := mapRecords{"g": {State: kvbinding.StateReleased, PrevNode: "n2", ThroughSeq: 1, Revision: 4}}
	e := newTestEngine("n1", recs)
	e.setLive(map[string]proposals.NodeState{"n1": {HasConsumer: true}}, now) // the proposer of every group
	e.ingest("g", &msgRec{seq: 3}, now)                                       // 2 went to n2 under the old binding
	e.take()
	batch := e.askBatch(10, now)
	if len(batch) != 1 {
		t.Fatalf("asks %+v, want one bind", batch)
	}
	e.replied(batch, []proposals.Decision{{Group: "g", Outcome: proposals.Refused, Error: "limit", Limit: 10}}, nil, now)
	for _, act := range e.take() {
		if act.kind == actPublish {
			t.Fatalf("dead-lettered without the first message: %+v", act)
		}
	}
	if ln := e.lanes["g"]; ln == nil || ln.deadLettering || ln.ask == nil || e.asks.retryQ.Len() != 1 {
		t.Fatalf("lane %+v: want it waiting with a retry scheduled", ln)
	}
}

// A node other than the proposer that holds the first message (the
// proposer skipped it) dead-letters at the limit: no other node would.
func TestEngineFallbackAskerDeadLettersAtTheGroupLimit(t *testing.T) {
	now := testNow
	e := newTestEngine("n1", mapRecords{})
	var g string
	for _, c := range []string{"g1", "g2", "g3", "g4", "g5", "g6", "g7", "g8"} {
		if !e.isProposer(c) {
			g = c
			break
		}
	}
	if g == "" {
		t.Fatal("n1 proposes for every group")
	}
	e.ingest(g, &msgRec{seq: 3}, now)
	e.take()
	later := now.Add(2 * time.Second) // past the fallback delay
	batch := e.askBatch(10, later)
	if len(batch) != 1 {
		t.Fatalf("asks %+v, want the fallback bind", batch)
	}
	e.replied(batch, []proposals.Decision{{Group: g, Outcome: proposals.Refused, Error: "limit", Limit: 10}}, nil, later)
	dead := 0
	for _, act := range e.take() {
		if act.kind == actPublish && act.dlq {
			dead++
		}
	}
	if dead != 1 {
		t.Fatalf("%d dead-letter publishes, want the held message's", dead)
	}
}
