package router

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/proposals"
)

// Messages a node stored on a queue and the servers lost. A server that
// acknowledged a write before it reached the disk (the servers' fsync
// policy: docs/operations.md) can come back without it, and without its
// sequence: the stream's end goes back, and the next writes reuse the
// lost sequences. The node keeps the highest queue sequence a PubAck gave
// it, with its message's id, and every storeCheckEvery looks at the
// queue: a stream ending below that sequence, or holding another message
// there, lost what the node stored (nothing there is no verdict: a work
// queue deletes what its consumer acked). The node cannot tell which of
// the lost sequences were its own and not yet consumed; it counts the
// rewind and the sequences (Stats.QueueRewinds, QueueLostSeqs and their
// metrics), logs at error and announces a "queue-loss" event, once per
// lost position. The same check for the bindings bucket is the binding
// cache's (kvbinding.Cache.Rewinds), announced as a "bindings-rewind"
// event.

// storeCheckEvery is how often a node checks its queue for lost writes.
const storeCheckEvery = 5 * time.Second

// queueTail is the highest queue sequence this node's publishes were
// acknowledged at, with the message's id.
type queueTail struct {
	mu       sync.Mutex
	seq      uint64
	id       string
	reported uint64 // the seq a loss was reported for (once per position)

	rewinds, lost atomic.Uint64
	orphans       atomic.Uint64 // acknowledged queue messages removed (sweepOrphans)
}

// stored records that the message with id was stored at seq.
func (t *queueTail) stored(seq uint64, id string) {
	t.mu.Lock()
	if seq > t.seq {
		t.seq, t.id = seq, id
	}
	t.mu.Unlock()
}

// queueLost decides whether the queue lost the message a node stored at
// seq with id: its last sequence is now last, and at seq it holds a
// message with atID (found false: none). It returns the lost sequences
// when it did: all from last+1 (or seq alone when seq holds another
// message now). An answer without a stream leader (leader false) decides
// nothing: a member of a group that has no leader answers stream info
// from its own store, which may end below what the leader acknowledged;
// a real loss is still there when a leader answers. (A leader's answer
// cannot be behind a PubAck: the leader sends it once it stored the
// message, and a new leader answers only once it applied what its
// predecessor committed.)
func queueLost(seq uint64, id string, last uint64, found bool, atID string, leader bool) (lo, hi uint64, lost bool) {
	switch {
	case !leader:
	case last < seq:
		return last + 1, seq, true
	case found && atID != id:
		return seq, seq, true
	}
	return 0, 0, false
}

// queueCheck is a node's store check of its queue: it keeps what the
// node's publishes were last acknowledged at (stored), and every
// storeCheckEvery looks for lost writes (checkTail) and removes this
// node's acknowledged messages the queue kept (sweepOrphans).
type queueCheck struct {
	js   jetstream.JetStream
	nc   *nats.Conn // for the queue-loss event
	node string
	log  *slog.Logger
	// orphans: the removals, one line per interval.
	orphans *logagg.Warner
	tail    queueTail
}

func newQueueCheck(js jetstream.JetStream, nc *nats.Conn, node string, log *slog.Logger) *queueCheck {
	return &queueCheck{js: js, nc: nc, node: node, log: log,
		orphans: logagg.New(log, "removed an acknowledged message the queue stream kept (a server restarted as its consumer acknowledged)", logagg.DefaultEvery)}
}

// stored records that this node's message with id was stored at seq.
func (q *queueCheck) stored(seq uint64, id string) { q.tail.stored(seq, id) }

// run checks the queue every storeCheckEvery until ctx ends.
func (q *queueCheck) run(ctx context.Context) {
	every(ctx, storeCheckEvery, func() { q.check(ctx) })
}

// close flushes the removals' warning.
func (q *queueCheck) close() { q.orphans.Close() }

// check reads the queue stream once, looks for lost writes (checkTail),
// then removes this node's acknowledged messages the queue kept
// (sweepOrphans).
func (q *queueCheck) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// The tail first: a publish acknowledged after the stream's info is
	// read lies past the end that info shows, and read the other way round
	// it looked like a loss (a demo without any fault reported one).
	tail := q.tail.snapshot()
	s, err := q.js.Stream(ctx, QueueStream)
	if err != nil {
		q.log.Debug("queue stream not read for its checks; trying again later", "err", err)
		return
	}
	q.checkTail(ctx, s, tail)
	q.sweepOrphans(ctx, s)
}

// tailSnapshot is queueTail's state at one moment.
type tailSnapshot struct {
	seq      uint64
	id       string
	reported uint64
}

func (t *queueTail) snapshot() tailSnapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	return tailSnapshot{seq: t.seq, id: t.id, reported: t.reported}
}

// maxOrphanSweep bounds the messages one sweep removes.
const maxOrphanSweep = 100

// sweepOrphans removes the messages of this node's queue that lie at
// or below its consumer's ack floor: acknowledged, yet kept by the work
// queue. A server restarted while the consumer acknowledged can come back
// holding such a message (seen on a single server, about one restart in
// five under a burst, with atomic and fast-ingest batches alike;
// nats-server issue 3996 describes the class). Nothing delivers it again,
// and a move treats it as done, but it would hold queue room and show as
// a backlog for good.
// Every removal is logged and counted (Stats.QueueOrphans).
//
// A node that found the queue rewound (checkTail: the servers lost
// acknowledged writes) sweeps no more: the next writes reuse the lost
// sequences, so a message at or below a consumer's ack floor may then be
// one it never saw. It is left in place for an operator (its Nats-Msg-Id
// names its ingress message).
func (q *queueCheck) sweepOrphans(ctx context.Context, s jetstream.Stream) {
	if q.tail.rewinds.Load() > 0 {
		q.log.Debug("no orphan sweep: the queue stream lost writes, a message below the ack floor may never have been delivered")
		return
	}
	first := s.CachedInfo().State.FirstSeq
	c, err := s.Consumer(ctx, QueueConsumer(q.node))
	if err != nil {
		q.log.Debug("queue consumer not read for the orphan sweep; trying again later", "err", err)
		return
	}
	floor := c.CachedInfo().AckFloor.Stream
	for seq, n := max(first, 1), 0; seq <= floor && n < maxOrphanSweep; n++ {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(QueueFilter(q.node)))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return
		case err != nil:
			q.log.Debug("queue not read for the orphan sweep; trying again later", "from_seq", seq, "err", err)
			return
		case m.Sequence > floor:
			return
		}
		if err := s.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			q.log.Debug("acknowledged queue message not removed; trying again later", "seq", m.Sequence, "err", err)
			return
		}
		q.tail.orphans.Add(1)
		q.log.Debug("removed an acknowledged queue message the stream kept", "seq", m.Sequence, "subject", m.Subject, "ack_floor", floor)
		q.orphans.Warn(q.node, "seq", m.Sequence, "subject", m.Subject, "ack_floor", floor,
			"msg_id", nats.Header(m.Header).Get(jetstream.MsgIDHeader))
		seq = m.Sequence + 1
	}
}

// checkTail looks in s, the queue stream as read after tail was
// taken, for the last message this node had stored there then (queueLost).
func (q *queueCheck) checkTail(ctx context.Context, s jetstream.Stream, tail tailSnapshot) {
	t := &q.tail
	seq, id, reported := tail.seq, tail.id, tail.reported
	if seq == 0 || seq == reported {
		return
	}
	info := s.CachedInfo()
	last, leader := info.State.LastSeq, info.Cluster == nil || info.Cluster.Leader != ""
	found, atID := false, ""
	if last >= seq {
		m, err := s.GetMsg(ctx, seq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			q.log.Debug("queue message not read for the lost-writes check; trying again later", "seq", seq, "err", err)
			return
		default:
			found, atID = true, nats.Header(m.Header).Get(jetstream.MsgIDHeader)
		}
	}
	lo, hi, lost := queueLost(seq, id, last, found, atID, leader)
	if !lost {
		return
	}
	t.mu.Lock()
	t.reported = seq
	t.mu.Unlock()
	t.rewinds.Add(1)
	t.lost.Add(hi - lo + 1)
	q.log.Error("the queue stream lost messages this node stored there: its servers lost acknowledged writes; "+
		"those of this node's messages in the lost sequences that were not consumed yet will not be delivered",
		"from_seq", lo, "to_seq", hi, "stream_last", last, "stored_at", seq, "msg_id", id)
	proposals.Event{Kind: proposals.EventQueueLoss, Node: q.node, By: q.node, FromSeq: lo,
		Count: int(min(hi-lo+1, 1<<31-1)),
		Reason: "queue sequences " + strconv.FormatUint(lo, 10) + "-" + strconv.FormatUint(hi, 10) +
			" lost by the servers (this node stored " + id + " at " + strconv.FormatUint(seq, 10) + ")"}.Publish(q.nc)
}

// bindingsRewound announces that the binding cache found the bindings
// bucket below what it had read (kvbinding.CacheConfig.OnRewind).
func (r *Router) bindingsRewound(seen, last uint64) {
	proposals.Event{Kind: proposals.EventBucketRewind, Node: r.cfg.Node, By: r.cfg.Node, FromSeq: last + 1,
		Count: int(min(seen-min(last, seen), 1<<31-1)),
		Reason: "the bindings bucket ends at revision " + strconv.FormatUint(last, 10) + " (or lost what it held there), below revision " +
			strconv.FormatUint(seen, 10) + " this node had read: its servers lost acknowledged writes; the node read it again"}.Publish(r.nc)
}
