package router

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/grouprouter/grouprouter/internal/jspub"
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
	// maxFastInFlight bounds a node's fast-ingest batches in flight (the
	// servers take 1,000 per stream).
	maxFastInFlight = 64
)

// queueBatch returns the batch size this node publishes with and whether
// its batches are fast-ingest ones: Config.MaxBatch on a queue stream that
// allows them, else 1 (no batches). A replicated stream takes atomic
// batches: all of a batch is stored or none, as one proposal of its
// replicas. A stream of one replica takes fast-ingest batches (stored as
// they come, a gap ends the batch): on R1 file storage an atomic batch
// costs more than its messages published one by one (docs/performance.md,
// "One group"). A LOCAL node allows them on a queue stream created before
// them (an update of its configuration); should that fail (no permission
// to update streams, servers before 2.12 or 2.14), the node publishes one
// message at a time and says so.
func (r *Router) queueBatch(ctx context.Context) (int, bool) {
	if r.cfg.MaxBatch < 2 {
		return 1, false
	}
	s, err := r.js.Stream(ctx, QueueStream)
	if err != nil {
		r.log.Warn("queue stream not read: publishing one message at a time per group", "err", err)
		return 1, false
	}
	c := s.CachedInfo().Config
	fast := c.Replicas < 2
	// allows is the setting that allows the batches of the stream's kind.
	allows, kind := func(c *jetstream.StreamConfig) *bool { return &c.AllowAtomicPublish }, "atomic"
	if fast {
		allows, kind = func(c *jetstream.StreamConfig) *bool { return &c.AllowBatchPublish }, "fast-ingest"
	}
	if *allows(&c) {
		return r.cfg.MaxBatch, fast
	}
	if r.cfg.Type != Local {
		r.log.Info("the queue stream does not allow "+kind+" batches (yet: a LOCAL node allows them when it starts): publishing one message at a time per group",
			"stream", QueueStream)
		return 1, false
	}
	*allows(&c) = true
	uctx, cancel := context.WithTimeout(ctx, 5*time.Second) // a denied request gets no answer
	defer cancel()
	us, err := r.js.UpdateStream(uctx, c)
	if err != nil || !*allows(&us.CachedInfo().Config) {
		r.log.Warn("could not allow "+kind+" batches on the queue stream: publishing one message at a time per group",
			"stream", QueueStream, "err", err, "hint", "nats-server 2.14 or later, and the right to update the stream")
		return 1, false
	}
	r.log.Info("the queue stream now allows "+kind+" batches", "stream", QueueStream)
	return r.cfg.MaxBatch, fast
}

// publishBatch carries out an actBatch: the lane's first messages onto the
// node's queue as one atomic batch. Only the commit asks for a reply; the
// outcome of the whole batch goes back to the engine. A message's batch
// headers are removed once it is sent (the commit's are a copy's): should
// the batch fail, it is sent again alone.
func (r *Router) publishBatch(a action) {
	if r.out.fast {
		r.publishFastBatch(a)
		return
	}
	id := nuid.Next()
	o := a.outcome()
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
			r.batchNotSent(o, err)
			return
		}
	}
	// The commit goes as a copy with headers of its own: its outcome may
	// come back before Publish returns, and the engine may then send the
	// message again alone from another goroutine, so the message is not
	// touched once the commit is sent.
	out := r.queueMsg(a.batch[last], a)
	h := make(nats.Header, len(out.Header)+3)
	for k, v := range out.Header {
		h[k] = v
	}
	h[headerBatchID] = []string{id}
	h[headerBatchSeq] = []string{strconv.Itoa(last + 1)}
	h[headerBatchCommit] = []string{"1"}
	commit := &nats.Msg{Subject: out.Subject, Header: h, Data: out.Data}
	err := r.out.pub.Publish(commit, r.batchDone(o, h[jetstream.MsgIDHeader][0]))
	if err != nil {
		r.batchNotSent(o, err)
	}
}

// batchDone returns the callback of a batch's PubAck: the outcome goes to
// the engine with the publisher's next batch end (ackBatch), and a stored
// batch's last message, msgID, is the queue tail this node knows of
// (Sequence 0, a fast-ingest batch of duplicates only, changes nothing).
func (r *Router) batchDone(o outcome, msgID string) jspub.Callback {
	return func(ack jspub.Ack, err error) {
		o.err = refusal(err)
		o.seq = ack.Sequence
		if err == nil {
			r.qcheck.stored(ack.Sequence, msgID)
		}
		r.out.outcomes.add(o)
	}
}

// batchNotSent hands the engine a batch that could not be sent whole.
func (r *Router) batchNotSent(o outcome, err error) {
	o.err = err
	r.outcomes([]outcome{o})
}

// publishFastBatch carries out an actBatch on a stream of one replica: the
// lane's first messages as one fast-ingest batch (jspub.PublishBatch), one
// PubAck for all of them. A batch that ends short may have stored a prefix
// of its messages, never one after a gap: the engine sends them again one
// at a time, and each stored one is dropped then as a duplicate of its
// Nats-Msg-Id (the queue stream's duplicate window), so the group's order
// and its exactly-once hold.
func (r *Router) publishFastBatch(a action) {
	o := a.outcome()
	msgs := make([]*nats.Msg, len(a.batch))
	for i, m := range a.batch {
		msgs[i] = r.queueMsg(m, a)
	}
	if err := r.out.pub.PublishBatch(msgs, r.batchDone(o, msgs[len(msgs)-1].Header[jetstream.MsgIDHeader][0])); err != nil {
		r.batchNotSent(o, err)
	}
}

// queueMsg returns m's message addressed to a's node's queue.
func (r *Router) queueMsg(m pubMsg, a action) *nats.Msg {
	out := outMsg(m.seq, m.payload)
	out.Subject = QueueSubject(a.node, m.subject)
	if a.held {
		out.Subject = HeldSubject(a.node, a.group, m.subject)
	}
	out.Header[jetstream.ExpectedStreamHeader] = r.out.expect
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
