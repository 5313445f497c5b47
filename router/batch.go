package router

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// dropBatchHeaders removes the atomic batch headers from h, whatever
// their letter case.
func dropBatchHeaders(h nats.Header) {
	for k := range h {
		if len(k) >= len(headerBatchPrefix) && strings.EqualFold(k[:len(headerBatchPrefix)], headerBatchPrefix) {
			delete(h, k)
		}
	}
}
