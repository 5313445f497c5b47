package router

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// The batch rule of the lane engine (docs/protocol.md, "Batches"). The
// simulation drives it across faults; these pin its single steps.

func newBatchEngine(recs mapRecords, maxBatch, maxBatches int) *engine {
	e := newEngine(engineConfig{node: "n1", maxHeldMessages: 1000, maxHeldBytes: 1 << 20, maxInFlight: 100, timeout: time.Second,
		maxBatch: maxBatch, maxBatchBytes: 1 << 20, maxBatches: maxBatches}, recs, rand.New(rand.NewPCG(1, 2)))
	e.setLive(map[string]proposals.NodeState{"n1": {HasConsumer: true}}, testNow)
	e.take()
	return e
}

// publishes returns the sequences each publish action carries: one for a
// single publish, several for a batch.
func publishes(acts []action) [][]uint64 {
	var out [][]uint64
	for _, a := range acts {
		switch a.kind {
		case actPublish:
			out = append(out, []uint64{a.msg.seq})
		case actBatch:
			var seqs []uint64
			for _, m := range a.batch {
				seqs = append(seqs, m.seq)
			}
			out = append(out, seqs)
		}
	}
	return out
}

func TestEngineBatches(t *testing.T) {
	bound := kvbinding.Binding{State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 2}
	tests := []struct {
		name       string
		maxBatch   int
		maxBatches int
		held       []*msgRec // held while the group waits for its record
		want       [][]uint64
	}{
		{"a message alone goes alone", 8, 4, []*msgRec{{seq: 1}}, [][]uint64{{1}}},
		{"a backlog goes as one batch", 8, 4, []*msgRec{{seq: 1}, {seq: 2}, {seq: 3}}, [][]uint64{{1, 2, 3}}},
		{"up to the bound", 2, 4, []*msgRec{{seq: 1}, {seq: 2}, {seq: 3}}, [][]uint64{{1, 2}}},
		{"batches off", 1, 4, []*msgRec{{seq: 1}, {seq: 2}}, [][]uint64{{1}}},
		{"a closing message ends the batch", 8, 4, []*msgRec{{seq: 1}, {seq: 2, close: true}, {seq: 3}}, [][]uint64{{1, 2}}},
		{"no batch slot left", 8, 0, []*msgRec{{seq: 1}, {seq: 2}}, [][]uint64{{1}}},
		{"the bytes bound", 8, 4, []*msgRec{{seq: 1, size: 600 << 10}, {seq: 2, size: 600 << 10}}, [][]uint64{{1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs := mapRecords{}
			e := newBatchEngine(recs, tt.maxBatch, tt.maxBatches)
			for _, m := range tt.held {
				e.ingest("g", m, testNow)
			}
			e.take()
			recs["g"] = bound
			e.changed("g", testNow)
			if got := publishes(e.take()); !slices.EqualFunc(got, tt.want, slices.Equal) {
				t.Errorf("publishes %v, want %v", got, tt.want)
			}
		})
	}
}

// A batch's messages are done together; a failed batch's go one at a time,
// in order, then the lane batches again.
func TestEngineFailedBatchGoesOneAtATime(t *testing.T) {
	recs := mapRecords{"g": {State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 2}}
	e := newBatchEngine(recs, 8, 4)
	e.ingest("g", &msgRec{seq: 1}, testNow)
	for seq := uint64(2); seq <= 4; seq++ {
		e.ingest("g", &msgRec{seq: seq}, testNow) // held behind seq 1
	}
	if got := publishes(e.take()); !slices.EqualFunc(got, [][]uint64{{1}}, slices.Equal) {
		t.Fatalf("publishes %v, want seq 1 alone", got)
	}
	ln := e.lanes["g"]
	e.acked(ln, ln.msgs[0], false, "", nil, 0, testNow)
	if got := publishes(e.take()); !slices.EqualFunc(got, [][]uint64{{2, 3, 4}}, slices.Equal) {
		t.Fatalf("publishes %v, want the backlog 2..4 as one batch", got)
	}
	if e.inflight != 3 || e.batches != 1 {
		t.Fatalf("in flight %d messages, %d batches; want 3 and 1", e.inflight, e.batches)
	}
	e.ingest("g", &msgRec{seq: 5}, testNow)
	e.take()
	e.ackedBatch(ln, errors.New("ack timed out"), 0, testNow)
	e.take()
	now := testNow.Add(backoffBase)
	var sent []uint64
	for range 3 {
		e.due(now)
		got := publishes(e.take())
		if len(got) != 1 || len(got[0]) != 1 {
			t.Fatalf("after the failed batch, publishes %v, want one message alone", got)
		}
		sent = append(sent, got[0][0])
		e.acked(ln, ln.msgs[0], false, "", nil, 0, now)
	}
	if !slices.Equal(sent, []uint64{2, 3, 4}) {
		t.Errorf("the failed batch's messages went as %v, want 2, 3, 4", sent)
	}
	// The last ack pumped seq 5: alone (no backlog).
	if e.batches != 0 || ln.singles != 0 {
		t.Errorf("batches in flight %d, singles left %d; want 0 and 0", e.batches, ln.singles)
	}
}

// The batch counters (grouprouter_queue_batches_total and the rest): a
// stored batch counts its messages, a failed one counts as a failure and
// its messages count when stored alone, as routed messages, not batched.
func TestEngineCountsBatches(t *testing.T) {
	recs := mapRecords{}
	e := newBatchEngine(recs, 8, 4)
	for seq := uint64(1); seq <= 3; seq++ {
		e.ingest("g", &msgRec{seq: seq}, testNow)
	}
	e.take()
	recs["g"] = kvbinding.Binding{State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 2}
	e.changed("g", testNow)
	e.take()
	ln := e.lanes["g"]
	if e.stats.batches != 1 || e.batches != 1 {
		t.Fatalf("batches published %d, in flight %d; want 1 and 1", e.stats.batches, e.batches)
	}
	e.ackedBatch(ln, nil, 0, testNow)
	if e.stats.batchedMsgs != 3 || e.stats.batchFailures != 0 || e.batches != 0 {
		t.Fatalf("batched messages %d, failures %d, in flight %d; want 3, 0, 0", e.stats.batchedMsgs, e.stats.batchFailures, e.batches)
	}
	for seq := uint64(4); seq <= 6; seq++ {
		e.ingest("g", &msgRec{seq: seq}, testNow)
	}
	e.take()
	if e.batches != 0 {
		t.Fatalf("a lane with nothing in flight sent its first message in a batch")
	}
	// The emptied lane was dropped; seq 4 made a new one. Seq 4 goes alone,
	// 5 and 6 as a batch.
	ln = e.lanes["g"]
	e.acked(ln, ln.msgs[0], false, "", nil, 0, testNow)
	e.take()
	e.ackedBatch(ln, errors.New("ack timed out"), 0, testNow)
	if e.stats.batches != 2 || e.stats.batchFailures != 1 || e.stats.batchedMsgs != 3 {
		t.Errorf("after a failed batch: %d published, %d failed, %d messages batched; want 2, 1, 3",
			e.stats.batches, e.stats.batchFailures, e.stats.batchedMsgs)
	}
}

// A move asked while a batch is in flight waits for the batch's outcome:
// the fence is the first message the node did not store.
func TestEngineFenceWaitsForTheBatch(t *testing.T) {
	recs := mapRecords{"g": {State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 2}}
	e := newBatchEngine(recs, 8, 4)
	e.ingest("g", &msgRec{seq: 1}, testNow)
	e.ingest("g", &msgRec{seq: 2}, testNow)
	e.ingest("g", &msgRec{seq: 3}, testNow)
	ln := e.lanes["g"]
	e.acked(ln, ln.msgs[0], false, "", nil, 0, testNow)
	e.take() // batch 2..3 in flight
	recs["g"] = kvbinding.Binding{State: kvbinding.StateMoving, Node: "n2", PrevNode: "n1", FromSeq: 1, Revision: 3}
	e.changed("g", testNow)
	if e.take(); ln.ask != nil {
		t.Fatalf("asked %+v while the batch is in flight", ln.ask.p)
	}
	e.ackedBatch(ln, nil, 0, testNow)
	e.take()
	if ln.ask == nil || ln.ask.p.Op != proposals.OpFence || ln.ask.p.Seq != 4 {
		t.Fatalf("after the batch, ask %+v; want a fence at 4", ln.ask)
	}
}

// A message's copy for a drain leaves the batch headers of the batch that
// stored it, whatever their case.
func TestDropBatchHeaders(t *testing.T) {
	h := nats.Header{headerBatchID: {"x"}, headerBatchSeq: {"3"}, "nats-batch-commit": {"1"}, "Nats-Msg-Id": {"GROUPING_INGRESS:9"}}
	dropBatchHeaders(h)
	if len(h) != 1 || h.Get("Nats-Msg-Id") == "" {
		t.Errorf("headers left %v, want only Nats-Msg-Id", h)
	}
}
