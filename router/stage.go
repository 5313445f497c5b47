package router

import (
	"context"
	"slices"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// Staging a catch-up (docs/protocol.md, "Remaining windows").
//
// A take-over that drains starts from the old node's fence or, when the
// old node is gone, from its checkpoint: the old node may have routed
// some of the catch-up's messages after that checkpoint, and its
// consumer may have consumed them. The catch-up's publishes carry the
// ingress ids, so the queue stream's duplicate window drops those, unless
// a server restart rebuilt the window in between from what is still
// stored (nats-io/nats-server#3272): then they are stored and delivered
// a second time. The drain before the catch-up can take up to the ack
// wait (a cut-off consumer holding messages), long enough for a rolling
// restart of the servers.
//
// So the drain step of an evacuated group (proposals.Evacuated) that the
// old queues hold some of stages its catch-up as soon as the scan is over,
// beside the wait for the old consumer: it publishes the catch-up's
// messages, with their ingress ids, onto this node's held subject, which
// no consumer reads. The window answers at once which of them the old
// node routed (a duplicate: skipped by the catch-up) and keeps the others
// (staged copies); the catch-up then moves the staged copies onto the
// queue in order, after what the drain moved, instead of publishing them
// from the ingress. A copy the old node's held-back publish lands after
// the staging is dropped as a duplicate too. A group the old queues hold
// nothing of is reported drained at once and caught up from the ingress
// within milliseconds; a fenced group's record starts where its node
// stopped routing. What stays open is a restart between the old node's
// publishes and the scan (the grace, 15 s by default).
//
// A staged copy is an ordinary held message of the group: a successor
// that evacuates this node drains it with the rest of its held subject,
// and this node's own fair shell does not count it (restoreHeld skips
// groups taken over by this node).

// stagedSpan is what a drain step's staging learned of one group.
type stagedSpan struct {
	epoch       uint64 // the take-over's (the record's OwnerEpoch)
	from, until uint64 // the ingress span staged
	// whole: every message of the span is known here (a staged copy kept
	// in memory, routed, or in rest): the catch-up does not read the
	// ingress again.
	whole bool
	// rest: the span's messages not staged (their held subject would be
	// too long), ready to publish onto this node's queue.
	rest map[uint64]*nats.Msg
	// copies: ingress sequence -> its staged copy on this node's held
	// subject.
	copies map[uint64]stagedCopy
	// routed: ingress sequences the duplicate window showed stored by
	// another publisher (the old node): not routed again. Each maps to
	// the queue-stream sequence of the copy the duplicate named, when it
	// was still stored (0: gone): the catch-up looks at it again in its
	// turn, and moves it here should the drain have missed it (it landed
	// after the drain looked).
	routed map[uint64]uint64
}

// stagedCopy is a staged copy: its queue-stream sequence, and the message
// as staged while this process keeps it (nil: read back to be moved).
type stagedCopy struct {
	at  uint64
	msg *nats.Msg
}

// stageKeepBytes bounds the staged messages one staging keeps in memory
// for its catch-up (past it, the catch-up reads them back). A variable
// for the tests.
var stageKeepBytes = 64 << 20

// stagedOf returns the staging of group for epoch, or nil.
func (q *dutyQueue) stagedOf(group string, epoch uint64) *stagedSpan {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s := q.staged[group]; s != nil && s.epoch == epoch {
		return s
	}
	return nil
}

// toStage sorts the groups of routes a drain's scan found nothing (none)
// or some of on the old queues: an evacuated group of some is staged; the
// others are not (notStaged).
func toStage(routes map[string]kvbinding.Binding, none, some []string) (stage map[string]kvbinding.Binding, not []string) {
	stage = map[string]kvbinding.Binding{}
	for _, g := range some {
		if proposals.Evacuated(routes[g]) {
			stage[g] = routes[g]
		} else {
			not = append(not, g)
		}
	}
	return stage, append(not, none...)
}

// keepStagedLocked keeps s, what a staging learned of group, merged into
// what an earlier staging of the same take-over learned (a retry stages
// past it), and returns what is kept. A record of nothing staged
// (notStaged: another step of the take-over, at another revision, found
// the old queues empty meanwhile) is replaced. q.mu is held.
func (q *dutyQueue) keepStagedLocked(group string, s *stagedSpan) *stagedSpan {
	if old := q.staged[group]; old != nil && old.epoch == s.epoch && old.copies != nil {
		old.whole = old.whole && s.whole && s.from == old.until
		for is, m := range s.rest {
			old.rest[is] = m
		}
		for is, c := range s.copies {
			old.copies[is] = c
		}
		for is, at := range s.routed {
			old.routed[is] = max(old.routed[is], at)
		}
		old.until = max(old.until, s.until)
		s = old
	}
	q.staged[group] = s
	return s
}

// notStaged records that the drain step of group's take-over in epoch
// staged nothing (its old queues held nothing of it, or it was not
// evacuated): its catch-up reads the ingress and does not look for staged
// copies (needsStaging).
func (q *dutyQueue) notStaged(group string, epoch uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s := q.staged[group]; s == nil || s.epoch != epoch {
		q.staged[group] = &stagedSpan{epoch: epoch}
	}
}

// stage stages the catch-ups of the groups of routes (see above): groups
// with an ungrouped or too long subject, the ungrouped routing binding,
// and every group when the queue stream takes no held subject are not
// staged (their catch-up publishes from the ingress).
func (h *handOver) stage(ctx context.Context, routes map[string]kvbinding.Binding) error {
	if !h.holds {
		return nil
	}
	h.forgetStaged()
	type span struct{ from, until uint64 }
	spans := map[string]span{}
	var lo, hi uint64
	lost := h.lostThrough(ctx, routes)
	for g, route := range routes {
		if g == "" {
			continue
		}
		laneFrom := h.takeoverFrom(g)
		h.duties.mu.Lock()
		from, until := catchUpSpan(route, laneFrom, 0, max(h.duties.caught[g], lost[g]))
		if s := h.duties.staged[g]; s != nil && s.epoch == route.Epoch {
			from = max(from, s.until) // staged before this retry
		}
		h.duties.mu.Unlock()
		if from >= until {
			continue
		}
		spans[g] = span{from, until}
		if lo == 0 || from < lo {
			lo = from
		}
		hi = max(hi, until)
	}
	if lo == 0 {
		return nil
	}
	byGroup := map[string][]*nats.Msg{}
	rest := map[string]map[uint64]*nats.Msg{}
	pins := h.pinnedCheckpoints(ctx, routes)
	err := h.readIngress(ctx, lo, hi, func(seq uint64, msg jetstream.Msg) {
		g, invalid := h.classify(msg.Headers(), msg.Subject())
		s, ok := spans[g]
		if !ok || invalid != "" || seq < s.from || seq >= s.until {
			return
		}
		if c, ok := pins[g]; ok && c.Done(seq) {
			return // the old node finished it (Binding.Ckpt)
		}
		out := prepare(seq, msg.Headers(), msg.Data())
		out.Header.Set(jetstream.ExpectedStreamHeader, QueueStream)
		out.Header[HeaderEpoch] = []string{strconv.FormatUint(routes[g].Epoch, 10)}
		if !heldFits(msg.Subject()) {
			out.Subject = QueueSubject(h.node, msg.Subject())
			if rest[g] == nil {
				rest[g] = map[uint64]*nats.Msg{}
			}
			rest[g][seq] = out
			return
		}
		out.Subject = HeldSubject(h.node, g, msg.Subject())
		out.Header[headerStaged] = []string{h.node}
		byGroup[g] = append(byGroup[g], out)
	})
	if err != nil {
		return err
	}
	stream, err := h.io.queue(ctx)
	if err != nil {
		return err
	}
	// Staged copies are read in ingress order by the catch-up, whatever
	// order they are stored in: their publishes all run at once.
	var mu sync.Mutex
	learned := map[string]*stagedSpan{}
	kept := 0
	for g, sp := range spans {
		learned[g] = &stagedSpan{epoch: routes[g].Epoch, from: sp.from, until: sp.until, whole: true,
			copies: map[uint64]stagedCopy{}, routed: map[uint64]uint64{}, rest: rest[g]}
		if learned[g].rest == nil {
			learned[g].rest = map[uint64]*nats.Msg{}
		}
	}
	work, wctx := errgroup.WithContext(ctx)
	work.SetLimit(256)
	returned := map[string]int{} // per group, the publishes that returned
	for g, msgs := range byGroup {
		s := learned[g]
		for _, m := range msgs {
			is, _ := strconv.ParseUint(m.Header.Get(HeaderIngressSeq), 10, 64)
			work.Go(func() error {
				ack, err := h.publishSync(wctx, m, func() bool { return h.current(g, routes[g].Revision) })
				if err != nil {
					return err
				}
				held := heldMine
				if ack.Duplicate {
					if held, err = h.heldCopy(wctx, stream, ack.Sequence, is); err != nil {
						return err
					}
				}
				mu.Lock()
				defer mu.Unlock()
				returned[g]++
				switch held {
				case heldRouted:
					s.routed[is] = ack.Sequence
					return nil
				case heldGone:
					s.routed[is] = 0
					return nil
				case heldElsewhere:
					// Staged by an earlier taker that did not finish: the
					// catch-up reads it from the ingress and, its publish
					// finding that copy, moves it in its turn
					// (takeLateCopy). It is not the old node's routing.
					s.whole = false
					return nil
				}
				c := stagedCopy{at: ack.Sequence}
				if size := len(m.Data) + headerSize(m.Header); kept+size <= stageKeepBytes {
					c.msg, kept = m, kept+size
				} else {
					s.whole = false
				}
				s.copies[is] = c
				return nil
			})
		}
	}
	err = work.Wait()
	// What was learned of the groups whose publishes all returned is kept
	// when others failed: a retry stages those only past it.
	h.duties.mu.Lock()
	copies, routed := 0, 0
	for g, s := range learned {
		if err != nil && returned[g] < len(byGroup[g]) {
			// Some of its publishes did not return: staged again whole by
			// the retry (what this one stored comes back as its own).
			continue
		}
		s = h.duties.keepStagedLocked(g, s)
		copies += len(s.copies)
		routed += len(s.routed)
	}
	h.duties.mu.Unlock()
	if len(learned) > 0 {
		h.log.Debug("hand-over: catch-ups staged on the held subject", "groups", len(learned), "staged", copies, "routed_by_old_node", routed)
	}
	return err
}

// forgetStaged forgets the staging of groups whose record no longer asks
// this node to take them over in the staging's epoch (a successor took
// them; their staged copies are its to drain).
func (h *handOver) forgetStaged() {
	h.duties.mu.Lock()
	epochs := make(map[string]uint64, len(h.duties.staged))
	for g, s := range h.duties.staged {
		epochs[g] = s.epoch
	}
	h.duties.mu.Unlock()
	var gone []string
	for g, epoch := range epochs {
		b, ok := h.lookup(g)
		if !ok || !b.Phase().TakingOver() || b.Node != h.node || b.Epoch != epoch {
			gone = append(gone, g)
		}
	}
	if len(gone) == 0 {
		return
	}
	h.duties.mu.Lock()
	for _, g := range gone {
		if s := h.duties.staged[g]; s != nil && s.epoch == epochs[g] {
			delete(h.duties.staged, g)
		}
	}
	h.duties.mu.Unlock()
}

// stagedSeqs returns, in order, the ingress sequences in [from, until)
// that s keeps a staged copy or an unstaged message of (not those the
// window showed routed).
func stagedSeqs(s *stagedSpan, from, until uint64) []uint64 {
	seqs := make([]uint64, 0, len(s.copies)+len(s.rest))
	for is := range s.copies {
		if is >= from && is < until {
			seqs = append(seqs, is)
		}
	}
	for is := range s.rest {
		if is >= from && is < until {
			seqs = append(seqs, is)
		}
	}
	slices.Sort(seqs)
	return seqs
}

// readIngressSpan is readIngress for [lo, hi), nothing when lo is 0.
func (h *handOver) readIngressSpan(ctx context.Context, lo, hi uint64, fn func(seq uint64, msg jetstream.Msg)) error {
	if lo == 0 {
		return nil
	}
	return h.readIngress(ctx, lo, hi, fn)
}

// What the queue stream's message named by the ack of a duplicate of a
// staged copy is (heldCopy).
type heldKind uint8

const (
	// heldMine: this node's staged copy of the message.
	heldMine heldKind = iota
	// heldElsewhere: another node's staged copy (headerStaged), still
	// stored: an earlier taker of the group staged it and did not finish.
	heldElsewhere
	// heldRouted: the old node routed it: the copy is stored on its queue
	// (or its held subject, as the fair share holds back).
	heldRouted
	// heldGone: the copy is gone (consumed, or moved by the drain or an
	// earlier catch-up).
	heldGone
)

// headerStaged marks a staged copy (on its taker's held subject) with the
// node that staged it: a drain leaves it to the catch-up (scanQueues),
// which moves it in its turn. It never reaches a queue: a copy drops it.
const headerStaged = "Grouping-Staged"

// heldCopy says what the queue stream's message at seq, named by the ack
// of a duplicate of the staged copy of ingress message is, is.
func (h *handOver) heldCopy(ctx context.Context, stream msgStore, seq, is uint64) (heldKind, error) {
	m, err := h.getAgain(ctx, stream, seq)
	if isGone(err) {
		return heldGone, nil
	}
	if err != nil {
		return heldGone, err
	}
	node, held, ok := queueOwner(m.Subject)
	switch {
	case !ok || m.Header.Get(HeaderIngressSeq) != strconv.FormatUint(is, 10):
		return heldGone, nil
	case !held:
		return heldRouted, nil
	case node == h.node:
		return heldMine, nil
	case m.Header.Get(headerStaged) != "":
		return heldElsewhere, nil
	}
	return heldRouted, nil
}

// needsStaging reports whether a catch-up step's group may have been
// staged by a drain step that this process has no memory of (it restarted
// since): a record that came through a drain has its epoch at the drain
// record's revision, below its own (its Reason is gone, so a fence's
// drain is staged again too: nothing of it is on the held subject, and
// the staging publishes what the catch-up would have).
func (h *handOver) needsStaging(g string, route kvbinding.Binding) bool {
	return h.holds && g != "" && route.Epoch != route.Revision && h.duties.stagedOf(g, route.Epoch) == nil
}

// moveStaged moves group's staged copy at queue sequence seq onto this
// node's queue (moveGroup: the copy stored before the staged one is
// deleted, withdrawn if it was gone meanwhile). It returns whether one
// was moved: false when the staged copy is gone (moved before this
// retry, or by a successor that took the group).
func (h *handOver) moveStaged(ctx context.Context, stream msgStore, group string, route kvbinding.Binding, seq, is uint64) (bool, error) {
	m, err := h.getAgain(ctx, stream, seq)
	if isGone(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	q := queued{msg: m, from: h.node, ingressSeq: is, group: group, held: true}
	n, _, err := h.moveGroup(ctx, stream, []queued{q}, route)
	return n > 0, err
}

// dropStaged deletes group's staged copies below from: the drain found a
// later message of the group on an old queue, so the old node routed
// them (the window had lost their ids).
func (h *handOver) dropStaged(ctx context.Context, stream msgStore, group string, s *stagedSpan, from uint64) error {
	for _, is := range sortedKeys(s.copies) {
		c := s.copies[is]
		if is >= from {
			continue
		}
		if h.fencedNow() {
			return errFencedNow // a successor may be draining them
		}
		if err := stream.delete(ctx, c.at); err != nil && !isGone(err) {
			return err
		}
		h.log.Debug("hand-over: a staged copy below the catch-up's start deleted (the drain found later messages)",
			"group", logagg.Short(group), "ingress_seq", is, "queue_seq", c.at)
	}
	return nil
}

// queueCopy returns the copy of staged message m (on this node's held
// subject, at queue sequence at) to publish onto this node's queue for a
// catch-up: its id is the one any mover of the staged copy gives it
// (moveGroup).
func (h *handOver) queueCopy(m *nats.Msg, at uint64) *nats.Msg {
	q := queued{msg: &jetstream.RawStreamMsg{Subject: m.Subject}, from: h.node, held: true}
	out := &nats.Msg{Subject: QueueSubject(h.node, q.ingressSubject()), Header: make(nats.Header, len(m.Header)+1), Data: m.Data}
	for k, v := range m.Header {
		out.Header[k] = v
	}
	delete(out.Header, headerStaged)
	out.Header.Set(jetstream.MsgIDHeader, movedID(at))
	out.Header.Set(HeaderMovedFrom, h.node)
	return out
}

// unstage deletes the staged copy of ingress message is (at queue sequence
// at) once its queue copy is stored, and forgets it. A staged copy gone
// already was deleted by an earlier attempt of this catch-up (its answer
// lost, or the step retried), or taken by a successor that drained this
// node's held subject, which then found the queue copy too and moved the
// message once (moveGroup): either way the queue copy stays.
func (h *handOver) unstage(ctx context.Context, stream msgStore, s *stagedSpan, at, is uint64) error {
	if h.fencedNow() {
		// This node's liveness may have lapsed: a successor may be
		// draining its held subject. The staged copy stays (the
		// successor moves the message once: both copies share their
		// id); the step is retried once this node may act again.
		return errFencedNow
	}
	if err := stream.delete(ctx, at); err != nil && !isGone(err) {
		return err
	}
	h.duties.mu.Lock()
	delete(s.copies, is)
	h.duties.mu.Unlock()
	return nil
}
