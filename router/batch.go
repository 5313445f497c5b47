package router

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"grouprouter/internal/jspub"
)

// Atomic batches (docs/protocol.md, "Batches"): a group with a backlog has
// its next messages published as one batch, stored all together or not at
// all, so that one PubAck round trip carries many of its messages. The
// engine decides what goes in a batch and what happens when one fails
// (engine.batchable, engine.ackedBatch); this file sends them.

// The headers of JetStream's atomic batch publish.
const (
	headerBatchID     = "Nats-Batch-Id"
	headerBatchSeq    = "Nats-Batch-Sequence"
	headerBatchCommit = "Nats-Batch-Commit"
	// headerBatchPrefix starts every batch header; a queue message's copy
	// (a drain) drops them, or the copy would be taken for a batch's part.
	headerBatchPrefix = "Nats-Batch-"
)

const (
	// maxAtomicBatch is the servers' bound on the messages of one batch.
	maxAtomicBatch = 1000
	// maxBatchBytes bounds the bytes of one batch: a batch is stored as
	// one proposal of the stream's replicas.
	maxBatchBytes = 1 << 20
	// maxAtomicInFlight bounds a node's batches in flight: the servers
	// take 50 per stream, shared by the nodes (a batch refused for that
	// goes one message at a time).
	maxAtomicInFlight = 16
)

// queueBatch returns the batch size this node publishes with: Config.MaxBatch
// on a replicated queue stream that allows atomic publishes, else 1 (no
// batches). A LOCAL node allows them on a queue stream created before
// batches (an update of its configuration); should that fail (no
// permission to update streams, servers before 2.12), the node publishes
// one message at a time and says so.
func (r *Router) queueBatch(ctx context.Context) int {
	if r.cfg.MaxBatch < 2 {
		return 1
	}
	s, err := r.js.Stream(ctx, QueueStream)
	if err != nil {
		r.log.Warn("queue stream not read: publishing one message at a time per group", "err", err)
		return 1
	}
	c := s.CachedInfo().Config
	if c.Replicas < 2 {
		// On R1 file storage an atomic batch costs more than its
		// messages published one by one (docs/performance.md).
		return 1
	}
	if c.AllowAtomicPublish {
		return r.cfg.MaxBatch
	}
	if r.cfg.Type != Local {
		r.log.Info("the queue stream does not allow atomic batches (yet: a LOCAL node allows them when it starts): publishing one message at a time per group",
			"stream", QueueStream)
		return 1
	}
	c.AllowAtomicPublish = true
	uctx, cancel := context.WithTimeout(ctx, 5*time.Second) // a denied request gets no answer
	defer cancel()
	us, err := r.js.UpdateStream(uctx, c)
	if err != nil || !us.CachedInfo().Config.AllowAtomicPublish {
		r.log.Warn("could not allow atomic batches on the queue stream: publishing one message at a time per group",
			"stream", QueueStream, "err", err, "hint", "nats-server 2.12 or later, and the right to update the stream")
		return 1
	}
	r.log.Info("the queue stream now allows atomic batches", "stream", QueueStream)
	return r.cfg.MaxBatch
}

// publishBatch carries out an actBatch: the lane's first messages onto the
// node's queue as one atomic batch. Only the commit asks for a reply; the
// outcome of the whole batch goes back to the engine. A message's batch
// headers are removed once it is sent: should the batch fail, it is sent
// again alone.
func (r *Router) publishBatch(a action) {
	id := nuid.Next()
	o := outcome{ln: a.ln, batch: len(a.batch)}
	fail := func(err error) {
		o.err = err
		r.do(func(e *engine, now time.Time) { r.apply(e, o, now) })
	}
	last := len(a.batch) - 1
	for i, m := range a.batch[:last] {
		out := r.queueMsg(m, a)
		out.Header[headerBatchID] = []string{id}
		out.Header[headerBatchSeq] = []string{strconv.Itoa(i + 1)}
		out.Reply = "" // only the commit is answered
		err := r.nc.PublishMsg(out)
		delete(out.Header, headerBatchID)
		delete(out.Header, headerBatchSeq)
		if err != nil {
			// The batch has no commit: the servers drop it after their
			// batch timeout; the engine sends its messages alone.
			fail(err)
			return
		}
	}
	out := r.queueMsg(a.batch[last], a)
	out.Header[headerBatchID] = []string{id}
	out.Header[headerBatchSeq] = []string{strconv.Itoa(last + 1)}
	out.Header[headerBatchCommit] = []string{"1"}
	msgID := out.Header[jetstream.MsgIDHeader][0]
	done := func(ack jspub.Ack, err error) {
		o.err = refusal(err)
		if err == nil {
			r.queueTail.stored(ack.Sequence, msgID)
		}
		r.ackMu.Lock()
		r.acks = append(r.acks, o)
		r.ackMu.Unlock()
	}
	err := r.pub.Publish(out, done)
	delete(out.Header, headerBatchID)
	delete(out.Header, headerBatchSeq)
	delete(out.Header, headerBatchCommit)
	if err != nil {
		fail(err)
	}
}

// queueMsg returns m's message addressed to a's node's queue.
func (r *Router) queueMsg(m *msgRec, a action) *nats.Msg {
	out := outMsg(m)
	out.Subject = QueueSubject(a.node, m.subject)
	out.Header[jetstream.ExpectedStreamHeader] = r.expectQueue
	out.Header[HeaderEpoch] = a.epoch
	return out
}

// dropBatchHeaders removes the atomic batch headers from h, whatever
// their letter case.
func dropBatchHeaders(h nats.Header) {
	for k := range h {
		if len(k) >= len(headerBatchPrefix) && strings.EqualFold(k[:len(headerBatchPrefix)], headerBatchPrefix) {
			delete(h, k)
		}
	}
}
