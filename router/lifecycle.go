package router

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"grouprouter/kvbinding"
	"grouprouter/proposals"
)

// A group changes node in three steps, each a compare-and-set of its record:
//
//  1. the handler writes StateMoving (old owner A -> target B);
//  2. A stops routing the group, lets its publish in flight finish and
//     writes the fence: StateBound for B from the group's first message A
//     did not route, with Handoff set and A in Drain (a dead A cannot: the
//     handler writes it from A's checkpoint instead);
//  3. B moves the group's messages still waiting on the drained queues to
//     its own queue, in ingress order, routes from the ingress the messages
//     from the fence on that it skipped before it learnt the change, then
//     clears Handoff and routes the rest.
//
// Releases (idle expiry, a close marker, an unbind) end a binding the same
// way with StateReleased; the next binding of the group then takes it over
// with a handoff too, because nodes may have skipped its later messages.

// position is the next ingress sequence this node will read. r.mu is held.
func (r *Router) position() uint64 {
	if n := r.track.next(); n > 0 {
		return n
	}
	if s := r.resume.start(); s > 0 {
		return s
	}
	return 1
}

// concerns acts on a record that asks something of this node: give up a
// group being moved away, or take over a group handed to it. ln is the
// group's lane, or nil. r.mu is held.
func (r *Router) concerns(group string, route kvbinding.Route, ln *lane) {
	me := r.cfg.Node
	switch {
	case route.State == kvbinding.StateMoving && route.PrevNode == me:
		if ln != nil && (ln.inflight > 0 || ln.changing) {
			return // after the publish in flight: it calls pump again
		}
		fence := r.position()
		if ln != nil && len(ln.msgs) > 0 {
			fence = ln.msgs[0].seq
		}
		if ln == nil {
			ln = &lane{group: group}
			r.lanes[group] = ln
		}
		ln.changing = true
		go r.handOver(ln, fence)
	case route.State == kvbinding.StateBound && route.Handoff && route.Node == me:
		r.queueHandoff(group)
	}
}

// handOver writes the fence of a group this node gives up (step 2).
func (r *Router) handOver(ln *lane, fence uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := r.writeFence(ctx, ln.group, fence)
	if err != nil {
		r.log.Warn("hand-over of a moved group failed; retrying", "group", ln.group, "err", err)
		time.Sleep(backoffBase)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ln.changing = false
	if r.lanes[ln.group] == ln {
		r.pump(ln)
	}
}

func (r *Router) writeFence(ctx context.Context, group string, fence uint64) error {
	cur, err := r.store.Get(ctx, group)
	if err != nil {
		return err
	}
	if cur.State != kvbinding.StateMoving || cur.PrevNode != r.cfg.Node {
		r.cache.Apply(cur)
		return nil
	}
	fence = max(fence, cur.FromSeq, 1)
	now := time.Now().UTC()
	var b kvbinding.Binding
	if cur.Node == "" {
		next := kvbinding.Binding{Group: group, State: kvbinding.StateReleased, ThroughSeq: max(fence-1, 1),
			PrevNode: r.cfg.Node, DecidedAt: now, DecidedBy: r.cfg.Node, Reason: cur.Reason}
		b, err = r.store.ReplaceTTL(ctx, next, cur.Revision, r.cfg.RecordTTL)
		if err == nil {
			proposals.Event{Kind: proposals.EventUnbind, Group: group, PrevNode: r.cfg.Node, FromSeq: fence, By: r.cfg.Node, Reason: cur.Reason}.Publish(r.nc)
		}
	} else {
		next := kvbinding.Binding{Group: group, State: kvbinding.StateBound, Node: cur.Node, FromSeq: fence,
			PrevNode: r.cfg.Node, Handoff: true, Drain: kvbinding.WithDrain(cur.Drain, r.cfg.Node),
			DecidedAt: now, DecidedBy: r.cfg.Node, Reason: cur.Reason}
		b, err = r.store.Replace(ctx, next, cur.Revision)
	}
	if b.Revision != 0 {
		r.cache.Apply(b)
	}
	if errors.Is(err, kvbinding.ErrConflict) {
		return nil // changed meanwhile: the new record decides
	}
	return err
}

// startRelease ends this node's binding of ln's group after ingress
// sequence through (idle expiry, close marker). Later messages of the group
// wait in the lane until the record is written. r.mu is held.
func (r *Router) startRelease(ln *lane, through uint64, kind, reason string) {
	route, ok := r.cache.Lookup(ln.group)
	if !ok || route.State != kvbinding.StateBound || route.Node != r.cfg.Node || route.Handoff {
		r.pump(ln)
		return
	}
	ln.changing = true
	through = max(through, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		next := kvbinding.Binding{Group: ln.group, State: kvbinding.StateReleased, ThroughSeq: through,
			PrevNode: r.cfg.Node, DecidedAt: time.Now().UTC(), DecidedBy: r.cfg.Node, Reason: reason}
		b, err := r.store.ReplaceTTL(ctx, next, route.Revision, r.cfg.RecordTTL)
		if b.Revision != 0 {
			r.cache.Apply(b)
		}
		if err == nil {
			proposals.Event{Kind: kind, Group: ln.group, PrevNode: r.cfg.Node, FromSeq: through, By: r.cfg.Node, Reason: reason}.Publish(r.nc)
			r.log.Info("group released", "group", ln.group, "through_seq", through, "reason", reason)
		} else if !errors.Is(err, kvbinding.ErrConflict) {
			r.log.Warn("release failed; the group stays bound", "group", ln.group, "err", err)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		ln.changing = false
		if r.lanes[ln.group] == ln {
			r.pump(ln)
		}
	}()
}

// touch records that a message of group was routed now (idle expiry).
// r.mu is held.
func (r *Router) touch(group string) {
	if r.lastActive != nil {
		r.lastActive[group] = time.Now().UnixNano()
	}
}

// reaper releases this node's groups idle for GroupTimeout. A group's
// activity is kept in memory by its bound node, the only node routing it,
// so a busy group costs no KV write.
func (r *Router) reaper(ctx context.Context) {
	every(ctx, r.cfg.ReaperPeriod, r.reap)
}

func (r *Router) reap() {
	mine := r.cache.GroupsOf(r.cfg.Node)
	now := time.Now().UnixNano()
	timeout := r.cfg.GroupTimeout.Nanoseconds()
	r.mu.Lock()
	for _, g := range mine {
		if g == "" {
			continue
		}
		last, seen := r.lastActive[g]
		if !seen {
			r.lastActive[g] = now // bound before this node started: idle from now
			continue
		}
		if now-last < timeout || r.lanes[g] != nil {
			continue
		}
		route, ok := r.cache.Lookup(g)
		if !ok || route.State != kvbinding.StateBound || route.Node != r.cfg.Node || route.Handoff {
			continue
		}
		delete(r.lastActive, g)
		ln := &lane{group: g}
		r.lanes[g] = ln
		r.startRelease(ln, r.position()-1, proposals.EventExpire,
			fmt.Sprintf("no message for %v (group-timeout)", r.cfg.GroupTimeout))
	}
	r.mu.Unlock()
}

// queueHandoff schedules the takeover of a group handed to this node.
// r.mu is held.
func (r *Router) queueHandoff(group string) {
	if r.handoffs == nil {
		r.handoffs = map[string]bool{}
	}
	r.handoffs[group] = true
	select {
	case r.handoffWake <- struct{}{}:
	default:
	}
}

// handoffLoop takes over the groups handed to this node, in batches (step 3).
func (r *Router) handoffLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.handoffWake:
		}
		// Let a burst of records (a whole node's groups) arrive first.
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
		r.mu.Lock()
		groups := r.handoffs
		r.handoffs = nil
		r.mu.Unlock()
		if len(groups) == 0 {
			continue
		}
		if err := r.takeOver(ctx, groups); err != nil && ctx.Err() == nil {
			r.log.Warn("taking over moved groups failed; retrying", "groups", len(groups), "err", err)
			r.mu.Lock()
			for g := range groups {
				r.queueHandoff(g)
			}
			r.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// takeover is one group being handed to this node.
type takeover struct {
	rec   kvbinding.Binding
	until uint64 // the catch-up covers [rec.FromSeq, until)
}

func (r *Router) takeOver(ctx context.Context, groups map[string]bool) error {
	start := time.Now()
	jobs := map[string]*takeover{}
	for g := range groups {
		rec, err := r.store.Get(ctx, g)
		if err != nil {
			if errors.Is(err, kvbinding.ErrNotFound) {
				continue
			}
			return err
		}
		r.cache.Apply(rec)
		if rec.State == kvbinding.StateBound && rec.Handoff && rec.Node == r.cfg.Node {
			jobs[g] = &takeover{rec: rec}
		}
	}
	if len(jobs) == 0 {
		return nil
	}
	// Everything of these groups this node reads from now on waits in its
	// lane; what it read before is taken from the ingress up to there.
	r.mu.Lock()
	pos := r.position()
	for g, j := range jobs {
		j.until = pos
		if ln := r.lanes[g]; ln != nil && len(ln.msgs) > 0 {
			j.until = ln.msgs[0].seq
		}
	}
	r.mu.Unlock()

	moved, err := r.drainQueues(ctx, jobs)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	caught, err := r.catchUp(ctx, jobs)
	if err != nil {
		return fmt.Errorf("catch-up: %w", err)
	}
	for g, j := range jobs {
		done := j.rec
		done.Handoff, done.Drain = false, nil
		b, err := r.store.Replace(ctx, done, j.rec.Revision)
		if b.Revision != 0 {
			r.cache.Apply(b)
		}
		if err != nil && !errors.Is(err, kvbinding.ErrConflict) {
			return err
		}
		if err == nil {
			proposals.Event{Kind: proposals.EventHandoff, Group: g, Node: r.cfg.Node, PrevNode: j.rec.PrevNode,
				FromSeq: j.rec.FromSeq, By: r.cfg.Node, Count: moved[g] + caught[g]}.Publish(r.nc)
		}
	}
	r.log.Info("took over moved groups", "groups", len(jobs), "moved_from_queues", sum(moved),
		"routed_from_ingress", sum(caught), "took", time.Since(start))
	return nil
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// queued is a message found on another node's queue.
type queued struct {
	msg        *jetstream.RawStreamMsg
	from       string
	ingressSeq uint64
	group      string
}

// drainQueues moves the groups' messages waiting on the queues named in
// their records' Drain lists to this node's queue, in ingress order, each
// deleted from the old queue once the copy is stored. It waits (at most
// DrainWait) for a live old consumer to ack what it was already delivered.
func (r *Router) drainQueues(ctx context.Context, jobs map[string]*takeover) (map[string]int, error) {
	byNode := map[string]map[string]bool{}
	for g, j := range jobs {
		if g == "" {
			continue // ungrouped messages were spread over queues: nothing to keep together
		}
		for _, n := range j.rec.Drain {
			if n == r.cfg.Node {
				continue
			}
			if byNode[n] == nil {
				byNode[n] = map[string]bool{}
			}
			byNode[n][g] = true
		}
	}
	moved := map[string]int{}
	if len(byNode) == 0 {
		return moved, nil
	}
	stream, err := r.js.Stream(ctx, QueueStream)
	if err != nil {
		return nil, err
	}
	// The old queues' consumers must not take what is being moved: pause
	// them (a live consumer would otherwise be handed originals whose
	// copies this node also delivers), let them ack what they already
	// hold, and resume them once the group's messages are gone.
	stopPause := make(chan struct{})
	defer close(stopPause)
	for node := range byNode {
		r.holdQueue(ctx, node, stopPause)
	}
	// Each old queue at once: one move may drain several (a group moved
	// twice), and waiting for them in turn added their DrainWaits up.
	var wg sync.WaitGroup
	for node := range byNode {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.waitDelivered(ctx, node)
		}()
	}
	wg.Wait()
	var found []queued
	seen := map[string]map[uint64]bool{}
	for node, groups := range byNode {
		info, err := stream.Info(ctx)
		if err != nil {
			return nil, err
		}
		prefix := QueueSubjectPrefix + node + "."
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; {
			m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(prefix+">"))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return nil, err
			}
			seq = m.Sequence + 1
			g, _ := groupID(m.Header, r.cfg.GroupHeader)
			if !groups[g] {
				continue
			}
			is, _ := strconv.ParseUint(m.Header.Get(HeaderIngressSeq), 10, 64)
			if seen[g] == nil {
				seen[g] = map[uint64]bool{}
			}
			if seen[g][is] {
				continue
			}
			seen[g][is] = true
			found = append(found, queued{msg: m, from: node, ingressSeq: is, group: g})
		}
	}
	sort.SliceStable(found, func(i, j int) bool { return found[i].ingressSeq < found[j].ingressSeq })
	// Copies are published one after another, in ingress order; each
	// original is deleted once its copy is stored, concurrently with the
	// next copies (deletes do not change any queue's order).
	var mu sync.Mutex
	deletes, dctx := errgroup.WithContext(ctx)
	deletes.SetLimit(16)
	for _, q := range found {
		out := &nats.Msg{
			Subject: QueueSubject(r.cfg.Node, strings.TrimPrefix(q.msg.Subject, QueueSubjectPrefix+q.from+".")),
			Header:  nats.Header{}, Data: q.msg.Data,
		}
		for k, v := range q.msg.Header {
			out.Header[k] = v
		}
		rev := jobs[q.group].rec.Revision
		out.Header.Set(jetstream.MsgIDHeader, "move:"+strconv.FormatUint(rev, 10)+":"+strconv.FormatUint(q.ingressSeq, 10))
		out.Header.Set(HeaderMovedFrom, q.from)
		out.Header.Set(jetstream.ExpectedStreamHeader, QueueStream)
		copySeq, err := r.publishSync(dctx, out)
		if err != nil {
			if werr := deletes.Wait(); werr != nil {
				return nil, werr
			}
			return nil, err
		}
		deletes.Go(func() error {
			if err := stream.DeleteMsg(dctx, q.msg.Sequence); err != nil {
				if !isGone(err) {
					return err
				}
				// The old consumer acked the original after all (its ack
				// came after waitDelivered gave up on it): the copy would
				// deliver the message twice. Take the copy back.
				if err := stream.DeleteMsg(dctx, copySeq); err != nil && !isGone(err) {
					return err
				}
				r.log.Info("a moved message was acked on its old queue meanwhile; its copy was withdrawn",
					"group", q.group, "ingress_seq", q.ingressSeq, "from", q.from)
				return nil
			}
			mu.Lock()
			moved[q.group]++
			mu.Unlock()
			return nil
		})
	}
	if err := deletes.Wait(); err != nil {
		return nil, err
	}
	return moved, nil
}

// isGone reports whether a message get or delete failed only because the
// message is gone already (acked by its consumer meanwhile).
func isGone(err error) bool {
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true
	}
	var apiErr *jetstream.APIError
	// 10037: message not found; 10057: message deletion unsuccessful
	// (no message found).
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeMessageNotFound || apiErr.ErrorCode == 10057) {
		return true
	}
	// Stream.DeleteMsg flattens the server's error into text ("message
	// deletion unsuccessful: nats: API error: code=500 err_code=10057
	// description=no message found"): the API error is not wrapped.
	return errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) && strings.Contains(err.Error(), "no message found")
}

// holdQueue keeps node's queue consumer paused until stop is closed: it
// pauses it for a few seconds and extends the pause while the drain runs,
// so the consumer resumes by itself shortly after the last drain of it
// ends — several nodes may drain the same old queue at once (a dead node's
// groups are spread), and none of them may resume it under another.
func (r *Router) holdQueue(ctx context.Context, node string, stop <-chan struct{}) {
	const window = 2 * time.Second
	pause := func() error {
		_, err := r.js.PauseConsumer(ctx, QueueStream, QueueConsumer(node), time.Now().Add(window))
		return err
	}
	if err := pause(); err != nil {
		r.log.Warn("cannot pause the old queue's consumer during a move", "node", node, "err", err)
		return
	}
	go func() {
		t := time.NewTicker(window / 4)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				_ = pause()
			}
		}
	}()
}

// waitDelivered waits (at most DrainWait) until a node's queue consumer has
// acked everything it was delivered, so that a move does not take messages
// its consumer is processing. A consumer whose acks stopped coming (for 2 s)
// is taken as gone: what it holds comes back only after the ack wait, so it
// is moved now.
func (r *Router) waitDelivered(ctx context.Context, node string) {
	deadline := time.Now().Add(r.cfg.DrainWait)
	stale := min(2*time.Second, r.cfg.DrainWait)
	var lastFloor uint64
	lastMove := time.Now()
	for time.Now().Before(deadline) {
		cons, err := r.js.Consumer(ctx, QueueStream, QueueConsumer(node))
		if err != nil {
			return
		}
		info, err := cons.Info(ctx)
		if err != nil || info.NumAckPending == 0 {
			return
		}
		if info.AckFloor.Stream != lastFloor {
			lastFloor, lastMove = info.AckFloor.Stream, time.Now()
		} else if time.Since(lastMove) >= stale {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// catchUp routes, from the ingress, the groups' messages from their fence
// up to where this node's lanes take over: messages this node skipped
// while another node owned the group.
func (r *Router) catchUp(ctx context.Context, jobs map[string]*takeover) (map[string]int, error) {
	caught := map[string]int{}
	var lo, hi uint64
	for _, j := range jobs {
		if j.rec.FromSeq >= j.until {
			continue
		}
		if lo == 0 || j.rec.FromSeq < lo {
			lo = j.rec.FromSeq
		}
		hi = max(hi, j.until)
	}
	if lo == 0 {
		return caught, nil
	}
	cons, err := r.js.OrderedConsumer(ctx, IngressStream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: lo,
	})
	if err != nil {
		return nil, err
	}
	for {
		batch, err := cons.Fetch(512, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			meta, err := msg.Metadata()
			if err != nil {
				continue
			}
			seq := meta.Sequence.Stream
			if seq >= hi {
				return caught, nil
			}
			hdr := msg.Headers()
			g, present := groupID(hdr, r.cfg.GroupHeader)
			if present && kvbinding.ValidateGroupID(g) != nil {
				continue
			}
			j := jobs[g]
			if j == nil || seq < j.rec.FromSeq || seq >= j.until {
				continue
			}
			rec := &msgRec{seq: seq, subject: msg.Subject()}
			out := r.prepare(rec, hdr, msg.Data())
			dest := r.cfg.Node
			if g == "" {
				r.mu.Lock()
				dest = r.ungroupedDestination()
				r.mu.Unlock()
			}
			out.Subject = QueueSubject(dest, msg.Subject())
			out.Header.Set(jetstream.ExpectedStreamHeader, QueueStream)
			if _, err := r.publishSync(ctx, out); err != nil {
				return nil, err
			}
			caught[g]++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
		if n == 0 {
			return caught, nil // the stream ends before hi (deleted messages)
		}
	}
}

// publishSync publishes one message and waits for its ack, retrying until
// ctx ends (same Nats-Msg-Id, so a retry never duplicates).
func (r *Router) publishSync(ctx context.Context, m *nats.Msg) (seq uint64, err error) {
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ack, err := r.js.PublishMsg(pctx, m)
		cancel()
		if err == nil {
			return ack.Sequence, nil // a duplicate's ack names the first copy
		}
		if ctx.Err() != nil {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(backoffBase):
		}
	}
}
