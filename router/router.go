package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// Lock order (see also doc.go): Router.mu, then the binding cache's lock
// (the engine looks records up while Router.mu is held). The cache never
// calls out while it holds its lock, and its change notifications reach
// the router over a channel read by the router's own goroutine. No other
// lock is taken while Router.mu is held: publishes, asks and KV calls are
// made after it is released, with the actions the engine returned.

// Stats are a node's counters since it started.
type Stats struct {
	Routed         uint64 // messages republished onto queues by this node
	Skipped        uint64 // messages routed by other nodes
	DeadLettered   uint64 // messages this node put on the dead-letter stream
	DecisionErrors uint64 // failed proposal attempts (timeouts, no handler, failures)
	PublishErrors  uint64 // failed queue publishes (retried)
	Proposals      uint64 // proposals and steps asked of the handler
	Held           int    // messages in memory now (undecided or queued behind their group)
	HeldBytes      int64  // their size, headers included
	// Spilled and SpilledBytes: messages waiting for a decision held
	// without their body (Config.MaxSpilledBytes), and what they take.
	Spilled      int
	SpilledBytes int64
	// SpilledTotal counts the messages ever spilled.
	SpilledTotal uint64
	Position     uint64 // next ingress sequence to read

	// DecisionTimeouts and NoHandler count the DecisionErrors that were a
	// timeout, or found no handler answering.
	DecisionTimeouts uint64
	NoHandler        uint64
	// WindowCuts counts the times a decision timeout halved the window of
	// proposals this node keeps in flight, and ProposalWindow is the
	// window now (proposals; see docs/performance.md, "Bursts of new groups").
	WindowCuts     uint64
	ProposalWindow int

	// IngressGaps counts the gaps in the ingress stream this node read
	// over, and IngressMissing the messages in them: gone before the node
	// read them (expired, removed, or lost by a server), so not routed by it.
	IngressGaps    uint64
	IngressMissing uint64
	// QueueRewinds counts the times this node found the queue stream
	// without a message it had stored there (its servers lost acknowledged
	// writes), and QueueLostSeqs the queue sequences lost with them;
	// BindingsRewinds the times the bindings bucket went back below what
	// the node had read (storecheck.go).
	// Refused counts the publishes the servers refused for good (too
	// large once the router's headers are added): each message went to
	// the dead-letter stream instead, without its body if need be.
	Refused uint64

	QueueRewinds  uint64
	QueueLostSeqs uint64
	// QueueOrphans counts the messages of this node's queue it removed
	// because they lay at or below its consumer's ack floor: acknowledged,
	// yet kept by the stream (storecheck.go).
	QueueOrphans    uint64
	BindingsRewinds uint64
	// BelowFloor counts the Skipped messages that no binding covered but
	// that lay below the routing floor: routed before, under a binding
	// that has ended since (docs/protocol.md, "The routing floor").
	BelowFloor uint64
	// LimitRefused counts the binds of this node's groups the handler
	// refused because the cluster's group limit was reached; the node
	// dead-lettered those it proposed (docs/operations.md, "Memory").
	LimitRefused uint64
	// Batches counts the batches this node published (each
	// carries several messages of one group), and BatchFailures those
	// that failed: their messages were then published one at a time.
	Batches       uint64
	BatchFailures uint64
	// BatchedMessages counts the messages stored as part of a batch
	// (BatchedMessages / Batches is the mean size of a stored one).
	BatchedMessages uint64
	// InFlightBatches is the batches awaiting their outcome now.
	InFlightBatches int
	// HeldBackGroups is how many groups are held back now for their share
	// of the queue window, HeldBackMessages how many of their messages
	// wait on the node's held subject, and GroupShare the share now
	// (Config.GroupShare; 0: none applies).
	HeldBackGroups   int
	HeldBackMessages int
	GroupShare       int
	// HeldBackTotal counts the times a group started being held back.
	HeldBackTotal uint64
	// MaxBatch is the most messages of a group this node publishes as one
	// batch: Config.MaxBatch, or 1 when it publishes one message at a
	// time (batches off, or a queue stream that does not allow the batches
	// its replicas call for: the node's log says which).
	MaxBatch int
}

// Router is one grouprouter node. Create it with New and start it with Run.
type Router struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger
	// replicas is what the streams got: the parked ones get it too.
	replicas int

	store *kvbinding.Store
	cache *kvbinding.Cache
	reg   *kvbinding.Registry
	// dec: this node's LOCAL handler (nil on a REMOTE node) and its
	// client of the active one.
	dec struct {
		handler *proposals.Handler
		client  *proposals.Client
	}
	// out: the publishing shell (publish.go).
	out *publisher

	// life: ready is closed once the node routes (setup); stopped is
	// set when Run returned; stopping when the routing stops.
	life struct {
		ready   chan struct{}
		stopped atomic.Bool
		// stopping is set when the engine is told to stop (inStop):
		// publish outcomes then fail without a warning.
		stopping atomic.Bool
	}

	// proc is this process under the node id (identity.go).
	proc process

	mu  sync.Mutex
	eng *engine
	// room: the ingress reader waits on room.cond (under mu) while the
	// engine holds all it may (room.waiting); step signals it when held or
	// in-flight work shrinks.
	room struct {
		cond    *sync.Cond
		waiting bool
	}

	changes chan string // refs of the groups whose record changed, from the cache
	// applied: the bindings revision through which the engine has taken
	// every record change (Checkpoint.Seen).
	applied atomic.Uint64
	// wake: the asker, the timers and the fair shell's signals (one
	// buffered slot each).
	wake struct{ ask, timer, fair chan struct{} }
	// ho: the hand-over shell (handover.go), made by setup.
	ho *handOver

	suspects suspectSet // nodes not counted on until they announce again

	// live announces the node in its liveness record (liveness.go).
	live *liveness

	// For metrics and readiness (metrics.go, status.go).
	metrics *nodeMetrics
	rs      readerStats // what the ingress reader reports (ingest.go)
	qcheck  *queueCheck // the store check of the queue (storecheck.go)
	// side runs the reads of stored messages a lane waits for (sidereads.go).
	side *sideReads

	// warn: warnings that repeat, logged as one line per interval.
	warn warners
}

// New returns a router node for cfg on connection nc (which the caller
// owns; it may still be connecting, see Run). It validates cfg; errors
// wrap ErrConfig.
func New(nc *nats.Conn, cfg Config) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	connPrefix := nc.Opts.InboxPrefix
	if connPrefix == "" {
		connPrefix = DefaultInboxPrefix
	}
	switch cfg.InboxPrefix {
	case "":
		cfg.InboxPrefix = connPrefix
	case connPrefix:
	default:
		return nil, fmt.Errorf("%w: inbox prefix %q, but the connection's replies come under %q (nats.CustomInboxPrefix)", ErrConfig, cfg.InboxPrefix, connPrefix)
	}
	js, err := newJetStream(nc, cfg.JSDomain)
	if err != nil {
		return nil, err
	}
	r := &Router{
		nc:      nc,
		js:      js,
		cfg:     cfg,
		log:     cfg.Logger.With("node", cfg.Node),
		changes: make(chan string, 4096),
		side:    newSideReads(js),
		metrics: newNodeMetrics(cfg.Type),

		proc: process{instance: uuid.NewString(), pid: os.Getpid(), conflict: make(chan error, 1)},
	}
	r.proc.host, _ = os.Hostname()
	r.life.ready = make(chan struct{})
	r.room.cond = sync.NewCond(&r.mu)
	r.wake.ask, r.wake.timer, r.wake.fair = make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{}, 1)
	r.qcheck = newQueueCheck(js, nc, cfg.Node, r.log)
	r.live = &liveness{every: cfg.Heartbeat, clock: sysClock{}, log: r.log, yielded: &r.proc.yielded,
		warn:            logagg.New(r.log, "announce failed", logagg.DefaultEvery),
		report:          r.announcement,
		consumerChanged: func(has bool) { r.step(inConsumer{has: has}) },
		lastRevision:    func(ctx context.Context) (uint64, error) { return r.store.LastRevision(ctx) },
		records:         func() uint64 { return r.cache.Delivered() },
		alive:           func(until time.Time) { r.step(inAlive{until: until}) },
	}
	r.warn = warners{
		noDecision:   logagg.New(r.log, "no routing decision; the group waits and is retried", logagg.DefaultEvery),
		deadLettered: logagg.New(r.log, "group dead-lettered", logagg.DefaultEvery),
		publish:      logagg.New(r.log, "publish failed; retrying in order (a full dead-letter stream refuses new entries until room is made)", logagg.DefaultEvery),
		checkpoint:   logagg.New(r.log, "checkpoint not saved", logagg.DefaultEvery),
		window:       logagg.New(r.log, "routing decisions timed out: fewer proposals are kept in flight", logagg.DefaultEvery),
		lapsed:       logagg.New(r.log, "moving messages the old consumer was delivered and did not ack: it made no progress for its ack wait; it may still process them (the epoch tells the copies apart)", logagg.DefaultEvery),
		late:         logagg.New(r.log, "a message the group's previous owner published late (held by the network past the drain) is on its old queue: moved here before the group's next one", logagg.DefaultEvery),
		release:      logagg.New(r.log, "held messages not moved onto the queue; the group's next release tries again", logagg.DefaultEvery),
		handOver:     logagg.New(r.log, "hand-over publish failed (a drain's copy, a catch-up, a late copy's move); retrying", logagg.DefaultEvery),
	}
	r.out = r.newPublisher()
	r.rs.loss.log, r.rs.loss.nc, r.rs.loss.node, r.rs.loss.lim.every = r.log, nc, cfg.Node, gapReportEvery
	if cfg.Metrics != nil {
		if err := r.registerMetrics(cfg.Metrics); err != nil {
			return nil, fmt.Errorf("grouping: registering metrics: %w", err)
		}
	}
	return r, nil
}

// Ready is closed once the node routes: its streams exist and its binding
// cache is complete.
func (r *Router) Ready() <-chan struct{} { return r.life.ready }

// Node returns the node id.
func (r *Router) Node() string { return r.cfg.Node }

// HandlerActive reports whether this node's LOCAL handler is the one
// answering proposals.
func (r *Router) HandlerActive() bool {
	return r.isReady() && r.dec.handler != nil && r.dec.handler.Active()
}

// Handler returns the node's LOCAL handler (nil on a REMOTE node or before
// Run).
func (r *Router) Handler() *proposals.Handler { return r.dec.handler }

// Cache returns the node's binding cache (nil before Run).
func (r *Router) Cache() *kvbinding.Cache { return r.cache }

// Stats returns the node's counters.
func (r *Router) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.eng == nil {
		return Stats{}
	}
	e := r.eng
	waitGroups, waitMsgs := e.fairWaiting()
	return Stats{
		Routed: r.out.routed.Load(), Skipped: e.stats.skipped, DeadLettered: e.stats.deadLettered,
		DecisionErrors: e.stats.decisionErrors, PublishErrors: e.stats.publishErrors, Proposals: e.stats.asked,
		DecisionTimeouts: e.stats.timeouts, NoHandler: e.stats.noHandler, BelowFloor: e.stats.belowFloor, Refused: e.stats.refused,
		LimitRefused: e.stats.limitRefused,
		Batches:      e.stats.batches, BatchFailures: e.stats.batchFailures, InFlightBatches: e.batches,
		BatchedMessages: e.stats.batchedMsgs, MaxBatch: max(e.cfg.maxBatch, 1),
		WindowCuts: e.stats.windowCuts, ProposalWindow: int(e.asks.pace.limit),
		Held: e.mem.heldMsgs, HeldBytes: e.mem.heldBytes, Position: e.position(),
		Spilled: e.mem.spilledMsgs, SpilledBytes: e.mem.spilledBytes, SpilledTotal: e.stats.spilled,
		HeldBackGroups: e.fair.heldGroups + waitGroups, HeldBackMessages: e.fair.held + waitMsgs, GroupShare: e.groupShareNow(), HeldBackTotal: e.stats.heldBack,
		IngressGaps: r.rs.loss.gaps.Load(), IngressMissing: r.rs.loss.missing.Load(),
		QueueRewinds: r.qcheck.tail.rewinds.Load(), QueueLostSeqs: r.qcheck.tail.lost.Load(), QueueOrphans: r.qcheck.tail.orphans.Load(), BindingsRewinds: r.cache.Rewinds(),
	}
}

// step hands the engine one input (input.go) with r.mu held, then
// carries out the actions it emitted, with r.mu released.
func (r *Router) step(in input) {
	r.mu.Lock()
	r.eng.step(in, time.Now())
	r.unlockAndPerform()
}

// unlockAndPerform takes the actions the engine emitted, wakes the reader
// if it waits for room the engine has now, releases r.mu (held by the
// caller) and carries the actions out.
func (r *Router) unlockAndPerform() {
	acts := r.eng.take()
	if r.room.waiting && !r.eng.full() {
		r.room.cond.Broadcast()
	}
	r.mu.Unlock()
	r.perform(acts)
}

// perform carries out the engine's actions.
func (r *Router) perform(acts []action) {
	for _, a := range acts {
		switch a.kind {
		case actPublish:
			r.out.publish(a)
		case actBatch:
			r.out.publishBatch(a)
		case actAsk:
			wake(r.wake.ask)
		case actRetry:
			wake(r.wake.timer)
		case actDuty:
			r.ho.duties.add(a.group, a.duty, a.rev)
		case actDeadLettered:
			r.warn.deadLettered.Warn(a.group, "messages", a.count, "through_seq", a.rev, "reason", a.reason)
			proposals.Event{Kind: proposals.EventDeadLetter, Group: a.group, By: r.cfg.Node, Reason: a.reason,
				Count: a.count, FromSeq: a.rev}.Publish(r.nc)
		case actFailure:
			f := a.fail
			r.warn.noDecision.Warn(f.group, "attempt", f.attempt, "held", f.count, "err", f.err)
			proposals.Event{Kind: proposals.EventTimeout, Group: f.group, Node: r.cfg.Node, Attempt: f.attempt, Reason: f.err.Error(),
				By: r.cfg.Node, Count: f.count}.Publish(r.nc)
		case actDecided:
			r.metrics.decisionLatency.Observe(a.took.Seconds())
		case actWindow:
			r.warn.window.Warn("", "window", a.count)
		case actHold:
			r.holdEvent(a)
		case actFairWake:
			wake(r.wake.fair)
		}
	}
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Run sets up the streams and buckets, then routes until ctx ends; then it
// drains (stops reading, waits up to 5 s for in-flight publishes, drops
// the publishes it would have retried, saves its checkpoint, withdraws its
// liveness record, releases a handler lease) and returns nil. Messages it
// read but did not route are past its checkpoint: whoever routes their
// group next routes them. Every goroutine it starts has ended when it
// returns.
//
// Setting up waits for NATS as long as ctx lasts (see setup.go): the
// connection may still be trying its servers, and every setup step retries
// transient failures with backoff, logging what it waits for. A failure
// that waiting cannot fix returns a *SetupError (matching ErrPermanent). If
// ctx ends during setup, Run returns nil.
//
// One process runs a node id (identity.go): if another process heartbeats
// under it when Run starts, Run returns a *NodeIDInUseError (matching
// ErrNodeIDInUse) before it touches anything the id owns; if one that
// started earlier announces under it while Run routes, Run stops (saving
// no checkpoint and withdrawing nothing: they are the other process's)
// and returns a *NodeIDInUseError too.
func (r *Router) Run(ctx context.Context) error {
	defer r.life.stopped.Store(true)
	defer r.warn.close()
	defer r.qcheck.close()
	defer r.live.warn.Close()
	queueCons, release, err := r.setup(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while setting up: nothing to drain
		}
		return err
	}
	defer release()

	// Routing.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	g, gctx := errgroup.WithContext(runCtx)
	// Stopping starts the drain at once: a reader waiting for room (the
	// held messages at their bound: a full queue, decisions not coming)
	// must wake up, or the routing goroutines would never all return. A
	// message it did not hand over is read again after a restart (the
	// checkpoint covers only what was routed).
	stopWaiting := context.AfterFunc(gctx, func() {
		r.life.stopping.Store(true)
		r.mu.Lock()
		r.eng.step(inStop{}, time.Now())
		r.room.cond.Broadcast()
		r.mu.Unlock()
	})
	defer stopWaiting()
	if r.dec.handler != nil {
		g.Go(func() error { return ignoreCanceled(r.dec.handler.Run(gctx)) })
	}
	if r.cfg.GroupTimeout > 0 {
		g.Go(func() error { r.reaper(gctx); return nil })
	}
	if r.cfg.Type == Local {
		g.Go(func() error { r.ensureParking(gctx, max(r.replicas, 1)); return nil })
	}
	if err := r.restoreHeld(gctx); err != nil {
		stopWaiting()
		_ = g.Wait()
		r.drain()
		return ignoreCanceled(err)
	}
	fair := r.newFairShell(queueCons.Info)
	g.Go(func() error { fair.run(gctx); return nil })
	g.Go(func() error { r.ho.run(gctx); return nil })
	r.resumeDuties()
	g.Go(func() error { r.live.run(gctx, queueCons); return nil })
	g.Go(func() error { r.checkpointLoop(gctx); return nil })
	g.Go(func() error { r.qcheck.run(gctx); return nil })
	asks := r.newAsker()
	g.Go(func() error { asks.run(gctx); return nil })
	g.Go(func() error { r.timers(gctx); return nil })
	g.Go(func() error { return r.read(gctx) })
	g.Go(func() error {
		select {
		case <-gctx.Done():
			return nil
		case err := <-r.proc.conflict:
			return err // another process runs this node id (identity.go)
		}
	})
	err = g.Wait()
	r.drain()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// loadResume reads this node's checkpoint. A checkpoint that does not
// decode is not trusted: the node starts from the safe side, re-reading
// what the queue stream's duplicate window still deduplicates.
func (r *Router) loadResume(ctx context.Context) (resumePoint, error) {
	ckpt, _, err := r.reg.LoadCheckpoint(ctx, r.cfg.Node)
	if errors.Is(err, kvbinding.ErrInvalidCheckpoint) {
		start, serr := r.safeStart(ctx)
		if serr != nil {
			return resumePoint{}, serr
		}
		r.log.Error("checkpoint is invalid; re-routing from the oldest message the queue's duplicate window still covers",
			"err", err, "start", start)
		return resumePoint{ckpt: kvbinding.Checkpoint{Next: start}}, nil
	}
	if err != nil {
		return resumePoint{}, err
	}
	if last, err := r.ingressLast(ctx); err == nil && ckpt.Next > last+1 {
		start, serr := r.safeStart(ctx)
		if serr != nil {
			return resumePoint{}, serr
		}
		r.log.Error("checkpoint is ahead of the ingress stream; re-routing from the oldest message the queue's duplicate window still covers",
			"checkpoint_next", ckpt.Next, "ingress_last", last, "start", start)
		return resumePoint{ckpt: kvbinding.Checkpoint{Next: start}}, nil
	}
	return resumePoint{ckpt: ckpt}, nil
}

// safeStart returns the first ingress sequence stored within the queue
// stream's duplicate window (less a margin): routing again from there
// cannot duplicate anything on a queue.
func (r *Router) safeStart(ctx context.Context) (uint64, error) {
	since := time.Now().Add(-queueDuplicates + 30*time.Second)
	cons, err := r.js.OrderedConsumer(ctx, IngressStream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
	})
	if err != nil {
		return 0, fmt.Errorf("grouping: finding where to resume: %w", err)
	}
	info := cons.CachedInfo()
	if info == nil {
		return 1, nil
	}
	return info.Delivered.Stream + 1, nil
}

// ingressLast returns the ingress stream's last sequence.
func (r *Router) ingressLast(ctx context.Context) (uint64, error) {
	s, err := r.js.Stream(ctx, IngressStream) // one request: the stream's info
	if err != nil {
		return 0, err
	}
	return s.CachedInfo().State.LastSeq, nil
}

// queues is the handler's access to the node queues.
type queues struct{ r *Router }

func (q queues) Pause(ctx context.Context, node string, until time.Time) error {
	_, err := q.r.js.PauseConsumer(ctx, QueueStream, QueueConsumer(node), until)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil // no queue, nothing to pause
	}
	return err
}

func (q queues) Resume(ctx context.Context, node string) error {
	_, err := q.r.js.ResumeConsumer(ctx, QueueStream, QueueConsumer(node))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	return err
}

func (q queues) IngressLast(ctx context.Context) (uint64, error) { return q.r.ingressLast(ctx) }

// IngressCreated returns when the ingress stream was created: the handler
// starts the routing floor again only for a stream created after it.
func (q queues) IngressCreated(ctx context.Context) (time.Time, error) {
	s, err := q.r.js.Stream(ctx, IngressStream)
	if err != nil {
		return time.Time{}, err
	}
	return s.CachedInfo().Created, nil
}

// drain waits (bounded) for in-flight publishes, then saves the checkpoint
// and withdraws the node's liveness record.
func (r *Router) drain() {
	deadline := time.Now().Add(5 * time.Second)
	r.life.stopping.Store(true)
	r.mu.Lock()
	r.eng.step(inStop{}, time.Now())
	r.room.cond.Broadcast()
	for r.eng.publishing() > 0 && time.Now().Before(deadline) {
		r.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		r.mu.Lock()
	}
	r.mu.Unlock()
	r.side.close()
	ckpt := r.checkpoint()
	if r.proc.yielded.Load() {
		// The checkpoint and the liveness record are the other process's.
		r.log.Info("node stopped: its id is run by another process", "position", ckpt.Next, "routed", r.out.routed.Load())
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if ckpt.Next > 0 {
		if err := r.reg.SaveCheckpoint(ctx, r.cfg.Node, ckpt); err != nil {
			r.log.Warn("final checkpoint not saved", "err", err)
		}
	}
	if err := r.reg.Withdraw(ctx, r.cfg.Node); err != nil {
		r.log.Warn("liveness record not withdrawn", "err", err)
	}
	r.log.Info("node stopped", "position", ckpt.Next, "routed", r.out.routed.Load())
}

// changeLoop feeds the engine the refs of the groups whose record
// changed (runChanges).
func (r *Router) changeLoop(ctx context.Context) {
	runChanges(ctx, r.changes, r.cache.Delivered, r.step, &r.applied)
}

// runChanges hands step the refs (kvbinding.Ref) of the groups whose
// record changed, as the cache sends them on changes: whatever has
// arrived, up to maxChangeBatch, in one input (a burst of new bindings
// costs one lock, not one per binding). Once it has taken every change
// sent, applied holds the revision the cache had delivered by then (the
// checkpoint's Seen).
func runChanges(ctx context.Context, changes <-chan string, delivered func() uint64, step func(input), applied *atomic.Uint64) {
	var batch []string
	for {
		select {
		case <-ctx.Done():
			return
		case g := <-changes:
			batch = append(batch[:0], g)
		}
		// The cache notifies a record's change before it counts the
		// record delivered: every change up to seen is in the channel or
		// taken by now.
		seen, drained := delivered(), false
	more:
		for len(batch) < maxChangeBatch {
			select {
			case g := <-changes:
				batch = append(batch, g)
			default:
				drained = true
				break more
			}
		}
		step(inChanged{refs: batch})
		if drained {
			applied.Store(seen)
		}
		clear(batch)
	}
}

// maxChangeBatch bounds the record changes handed to the engine at once.
const maxChangeBatch = 256

// resumeDuties picks up, after a start, the changes in progress that
// concern this node (hand-overs it owes, takeovers handed to it).
func (r *Router) resumeDuties() {
	todo := dutiesOf(r.cache, r.cfg.Node)
	if len(todo) > 0 {
		r.log.Info("resuming changes in progress", "groups", len(todo))
	}
	r.step(inChanged{refs: todo})
}

// dutiesOf returns, sorted, the refs of the groups whose record gives
// node a duty (proposals.DutyOf).
func dutiesOf(c *kvbinding.Cache, node string) []string {
	var todo []string
	c.Each(func(ref string, route kvbinding.Binding) bool {
		if proposals.DutyOf(route, node) != proposals.DutyNone {
			todo = append(todo, ref)
		}
		return true
	})
	slices.Sort(todo)
	return todo
}

// onLiveChange is called by the registry when the set of live nodes (or
// their consumer presence) changed.
func (r *Router) onLiveChange() {
	live := r.reg.Live()
	r.checkOwnRecord(live)
	r.step(inLive{state: liveNodes(live, r.reg.Seen, &r.suspects)})
}

// liveNodes returns the live nodes this node counts on (not suspects),
// from the live set and when each was last seen.
func liveNodes(live map[string]kvbinding.NodeInfo, seen func(string) time.Time, suspects *suspectSet) map[string]proposals.NodeState {
	state := make(map[string]proposals.NodeState, len(live))
	for id, info := range live {
		if suspects.counted(id, seen(id)) {
			state[id] = proposals.NodeState{HasConsumer: info.HasConsumer}
		}
	}
	return state
}

// subscribeTakeovers follows the takeover events of LOCAL handlers until
// the returned function is called. A LOCAL handler that becomes active
// announces it: asks that failed for want of one are retried at once
// instead of after their backoff. It names the previous holder's node when
// that did not release the lease (presumably crashed): this node stops
// counting on it to propose until it announces itself again.
func (r *Router) subscribeTakeovers() (unsubscribe func(), err error) {
	var lastRetry atomic.Int64
	takeover, err := r.nc.Subscribe(proposals.SubjectEventsPrefix+proposals.EventHandlerTakeover, func(m *nats.Msg) {
		now := time.Now()
		if prev := lastRetry.Load(); now.UnixNano()-prev < int64(100*time.Millisecond) || !lastRetry.CompareAndSwap(prev, now.UnixNano()) {
			return // at most one early retry per 100 ms, whoever publishes the event
		}
		var ev proposals.Event
		if json.Unmarshal(m.Data, &ev) == nil && ev.PrevNode != "" && ev.PrevNode != r.cfg.Node && kvbinding.ValidateNodeID(ev.PrevNode) == nil {
			r.suspect(ev.PrevNode, now)
		}
		r.step(inRetry{})
	})
	if err != nil {
		return nil, fmt.Errorf("grouping: subscribe to handler events: %w", err)
	}
	return func() { _ = takeover.Unsubscribe() }, nil
}

// suspect stops counting on node (its process presumably crashed) until it
// announces itself again.
func (r *Router) suspect(node string, now time.Time) {
	r.suspects.add(node, now)
	r.log.Info("a LOCAL handler took over from a crashed one; its node is not counted on until it announces again", "suspect", node)
	r.onLiveChange()
}

// suspectSet is the nodes a node stops counting on (their process
// presumably crashed: a LOCAL handler took over from one) until they
// announce themselves again, each with when it was suspected.
type suspectSet struct {
	mu    sync.Mutex
	since map[string]time.Time
}

func (s *suspectSet) add(node string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since == nil {
		s.since = map[string]time.Time{}
	}
	s.since[node] = now
}

// counted reports whether node counts as live: it is not suspected, or it
// was heard of (seen) since it was, which ends the suspicion.
func (s *suspectSet) counted(node string, seen time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	since, ok := s.since[node]
	if !ok {
		return true
	}
	if !seen.After(since) {
		return false // not heard of since it was suspected
	}
	delete(s.since, node)
	return true
}

// timers runs what the engine has due: publish retries, ask retries,
// replies whose record did not come.
func (r *Router) timers(ctx context.Context) {
	runTimers(ctx, sysClock{}, r.wake.timer, func() time.Time {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.eng.nextDue()
	}, func() { r.step(inTick{}) })
}

// runTimers calls tick whenever the engine's next due time (nextDue)
// comes, on c, until ctx ends; a wake (actRetry) makes it look again.
func runTimers(ctx context.Context, c clock, wake <-chan struct{}, nextDue func() time.Time, tick func()) {
	t := c.NewTimer(time.Hour)
	defer t.Stop()
	for {
		next := nextDue()
		d := time.Hour
		if !next.IsZero() {
			d = max(next.Sub(c.Now()), time.Millisecond)
		}
		t.Reset(d)
		select {
		case <-ctx.Done():
			return
		case <-wake:
			continue
		case <-t.C():
		}
		tick()
	}
}

// every calls fn every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// announcement is what this node announces of itself at now (liveness adds its
// consumer and the record's times).
func (r *Router) announcement(now time.Time) kvbinding.NodeInfo {
	st := r.Stats()
	info := kvbinding.NodeInfo{
		Node: r.cfg.Node, Instance: r.proc.instance, Host: r.proc.host, PID: r.proc.pid,
		Type: string(r.cfg.Type), Handler: r.cfg.Name, Started: r.proc.started,
		Position: st.Position, Held: st.Held, Routed: st.Routed,
		DecisionErrors: st.DecisionErrors, DeadLettered: st.DeadLettered,
	}
	info.Waiting, info.WaitingGroups = r.heldUndecided(now)
	r.mu.Lock()
	engineReport(r.eng, &info)
	r.mu.Unlock()
	return info
}

// engineReport puts in info what the engine tells of the node's groups
// (the busy ones, from the period it ends, those retrying, those held
// back).
func engineReport(e *engine, info *kvbinding.NodeInfo) {
	info.Busy, info.BusyMore = e.busyGroups()
	info.Retrying = e.retryingGroups()
	info.HeldBack, info.HeldBackGroups = e.heldBack()
}

// consumerPresent reports whether a node's queue has a consumer: one is
// pulling (a waiting pull request), one is pinned in the priority group,
// or one holds messages it was delivered and was active within the ack
// wait. A consumer busy with what it pulled sends no pull request for a
// while; it must not count as gone (its groups would move away from it).
func consumerPresent(info *jetstream.ConsumerInfo, now time.Time) bool {
	if info.NumWaiting > 0 {
		return true
	}
	for _, pg := range info.PriorityGroups {
		if pg.PinnedClientID != "" {
			return true
		}
	}
	if info.NumAckPending == 0 {
		return false
	}
	wait := info.Config.AckWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	for _, last := range []*time.Time{info.Delivered.Last, info.AckFloor.Last} {
		if last != nil && now.Sub(*last) < wait {
			return true
		}
	}
	return false
}

// checkpointLoop saves the routing position every cfg.CheckpointInterval.
func (r *Router) checkpointLoop(ctx context.Context) {
	runCheckpoints(ctx, sysClock{}, r.cfg.CheckpointInterval, func() (kvbinding.Checkpoint, bool) {
		return r.checkpoint(), !r.proc.yielded.Load()
	}, func(ctx context.Context, c kvbinding.Checkpoint) error {
		return r.reg.SaveCheckpoint(ctx, r.cfg.Node, c)
	}, r.warn.checkpoint)
}

// runCheckpoints saves the checkpoint every interval on c until ctx ends,
// when it changed (mine false: the node id is another process's, nothing
// is saved), each save bounded by the interval; failures are warned of.
func runCheckpoints(ctx context.Context, c clock, every time.Duration, checkpoint func() (kvbinding.Checkpoint, bool),
	save func(context.Context, kvbinding.Checkpoint) error, warn *logagg.Warner) {
	t := c.NewTimer(every)
	defer t.Stop()
	var last kvbinding.Checkpoint
	for fired(ctx, t) {
		t.Reset(every)
		cp, mine := checkpoint()
		if !mine || cp.Next == 0 || (cp.Next == last.Next && len(cp.Pending) == 0 && len(last.Pending) == 0 && len(cp.Caught) == 0 && len(last.Caught) == 0 &&
			len(cp.Lost) == 0 && len(last.Lost) == 0 && cp.Seen == last.Seen) {
			continue
		}
		sctx, cancel := c.WithTimeout(ctx, every)
		if err := save(sctx, cp); err == nil {
			last = cp
		} else if ctx.Err() == nil {
			warn.Warn("", "err", err)
		}
		cancel()
	}
}

// checkpoint returns the node's routing position and its catch-up progress.
func (r *Router) checkpoint() kvbinding.Checkpoint {
	seen := r.applied.Load()
	r.mu.Lock()
	c := r.eng.checkpoint(seen, time.Now())
	r.mu.Unlock()
	r.ho.duties.addCaught(&c)
	return c
}

// addCaught puts the catch-ups' progress (caught) into c.
func (q *dutyQueue) addCaught(c *kvbinding.Checkpoint) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.caught) == 0 {
		return
	}
	c.Caught = make(map[string]uint64, min(len(q.caught), maxCaught))
	size := 0
	for _, g := range sortedKeys(q.caught) {
		if len(c.Caught) == maxCaught || size+len(g) > maxCaughtBytes {
			// Past the bound (a huge take-over), a successor re-routes
			// what is not listed; the duplicate window absorbs it.
			break
		}
		c.Caught[g] = q.caught[g]
		size += len(g) + 24
	}
}

// Bounds of a checkpoint's catch-up progress, so that it fits the registry
// bucket's value size with the pending ranges.
const (
	maxCaught      = 8192
	maxCaughtBytes = 512 << 10
)

// saveCheckpoint saves the checkpoint now.
func (r *Router) saveCheckpoint(ctx context.Context) error {
	c := r.checkpoint()
	if c.Next == 0 {
		c.Next = r.position()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return r.reg.SaveCheckpoint(ctx, r.cfg.Node, c)
}

// position is the next ingress sequence the node will read.
func (r *Router) position() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.position()
}

// reaper releases this node's groups idle for GroupTimeout. A group's
// activity is kept in memory by its bound node, the only node routing it,
// so a busy group costs no KV write.
func (r *Router) reaper(ctx context.Context) {
	every(ctx, r.cfg.ReaperPeriod, func() {
		mine := r.cache.RefsOf(r.cfg.Node)
		r.mu.Lock()
		long := r.eng.reap(mine, time.Now())
		r.unlockAndPerform()
		if len(long) == 0 {
			return
		}
		// The cache keeps no long id: read those due from the bucket.
		names, err := r.store.Names(ctx, long)
		if err != nil {
			r.log.Warn("cannot read the ids of idle long groups; they are released later", "err", err)
		}
		if len(names) > 0 {
			r.step(inReapNamed{names: names})
		}
	})
}

// warners are a node's warnings that repeat per group or per attempt,
// each logged as one line per interval (internal/logagg).
type warners struct {
	// noDecision: failed decisions; deadLettered: dead-lettered groups;
	// publish: failed publishes; window: decisions that timed out.
	noDecision, deadLettered, publish, window *logagg.Warner
	// checkpoint: checkpoints not saved.
	checkpoint *logagg.Warner
	// lapsed: drains that moved what a stalled consumer held; late:
	// copies the previous owner published late, moved here.
	lapsed, late *logagg.Warner
	// release: releases of held messages that failed (fair.go);
	// handOver: the hand-over's publishes retried (publishSync).
	release, handOver *logagg.Warner
}

// close flushes and stops every warner (those a test left nil too).
func (w *warners) close() {
	for _, x := range []*logagg.Warner{w.noDecision, w.deadLettered, w.publish, w.window, w.checkpoint, w.lapsed, w.late, w.release, w.handOver} {
		if x != nil {
			x.Close()
		}
	}
}
