package router

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// BenchmarkEngineRoute measures the lane engine alone on the per-message
// path of a node that routes its groups: a message in (inMsg), its publish
// out (actPublish or actBatch), its outcome back (inOutcomes, handed over
// in runs of 64 as the publisher's batch end does), over 1,000 groups bound
// to the node, one publish per message. No I/O, no lock, no fair share
// (nobody consumes the queue): what the engine and its actions and
// outcomes cost per message. batch=8: 10 groups, whose backlogs go as
// batches of up to 8.
func BenchmarkEngineRoute(b *testing.B) {
	b.Run("single", func(b *testing.B) { benchEngineRoute(b, 1000, 1) })
	b.Run("batch=8", func(b *testing.B) { benchEngineRoute(b, 10, 8) })
}

func benchEngineRoute(b *testing.B, groups, maxBatch int) {
	recs := mapRecords{}
	names := make([]string, groups)
	for i := range names {
		names[i] = "g" + strconv.Itoa(i)
		recs[names[i]] = kvbinding.Binding{Group: names[i], State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 2, Epoch: 2}
	}
	e := newEngine(engineConfig{node: "n1", maxHeldMessages: 1 << 30, maxHeldBytes: 1 << 40, maxInFlight: 1 << 30, timeout: time.Second,
		maxBatch: maxBatch, maxBatchBytes: maxBatchBytes, maxBatches: maxAtomicInFlight, groupShare: -1}, recs, rand.New(rand.NewPCG(1, 2)))
	e.setLive(map[string]proposals.NodeState{"n1": {HasConsumer: true}}, testNow)
	e.take()
	payload := &held{}
	var pending, outs []outcome
	var qseq uint64
	collect := func() {
		for _, a := range e.take() {
			if a.kind == actPublish || a.kind == actBatch {
				qseq++
				pending = append(pending, benchOutcome(a, qseq))
			}
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.step(inMsg{group: names[i%groups], m: &msgRec{seq: uint64(i + 1), subject: "s", size: 100, payload: payload}}, testNow)
		collect()
		if len(pending) >= 64 {
			outs, pending = pending, outs[:0]
			e.step(inOutcomes{batch: outs}, testNow)
			clear(outs)
			collect()
		}
	}
	for len(pending) > 0 {
		outs, pending = pending, outs[:0]
		e.step(inOutcomes{batch: outs}, testNow)
		clear(outs)
		collect()
	}
	b.StopTimer()
	if e.stats.batches > 0 {
		b.ReportMetric(float64(e.stats.batchedMsgs)/float64(e.stats.batches), "msgs/batch")
		b.ReportMetric(float64(e.stats.batchedMsgs)/float64(b.N), "batched/msg")
	}
	if e.inflight != 0 || e.mem.heldMsgs != 0 {
		b.Fatalf("%d publishes in flight, %d messages held at the end", e.inflight, e.mem.heldMsgs)
	}
}

// benchOutcome is what the publisher reports for a, stored at qseq.
func benchOutcome(a action, qseq uint64) outcome {
	o := a.outcome()
	o.seq = qseq
	return o
}
