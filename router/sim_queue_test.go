package router

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// simEntryKind says who stored a queue entry.
type simEntryKind uint8

const (
	simRouted simEntryKind = iota + 1 // a lane's publish
	simCaught                         // a catch-up publish
	simCopy                           // a drain's copy of another queue's entry
	simStaged                         // a staged catch-up message, on a node's held subject (stage.go)
)

// simHeld is the queue name of node's held subject: no consumer reads it.
func simHeld(node string) string { return "held:" + node }

func (k simEntryKind) String() string {
	switch k {
	case simRouted:
		return "routed"
	case simCaught:
		return "caught-up"
	case simCopy:
		return "copy"
	case simStaged:
		return "staged"
	}
	return "?"
}

// simEntry is one message of the queue stream (GROUPING_QUEUE).
type simEntry struct {
	sseq   uint64
	node   string // grouping.queue.<node>.>
	seq    uint64 // ingress sequence (Grouping-Ingress-Seq)
	group  string
	id     string // Nats-Msg-Id
	kind   simEntryKind
	by     string    // the node that published it
	origin *simEntry // a copy's original
	stored time.Duration
	rec    kvbinding.Binding // the group's record (in the bucket) when it was stored
	view   uint64            // the revision of the record the publishing node saw
	epoch  uint64            // HeaderEpoch

	removed bool // acked (work queue) or deleted
	acked   bool
	// pending: delivered and not acked (ack pending) since pendingAt.
	pending       bool
	pendingAt     time.Duration
	deliveries    int
	firstDelivery time.Duration
	// excuse names the crash window that lets this entry duplicate another
	// of the same ingress message ("" if none).
	excuse string
	// lapsed: first delivered from a queue being drained whose pause had
	// lapsed without a handler.
	lapsed bool
	// lapsedMove: a copy the drain made of a delivered message because its
	// consumer made no progress for its ack wait (simPub.lapsedMove).
	lapsedMove bool
	// msg: what was published (nil for a lane's publish: raw makes it).
	msg *nats.Msg
}

func (e *simEntry) String() string {
	return fmt.Sprintf("%s#%d(seq %d %s on %s by %s, id %s)", e.kind, e.sseq, e.seq, e.group, e.node, e.by, e.id)
}

type simIDRec struct {
	sseq uint64
	at   time.Duration
}

// simQueues is the queue stream with its duplicate window, the
// dead-letter stream and the queue consumers.
type simQueues struct {
	w       *simWorld
	seq     uint64
	all     []*simEntry
	byNode  map[string][]*simEntry
	ids     map[string]simIDRec
	lostIDs map[string]bool
	dlqIDs  map[string]bool
	cons    map[string]*simConsumer
}

func newSimQueues(w *simWorld) *simQueues {
	return &simQueues{w: w, byNode: map[string][]*simEntry{}, ids: map[string]simIDRec{}, lostIDs: map[string]bool{},
		dlqIDs: map[string]bool{}, cons: map[string]*simConsumer{}}
}

func simIngressID(seq uint64) string { return IngressStream + ":" + strconv.FormatUint(seq, 10) }

// simPub is what a node publishes: to a node's queue, or to the
// dead-letter stream (dlq).
type simPub struct {
	node   string // destination queue
	seq    uint64
	group  string
	id     string
	kind   simEntryKind
	origin *simEntry
	dlq    bool
	reason string
	view   uint64 // the revision of the group's record the publishing node saw
	epoch  uint64 // HeaderEpoch
	// lapsedMove: a drain's copy of a message its old consumer had been
	// delivered and not acked, moved because that consumer made no
	// progress for its ack wait (HeaderDeliveredBefore).
	lapsedMove bool
	// msg: the message the hand-over published (nil for a lane's).
	msg *nats.Msg
}

// store stores a publish that reached the server; it returns the stream
// sequence and whether it was a duplicate (then the first copy's sequence,
// as JetStream acks it).
func (q *simQueues) store(by string, p simPub) (uint64, bool) {
	w := q.w
	if p.dlq {
		if q.dlqIDs[p.id] {
			return 0, true
		}
		q.dlqIDs[p.id] = true
		w.chk.deadLettered(by, p.seq, p.reason)
		return 0, false
	}
	r, known := q.ids[p.id]
	if known && w.clock-r.at < queueDuplicates {
		return r.sseq, true
	}
	e := &simEntry{node: p.node, seq: p.seq, group: p.group, id: p.id, kind: p.kind, by: by, origin: p.origin, stored: w.clock,
		rec: w.kv.recs[p.group], view: p.view, lapsedMove: p.lapsedMove, epoch: p.epoch, msg: p.msg}
	switch {
	case known:
		e.excuse = "the first copy's id had left the queue stream's 2 min duplicate window"
	case q.lostIDs[p.id]:
		e.excuse = "a queue server restart had lost the duplicate window of consumed messages"
	}
	q.seq++
	e.sseq = q.seq
	q.all = append(q.all, e)
	q.byNode[p.node] = append(q.byNode[p.node], e)
	q.ids[p.id] = simIDRec{sseq: e.sseq, at: w.clock}
	delete(q.lostIDs, p.id)
	w.logf("queue", "stored %v", e)
	switch held := strings.HasPrefix(e.node, simHeld("")); {
	case e.kind == simStaged:
		w.chk.stats.staged++
	case held && e.kind == simRouted:
		w.chk.stats.heldBack++
	case e.kind == simCopy && e.origin != nil && e.origin.kind == simRouted && e.origin.node == simHeld(e.node) && e.by == e.node:
		w.chk.stats.released++
	}
	w.chk.stored(e)
	q.consumer(p.node).kick()
	return e.sseq, false
}

// next returns node's first message at or after sseq (a direct get with a
// subject filter), or nil.
func (q *simQueues) next(node string, sseq uint64) *simEntry {
	for _, e := range q.byNode[node] {
		if e.sseq >= sseq && !e.removed {
			return e
		}
	}
	return nil
}

// deleteMsg deletes a message; false: it is gone already.
func (q *simQueues) deleteMsg(sseq uint64) bool {
	if sseq == 0 || sseq > uint64(len(q.all)) {
		return false
	}
	e := q.all[sseq-1]
	if e.removed {
		return false
	}
	e.removed, e.pending = true, false
	q.w.logf("queue", "deleted %v", e)
	return true
}

// subjects counts the stored messages of each subject matching filter
// (a stream state's Subjects).
func (q *simQueues) subjects(filter string) map[string]uint64 {
	out := map[string]uint64{}
	for _, e := range q.all {
		if subj := e.subject(); !e.removed && server.SubjectMatchesFilter(subj, filter) {
			out[subj]++
		}
	}
	return out
}

// firstLast returns the stream's first and last sequences.
func (q *simQueues) firstLast() (uint64, uint64) {
	for _, e := range q.all {
		if !e.removed {
			return e.sseq, q.seq
		}
	}
	return q.seq + 1, q.seq
}

// loseWindow is a queue server restart: the duplicate window is rebuilt
// from the stored messages, so the ids of consumed or deleted ones are
// forgotten.
func (q *simQueues) loseWindow() {
	for id, r := range q.ids {
		if q.all[r.sseq-1].removed {
			delete(q.ids, id)
			q.lostIDs[id] = true
		}
	}
}

func (q *simQueues) consumer(node string) *simConsumer {
	c := q.cons[node]
	if c == nil {
		c = &simConsumer{q: q, node: node}
		q.cons[node] = c
	}
	return c
}

// simConsumer is the durable consumer of one node's queue and the
// application pulling from it: it is delivered up to prefetch messages in
// stream order, processes them one at a time and acks each. It may leave
// (gracefully: it finishes and acks what it holds; or by dying: what it
// holds is redelivered after the ack wait) and come back, and the handler
// may pause it.
type simConsumer struct {
	q           *simQueues
	node        string
	present     bool
	leaving     bool
	lagUntil    time.Duration // still reported as present (pull requests waiting) until
	pausedUntil time.Duration
	held        []*simEntry
	busy        bool
	gen         uint64
	acks        uint64
	kicked      bool
}

// hasConsumer is what the node announces (num_waiting > 0).
func (c *simConsumer) hasConsumer() bool {
	return (c.present && !c.leaving) || c.q.w.clock < c.lagUntil
}

// view is what JetStream's consumer info tells a drain (consumerView):
// the last stream sequence delivered, the ack floor (every message of the
// queue at or below it acked or removed), the messages ack pending, and
// the ack wait. The durable consumer exists from the start.
func (c *simConsumer) view() consumerView {
	v := consumerView{exists: true, ackWait: c.q.w.p.ackWait, pending: c.ackPending()}
	floorDone := true
	for _, e := range c.q.byNode[c.node] {
		if e.deliveries > 0 {
			v.delivered = max(v.delivered, e.sseq)
		}
		if floorDone && e.removed {
			v.ackFloor = e.sseq
		} else {
			floorDone = false
		}
	}
	return v
}

// ackPending is the consumer's NumAckPending.
func (c *simConsumer) ackPending() int {
	n := 0
	for _, e := range c.q.byNode[c.node] {
		if e.pending && !e.removed {
			n++
		}
	}
	return n
}

func (c *simConsumer) paused() bool { return c.q.w.clock < c.pausedUntil }

func (c *simConsumer) kick() {
	if c.kicked {
		return
	}
	c.kicked = true
	c.q.w.after(c.q.w.between(50*time.Microsecond, time.Millisecond), func() {
		c.kicked = false
		c.pump()
	})
}

func (c *simConsumer) pump() {
	w := c.q.w
	if !c.present || c.leaving {
		return
	}
	if c.paused() {
		until := c.pausedUntil
		w.after(until-w.clock, func() { c.kick() })
		return
	}
	for len(c.held) < w.p.prefetch {
		e := c.nextDeliverable()
		if e == nil {
			break
		}
		c.deliver(e)
	}
	if !c.busy && len(c.held) > 0 {
		c.busy = true
		c.process(c.gen)
	}
}

// nextDeliverable is the first message neither removed nor ack pending
// (or whose ack wait ran out: redelivered).
func (c *simConsumer) nextDeliverable() *simEntry {
	w := c.q.w
	for _, e := range c.q.byNode[c.node] {
		if e.removed {
			continue
		}
		if e.pending && w.clock-e.pendingAt < w.p.ackWait {
			continue
		}
		return e
	}
	return nil
}

func (c *simConsumer) deliver(e *simEntry) {
	w := c.q.w
	e.pending, e.pendingAt = true, w.clock
	e.deliveries++
	if e.deliveries == 1 {
		e.firstDelivery = w.clock
	}
	c.held = append(c.held, e)
	w.logf("consumer", "%s's consumer is delivered %v (delivery %d)", c.node, e, e.deliveries)
	w.chk.delivered(e)
	// Should it not be acked, it is redelivered after the ack wait.
	w.after(w.p.ackWait, func() { c.kick() })
}

func (c *simConsumer) process(gen uint64) {
	w := c.q.w
	d := w.between(200*time.Microsecond, 15*time.Millisecond)
	if w.chance(w.p.pSlowCons) {
		d = w.between(time.Second, 4*time.Second)
	}
	w.after(d, func() {
		if c.gen != gen || len(c.held) == 0 {
			return
		}
		e := c.held[0]
		c.held[0] = nil
		c.held = c.held[1:]
		w.after(w.lat(), func() {
			if !e.removed {
				e.removed, e.acked, e.pending = true, true, false
				c.acks++
			}
		})
		if len(c.held) > 0 {
			c.process(gen)
			return
		}
		c.busy = false
		if c.leaving {
			c.gone(false)
			return
		}
		c.pump()
	})
}

// leave makes the consumer go: gracefully (it finishes what it holds) or
// by dying (what it holds stays ack pending until the ack wait).
func (c *simConsumer) leave(graceful bool) {
	w := c.q.w
	w.logf("consumer", "%s's consumer leaves (graceful %v)", c.node, graceful)
	if graceful && c.busy {
		c.leaving = true
		return
	}
	c.gone(!graceful)
}

func (c *simConsumer) gone(died bool) {
	w := c.q.w
	c.present, c.leaving, c.busy = false, false, false
	c.gen++
	c.held = nil
	c.lagUntil = w.clock + w.between(0, 3*time.Second)
	if died {
		w.logf("consumer", "%s's consumer died", c.node)
	}
}

func (c *simConsumer) back() {
	if c.present && !c.leaving {
		return
	}
	c.q.w.logf("consumer", "%s's consumer is back", c.node)
	c.present, c.leaving = true, false
	c.kick()
}
