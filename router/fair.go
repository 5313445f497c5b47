package router

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// The fair shell (fairshare.go says why): it reads the node's queue
// consumer (its ack floor and window) and hands them to the engine, looks
// up the oldest queue message of the groups held back whose oldest is
// above the floor, and moves held messages onto the queue as the engine
// says there is room for them.

// Fair shell timing: fairBusy while any group is held back or at its
// share (the consumer's progress must show soon, or a group waits with
// room on its queue), fairIdle otherwise (the accounts are pruned).
const (
	fairBusy = 10 * time.Millisecond
	fairIdle = 250 * time.Millisecond
)

// maxRelease bounds the held messages one release moves.
const maxRelease = 64

// queueHolds reports whether the queue stream takes the held subject; a
// LOCAL node adds it to a queue stream created before it (an update of
// the stream's subjects). Without it, the node holds no group back and
// says so.
func (r *Router) queueHolds(ctx context.Context) bool {
	if r.cfg.GroupShare < 0 {
		return false
	}
	s, err := r.js.Stream(ctx, QueueStream)
	if err != nil {
		r.log.Warn("queue stream not read: no group is held back for its share of the queue", "err", err)
		return false
	}
	c := s.CachedInfo().Config
	if slices.Contains(c.Subjects, HeldSubjectPrefix+">") {
		return true
	}
	if r.cfg.Type != Local {
		r.log.Info("the queue stream does not take held messages (yet: a LOCAL node adds their subject when it starts): no group is held back for its share of the queue",
			"stream", QueueStream)
		return false
	}
	c.Subjects = append(c.Subjects, HeldSubjectPrefix+">")
	uctx, cancel := context.WithTimeout(ctx, 5*time.Second) // a denied request gets no answer
	defer cancel()
	if _, err := r.js.UpdateStream(uctx, c); err != nil {
		r.log.Warn("could not add the held subject to the queue stream: no group is held back for its share of the queue",
			"stream", QueueStream, "subject", HeldSubjectPrefix+">", "err", err)
		return false
	}
	r.log.Info("the queue stream now takes held messages", "stream", QueueStream, "subject", HeldSubjectPrefix+">")
	return true
}

// restoreHeld counts, per group, what this node's held subject holds (a
// node that stopped while groups were held back), for the engine before
// it routes: a group with messages held sends its later ones there too.
// It retries until ctx ends.
func (r *Router) restoreHeld(ctx context.Context) error {
	if !r.eng.holds() {
		return nil
	}
	return r.setupStep(ctx, "held messages", func(ctx context.Context) error {
		store, err := r.ho.io.queue(ctx)
		if err != nil {
			return err
		}
		st, err := store.state(ctx, HeldFilter(r.cfg.Node, "*.*"))
		if err != nil {
			return err
		}
		found := heldFound(st.Subjects, r.cfg.Node, r.cache.Lookup, r.log)
		if len(found) == 0 {
			return nil
		}
		groups := make(map[string]string, len(found))
		for ref := range found {
			groups[ref] = r.groupOfRef(ref)
		}
		r.step(inHeldFound{counts: found, groups: groups})
		return nil
	})
}

// heldFound returns how many messages of each group (by ref) node's held
// subject holds, from the counts per subject of a stream state filtered
// on it, less the groups node is taking over: what the held subject holds
// of those is their staged catch-up (stage.go), which the catch-up moves,
// not messages held back for their share.
func heldFound(subjects map[string]uint64, node string, lookup func(ref string) (kvbinding.Binding, bool), log *slog.Logger) map[string]int {
	found := map[string]int{}
	prefix := HeldSubjectPrefix + node + "."
	for subj, n := range subjects {
		rest, ok := strings.CutPrefix(subj, prefix)
		if !ok || n == 0 {
			continue
		}
		t := strings.SplitN(rest, ".", 3)
		if len(t) != 3 {
			continue
		}
		ref, err := kvbinding.RefOfKey(t[0] + "." + t[1])
		if err != nil {
			log.Warn("a held message's subject names no group; it stays where it is", "subject", subj, "err", err)
			continue
		}
		found[ref] += int(n)
	}
	for _, ref := range slices.Sorted(maps.Keys(found)) { // in order: the simulation replays a seed exactly
		if b, ok := lookup(ref); ok && b.Phase().TakingOver() && b.Node == node {
			log.Info("held messages of a group this node is taking over: its staged catch-up, moved by the catch-up", "group", logagg.Short(ref), "messages", found[ref])
			delete(found, ref)
		}
	}
	if len(found) > 0 {
		n := 0
		for _, c := range found {
			n += c
		}
		log.Info("groups held back when this node stopped: their held messages go onto the queue as there is room", "groups", len(found), "messages", n)
	}
	return found
}

// groupOfRef returns the group id of a ref: the ref itself, or for a long
// id the one its record names (the cache keeps records by ref).
func (r *Router) groupOfRef(ref string) string {
	if !kvbinding.IsRef(ref) {
		return ref
	}
	if b, ok := r.cache.Lookup(ref); ok && b.Group != "" {
		return b.Group
	}
	names, err := r.store.Names(context.Background(), []string{ref})
	if err == nil {
		return names[ref]
	}
	return ""
}

// holdEvent announces that a group started or stopped being held back.
func (r *Router) holdEvent(a action) {
	if a.on {
		r.log.Debug("group held back: past its share of the queue window, its next messages wait on the held subject",
			"group", a.group, "unacked_on_queue", a.count)
		proposals.Event{Kind: proposals.EventHold, Group: a.group, Node: r.cfg.Node, By: r.cfg.Node, Count: a.count,
			Reason: "past its share of the queue window: " + strconv.Itoa(a.count) + " messages unacknowledged on the queue"}.Publish(r.nc)
		return
	}
	r.log.Debug("group no longer held back", "group", a.group, "held", a.count, "for", a.took)
	proposals.Event{Kind: proposals.EventUnhold, Group: a.group, Node: r.cfg.Node, By: r.cfg.Node, Count: a.count,
		Reason: "held back for " + a.took.Round(time.Millisecond).String()}.Publish(r.nc)
}

// errFencedNow: this node may not publish now (its liveness may have
// lapsed); a release tries again next round.
var errFencedNow = errors.New("this node may not publish now: its liveness record may have lapsed")

// fencedNow reports whether this node may not publish now.
func (r *Router) fencedNow() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.fenced(time.Now())
}

// fairShell is the fair shell, a room of its own (see above): it reaches
// the engine only through read (a pull that also hands the consumer's
// progress in) and step, and the rest of its node through the functions
// Router.newFairShell wires into it. Its I/O and its clock are the
// hand-over's kinds (queueIO's queue and publish, msgStore, clock), so
// that the simulation runs it on its stand-ins.
type fairShell struct {
	node  string
	log   *slog.Logger
	io    queueIO // queue: the queue stream's messages; publish: a release's copy
	clock clock
	// info reads the node's queue consumer (its ack floor and window).
	info  func(ctx context.Context) (*jetstream.ConsumerInfo, error)
	wake  <-chan struct{} // the engine has held messages to release (actFair)
	holds bool            // the queue stream takes the held subject (engine.holds)
	// read hands the engine the queue consumer's ack floor and window and
	// takes the releases and checks due (engine.fairRead, a pull), and
	// whether a group is held back or at its share (engine.fairBusy).
	read      func(ackFloor uint64, window int) (rel []releaseTask, checks []checkTask, busy bool)
	step      func(input)
	fencedNow func() bool
	lookup    func(ref string) (kvbinding.Binding, bool) // the binding cache
	stored    func(seq uint64, id string)                // the store check of the queue
	// warnRelease: held messages not moved (aggregated).
	warnRelease *logagg.Warner
}

// newFairShell returns r's fair shell, once setup made the engine, the
// binding cache and the hand-over's I/O, reading the queue consumer with
// info (its Info).
func (r *Router) newFairShell(info func(context.Context) (*jetstream.ConsumerInfo, error)) *fairShell {
	return &fairShell{
		node: r.cfg.Node, log: r.log, io: r.ho.io, clock: sysClock{}, info: info, wake: r.wake.fair, holds: r.eng.holds(),
		read: func(ackFloor uint64, window int) ([]releaseTask, []checkTask, bool) {
			r.mu.Lock()
			rel, checks := r.eng.fairRead(ackFloor, window, time.Now())
			busy := r.eng.fairBusy()
			r.unlockAndPerform()
			return rel, checks, busy
		},
		step: r.step, fencedNow: r.fencedNow, lookup: r.cache.Lookup, stored: r.qcheck.stored, warnRelease: r.warn.release,
	}
}

// run runs the fair shell until ctx ends.
func (f *fairShell) run(ctx context.Context) {
	if !f.holds {
		return
	}
	stream, err := f.io.queue(ctx)
	for err != nil {
		f.log.Debug("queue stream not read by the fair shell; trying again", "err", err)
		if f.clock.Sleep(ctx, time.Second) != nil {
			return
		}
		stream, err = f.io.queue(ctx)
	}
	t := f.clock.NewTimer(0) // the window first, before the first burst fills it
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		case <-f.wake:
			if !t.Stop() {
				select {
				case <-t.C():
				default:
				}
			}
		}
		busy := f.round(ctx, stream)
		if ctx.Err() != nil {
			return // not another round for a wake that came meanwhile
		}
		if busy {
			t.Reset(fairBusy)
		} else {
			t.Reset(fairIdle)
		}
	}
}

// round is one round of the fair shell; it reports whether a group is
// held back or at its share.
func (f *fairShell) round(ctx context.Context, stream msgStore) bool {
	rctx, cancel := f.clock.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := f.info(rctx)
	if err != nil {
		// Looked at again at the idle pace: a consumer its server cannot
		// answer for (503 while it has no leader) is not asked a hundred
		// times a second, and a wake still runs a round at once.
		f.log.Debug("queue consumer not read by the fair shell; trying again", "err", err, "in", fairIdle)
		return false
	}
	var rel []releaseTask
	var checks []checkTask
	busy := false
	rel, checks, busy = f.read(info.AckFloor.Stream, info.Config.MaxAckPending)
	for _, c := range checks {
		// A group's messages are consumed in order: its newest gone, all
		// are; else its oldest may be.
		for _, seq := range []uint64{c.newest, c.oldest} {
			gone, err := f.queueGone(rctx, stream, seq)
			if err != nil {
				f.log.Debug("queue message not looked up by the fair shell", "seq", seq, "err", err)
				break
			}
			if gone {
				f.step(inHeldGone{ref: c.ref, seq: seq})
				break
			}
		}
	}
	for _, task := range rel {
		seqs, left, err := f.release(ctx, stream, task)
		if err != nil && ctx.Err() == nil {
			if errors.Is(err, errSuperseded) || errors.Is(err, errFencedNow) {
				f.log.Debug("held messages not released yet; trying again", "group", task.group, "err", err)
			} else {
				f.warnRelease.Warn(task.group, "err", err)
			}
		}
		f.step(inReleased{ref: task.ref, queueSeqs: seqs, left: left || err != nil})
	}
	return busy || len(rel) > 0
}

// release moves up to task.n of the group's held messages onto the queue,
// oldest first, each copy stored before its original is deleted (a copy's
// Nats-Msg-Id, movedID of the original, makes a release repeated after a
// crash, or a drain's move of an original a stopped node left, store
// nothing twice within the duplicate window). It stops at once when
// the group is no longer this node's to route, or this node may not
// publish (fenced). It returns the queue sequences of the copies and
// whether held messages of the group are left.
func (f *fairShell) release(ctx context.Context, stream msgStore, task releaseTask) (seqs []uint64, left bool, err error) {
	key, err := kvbinding.Key(task.group)
	if err != nil {
		return nil, false, err
	}
	filter := HeldFilter(f.node, key)
	// The group is this node's to route while it is bound here, and while
	// an unbind moves it away from here until this node's fence, which
	// waits for the release (engine.fence).
	mine := func() (uint64, bool) {
		b, ok := f.lookup(task.ref)
		return b.Epoch, ok && ((b.Settled() && b.Node == f.node) || unbinding(b, f.node))
	}
	from := uint64(1)
	for len(seqs) < task.n {
		m, err := stream.next(ctx, from, filter)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return seqs, false, nil
		}
		if err != nil {
			return seqs, true, err
		}
		if f.fencedNow() {
			return seqs, true, errFencedNow
		}
		epoch, ok := mine()
		if !ok {
			return seqs, true, errSuperseded
		}
		ack, err := f.releaseCopy(ctx, key, m, epoch)
		if err != nil {
			return seqs, true, err
		}
		seq := ack.Sequence
		// The original goes only while the group is still this node's and
		// its liveness sure: otherwise a drain may be moving it, and finds
		// the copy by its id.
		if f.fencedNow() {
			return seqs, true, errFencedNow
		}
		if _, ok := mine(); !ok {
			return seqs, true, errSuperseded
		}
		if err := stream.delete(ctx, m.Sequence); err != nil && !isGone(err) {
			return seqs, true, err
		}
		seqs = append(seqs, seq)
		from = m.Sequence + 1
	}
	_, err = stream.next(ctx, from, filter)
	return seqs, err == nil || !errors.Is(err, jetstream.ErrMsgNotFound), nil
}

// releaseCopy stores on this node's queue the copy of m, a message held
// on its held subject for group key, in the group's epoch.
func (f *fairShell) releaseCopy(ctx context.Context, key string, m *jetstream.RawStreamMsg, epoch uint64) (*jetstream.PubAck, error) {
	ingress := strings.TrimPrefix(m.Subject, HeldSubjectPrefix+f.node+"."+key+".")
	out := &nats.Msg{Subject: QueueSubject(f.node, ingress), Header: make(nats.Header, len(m.Header)+1), Data: m.Data}
	for k, v := range m.Header {
		out.Header[k] = v
	}
	dropBatchHeaders(out.Header)
	// The id a drain's copy of this held message would carry: a node
	// stopped between this copy and the original's deletion (a pause, a
	// partition) leaves both, and a drain that then moves the original
	// stores nothing new (its copy is a duplicate of this one, which it
	// finds processed, or moves: moveGroup).
	out.Header.Set(jetstream.MsgIDHeader, movedID(m.Sequence))
	out.Header.Set(jetstream.ExpectedStreamHeader, QueueStream)
	out.Header.Set(HeaderEpoch, strconv.FormatUint(epoch, 10))
	return f.publishOnce(ctx, out)
}

// queueGone reports whether the queue no longer holds the message at seq
// (acknowledged, or moved off): a lookup of the node's next message at or
// after seq finds another, or none.
func (f *fairShell) queueGone(ctx context.Context, stream msgStore, seq uint64) (bool, error) {
	m, err := stream.next(ctx, seq, QueueFilter(f.node))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	case err != nil:
		return false, err
	}
	return m.Sequence != seq, nil
}

// publishOnce publishes m once and waits for its PubAck (5 s at most).
// A release publishes this way, not by publishSync's retries: a publish
// that keeps failing must not hold the fair shell, and every other held
// group's release, behind it. After a fault the servers were seen
// answering "duplicate message id is in process" (10158) to one message
// id for over a minute, and a nemesis schedule stalled 1,828 messages of
// another group behind it (docs/reliability.md); the group whose publish
// failed is released again next round.
func (f *fairShell) publishOnce(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
	pctx, cancel := f.clock.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ack, err := f.io.publish(pctx, m)
	if err != nil {
		return nil, err
	}
	if ack.Stream == QueueStream {
		f.stored(ack.Sequence, m.Header.Get(jetstream.MsgIDHeader))
	}
	return ack, nil
}
