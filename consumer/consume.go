package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/wire"
)

const (
	// opTimeout bounds one ack, publish or lookup.
	opTimeout = 5 * time.Second
	// pinIDHeader is set by the server on messages to a pinned client.
	pinIDHeader = "Nats-Pin-Id"
	// ungroupedPrefix starts the lane key of a message without a group:
	// each such message is a lane of its own (no order among them).
	ungroupedPrefix = "\x00u"
	// malformedPrefix starts the lane key of a message without a valid
	// ingress sequence: it cannot be ordered and goes to the parked stream.
	malformedPrefix = "\x00m"
)

// Consume processes node's queue (stream wire.QueueStream, durable
// consumer wire.QueueConsumer(node)) with h until ctx ends, then stops
// pulling, lets the running handlers finish within the drain bound
// (WithDrainTimeout), hands the messages it held back (nak), unpins the
// queue in pinned mode, and returns nil, or ErrDrainTimeout when handlers
// still ran.
//
// A group gets one message at a time, in Grouping-Ingress-Seq order, also
// when JetStream redelivers; different groups run in parallel, at most
// WithConcurrency at once. A message is acked (confirmed, DoubleAck) once
// h returned nil; h may take longer than the ack wait (Consume sends
// InProgress). A failure is retried with backoff, other groups going on;
// after WithMaxAttempts or a Terminal error the message and every later
// message of its group go, in order, to stream ParkedStream, and the group
// is recorded in bucket ParkedBucket so that later arrivals follow until
// the record is deleted. See docs/consuming.md.
//
// Consume may start before the node's router (in a compose file or a
// systemd unit both start together): until the router has created the
// queue consumer, and in a cluster until the consumer has a leader,
// Consume waits, says once (at info level) what it waits for, and looks
// again every 250 ms to 1 s, until ctx ends (WaitQueue). It returns
// ErrNoQueue only when the queue consumer is deleted while it pulls.
// Consume creates the parked stream and bucket if they are missing. It
// returns an error wrapping ErrConfig for invalid arguments, and the error
// of a setup step that failed for another reason than a transient one
// (which it retries until ctx ends).
func Consume(ctx context.Context, js jetstream.JetStream, node string, h Handler, opts ...Option) error {
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return err
		}
	}
	switch {
	case js == nil:
		return fmt.Errorf("%w: nil JetStream", ErrConfig)
	case h == nil:
		return fmt.Errorf("%w: nil handler", ErrConfig)
	}
	if err := kvbinding.ValidateNodeID(node); err != nil {
		return fmt.Errorf("%w: node: %v", ErrConfig, err)
	}
	r := &runner{
		js: js, node: node, h: h, o: o, id: uuid.NewString(),
		log:         o.logger.With("node", node),
		queuePrefix: wire.QueueSubjectPrefix + node + ".",
		lanes:       newLaneSet(),
		parkedSet:   make(map[string]bool),
		parkedAhead: make(map[string]uint64),
		cancels:     make(map[*lane]context.CancelCauseFunc),
		timers:      make(map[*lane]*time.Timer),
	}
	r.cond = sync.NewCond(&r.mu)
	r.m = newMetrics(node, r.gauge, func() float64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		return float64(len(r.parkedSet))
	})
	if err := r.m.register(o.registerer); err != nil {
		return err
	}
	defer r.m.unregister(o.registerer)
	return r.run(ctx)
}

// runner is one Consume call.
type runner struct {
	js          jetstream.JetStream
	node        string
	id          string // this process's id in a replay claim
	h           Handler
	o           options
	log         *slog.Logger
	queuePrefix string
	m           *metrics

	cons     jetstream.Consumer
	scanCtx  context.Context // Consume's, for a rescan from the pull's callback
	pinned   bool
	ackWait  time.Duration
	parkedKV jetstream.KeyValue

	mu        sync.Mutex
	cond      *sync.Cond
	lanes     *laneSet
	parkedSet map[string]bool // groups recorded in ParkedBucket
	// parkedAhead holds the revision of a parked record this process wrote
	// and applied before the watch brought it (touchParked): the watch's
	// older changes of the group are stale until it gets there.
	parkedAhead map[string]uint64
	cancels     map[*lane]context.CancelCauseFunc
	timers      map[*lane]*time.Timer
	pinID       string
	// lastDelivery is the consumer sequence of the last delivery seen;
	// only the pull's callback (serial) uses it once pulling began.
	lastDelivery uint64
	acks         sync.WaitGroup // acks being confirmed
	warns        warnings
}

func (r *runner) gauge(f func(*laneSet) float64) func() float64 {
	return func() float64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		return f(r.lanes)
	}
}

func (r *runner) run(ctx context.Context) error {
	info, err := r.lookup(ctx)
	if err != nil || ctx.Err() != nil {
		return err
	}
	r.pinned = slices.Contains(info.Config.PriorityGroups, wire.PriorityGroup)
	r.ackWait = info.Config.AckWait
	if r.ackWait <= 0 {
		r.ackWait = 30 * time.Second
	}
	stopWatch, err := r.setupParking(ctx)
	if err != nil || ctx.Err() != nil {
		return err
	}
	defer stopWatch()
	for _, pg := range info.PriorityGroups {
		if r.pinned && pg.Group == wire.PriorityGroup && pg.PinnedClientID != "" {
			r.log.Debug("consumer: the queue is pinned to another process; waiting as its standby", "ttl", info.Config.PinnedTTL)
		}
	}
	r.scanCtx = ctx
	r.lastDelivery = info.Delivered.Consumer
	r.scanBarriers(ctx, info)
	r.log.Debug("consumer: starting", "pinned", r.pinned, "ack_wait", r.ackWait, "concurrency", r.o.concurrency)

	// Handlers run under a context that outlives ctx by the drain bound.
	hctx, hcancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer hcancel(nil)
	var workers sync.WaitGroup
	for range r.o.concurrency {
		workers.Add(1)
		go func() {
			defer workers.Done()
			r.work(hctx)
		}()
	}
	tickDone := make(chan struct{})
	tickCtx, tickStop := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(tickDone)
		r.tick(tickCtx)
	}()

	pull := []jetstream.PullConsumeOpt{
		jetstream.PullMaxMessages(r.o.pullBatch),
		// A pull request can outlive the process that sent it (seen across
		// accounts: TestPermissionsLeastPrivilege waits for it), and what
		// the servers deliver to it waits for the ack wait: a short expiry
		// (nats.go's default is 30 s) bounds that window.
		jetstream.PullExpiry(pullExpiry),
		jetstream.ConsumeErrHandler(r.consumeErr),
	}
	if r.pinned {
		pull = append(pull, jetstream.PullPriorityGroup(wire.PriorityGroup))
	}
	cc, err := r.cons.Consume(r.arrive, pull...)
	pulling := err == nil
	if err == nil {
		select {
		case <-ctx.Done():
		case <-cc.Closed():
			// nats.go ends a pull whose consumer was deleted.
			pulling = false
			err = fmt.Errorf("%w: consumer %s ended while pulling (deleted?)", ErrNoQueue, wire.QueueConsumer(r.node))
			r.log.Warn("consumer: the queue consumer ended; stopping", "err", err)
		}
	} else {
		err = fmt.Errorf("consumer: pull from %s: %w", wire.QueueConsumer(r.node), err)
	}

	// Stop: no new starts; running handlers get the drain bound. What
	// arrives meanwhile waits in its lane, to be handed back.
	r.mu.Lock()
	r.lanes.stopping = true
	for l, t := range r.timers {
		t.Stop()
		delete(r.timers, l)
	}
	r.cond.Broadcast()
	r.mu.Unlock()
	done := make(chan struct{})
	go func() { workers.Wait(); close(done) }()
	timer := time.NewTimer(r.o.drainTimeout)
	select {
	case <-done:
		timer.Stop()
	case <-timer.C:
		r.log.Warn("consumer: handlers still running after the drain bound; cancelling them", "bound", r.o.drainTimeout)
		hcancel(ErrDrainTimeout)
		<-done
		if err == nil {
			err = ErrDrainTimeout
		}
	}
	if pulling {
		// Everything pulled and not processed is handed back (below),
		// also what the pull still holds and what arrives until it
		// ends: with no handler running any more, a pinned queue is
		// unpinned (the servers then end this process's pull requests
		// instead of delivering to them after it is gone; another
		// process may take the pin now), and the pull is drained, not
		// stopped (Stop drops what nats.go holds: those messages would
		// wait out their ack wait; issue 31).
		r.mu.Lock()
		pinID := r.pinID
		r.pinID = ""
		r.mu.Unlock()
		if r.pinned && pinID != "" {
			r.unpin(ctx, pinID)
		}
		cc.Drain()
		select {
		case <-cc.Closed():
		case <-time.After(opTimeout):
		}
	}
	tickStop()
	<-tickDone
	r.acks.Wait() // each bounded by opTimeout

	r.mu.Lock()
	heldBack := r.lanes.drainHeld()
	pinID := r.pinID
	r.mu.Unlock()
	for _, d := range heldBack {
		_ = d.msg.Nak() // to the next consumer at once
	}
	if len(heldBack) > 0 {
		// A Nak is not answered: flushed here, before the caller can
		// close the connection (consume --count exits right away).
		if err := r.js.Conn().FlushTimeout(opTimeout); err != nil {
			r.log.Debug("consumer: the hand-back was not flushed", "err", err)
		}
	}
	r.log.Debug("consumer: stopped", "handed_back", len(heldBack))
	if r.pinned && pinID != "" {
		r.unpin(ctx, pinID)
	}
	return err
}

// lookup waits for the node's queue consumer (waitQueue).
func (r *runner) lookup(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	cons, err := waitQueue(ctx, r.js, r.node, r.log)
	if cons == nil || err != nil {
		return nil, err
	}
	r.cons = cons
	return cons.CachedInfo(), nil
}

// pullExpiry is how long a pull request of Consume waits on the server.
const pullExpiry = 5 * time.Second

func isTransient(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// warn logs a warning of kind, at most once per warnEvery, with the
// count of the ones left out since.
func (r *runner) warn(kind, msg string, args ...any) {
	ok, suppressed := r.warns.allow(kind, time.Now())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed_since_last", suppressed)
	}
	r.log.Warn(msg, args...)
}

// consumeErr logs the pull's errors; nats.go retries them itself.
func (r *runner) consumeErr(_ jetstream.ConsumeContext, err error) {
	if errors.Is(err, jetstream.ErrPinIDMismatch) {
		r.mu.Lock()
		r.pinID = "" // another process got the pin
		r.mu.Unlock()
	}
	r.log.Debug("consumer: pull", "err", err)
}

// arrive puts a delivered message in its lane (the pull's callback).
func (r *runner) arrive(m jetstream.Msg) {
	now := time.Now()
	hdr := m.Headers()
	d := &delivery{msg: m, touched: now}
	redelivered := false
	var consSeq uint64
	if meta, err := m.Metadata(); err == nil {
		d.streamSeq, consSeq = meta.Sequence.Stream, meta.Sequence.Consumer
		redelivered = meta.NumDelivered > 1
	}
	key := ""
	seq, err := strconv.ParseUint(hdr.Get(wire.HeaderIngressSeq), 10, 64)
	if err != nil || seq == 0 {
		r.warn("malformed", "consumer: message without a valid ingress sequence; parking it", "header", hdr.Get(wire.HeaderIngressSeq), "stream_seq", d.streamSeq)
		key, seq = malformedPrefix+strconv.FormatUint(d.streamSeq, 10), max(d.streamSeq, 1)
	} else {
		group, invalid := wire.GroupOf(hdr, r.o.groupHeader)
		if invalid != "" {
			r.log.Debug("consumer: message with an invalid group header, processed as ungrouped", "why", invalid, "ingress_seq", seq)
		}
		key = group
		if group == "" {
			key = ungroupedPrefix + strconv.FormatUint(seq, 10)
		}
	}
	d.seq = seq
	if v := hdr.Get(wire.HeaderEpoch); v != "" {
		if d.epoch, err = strconv.ParseUint(v, 10, 64); err != nil {
			r.log.Debug("consumer: invalid epoch header, not fenced", "value", v, "ingress_seq", seq)
		}
	}

	if consSeq != 0 {
		if consSeq > r.lastDelivery+1 {
			// Deliveries this process did not get: to the process pinned
			// before it, or lost in transit (a reconnect, a new stream
			// leader). They come back after the ack wait: hold their groups.
			r.log.Debug("consumer: deliveries missed; looking for what is pending", "from", r.lastDelivery+1, "to", consSeq-1)
			r.rescan()
		}
		r.lastDelivery = consSeq // lower only if the consumer was made anew
	}
	r.mu.Lock()
	if id := hdr.Get(pinIDHeader); id != "" {
		r.pinID = id
	}
	if strings.HasPrefix(key, malformedPrefix) {
		r.lanes.lane(key, now).parked = true
		r.lanes.lane(key, now).reason = "no valid " + wire.HeaderIngressSeq + " header"
	}
	l := r.lanes.lanes[key]
	v, stale, staleRunning := r.lanes.arrive(key, d, now)
	if staleRunning {
		l = r.lanes.lanes[key]
		if cancel := r.cancels[l]; cancel != nil {
			cancel(ErrStale)
		}
	}
	reordered := v == held && redelivered && l != nil && len(l.pending) > 0 && l.pending[len(l.pending)-1] != d
	if v == held {
		r.cond.Signal()
	}
	r.mu.Unlock()

	switch v {
	case dropDone:
		r.m.duplicates.Inc()
		r.log.Debug("consumer: dropped a copy at or below its group's done mark", "group", key, "ingress_seq", seq)
		_ = m.Ack()
	case dropStale:
		r.m.stale.Inc()
		r.log.Debug("consumer: dropped a copy of an older epoch", "group", key, "ingress_seq", seq, "epoch", d.epoch)
		_ = m.Ack()
	case tookOver:
		r.m.redelivered.Inc()
	case held:
		if reordered {
			r.m.redelivered.Inc()
		}
	}
	for _, s := range stale {
		r.m.stale.Inc()
		r.log.Debug("consumer: dropped a held copy of an older epoch", "group", key, "ingress_seq", s.seq, "epoch", s.epoch)
		_ = s.msg.Ack()
	}
}

// work runs lanes' heads until the lanes stop.
func (r *runner) work(hctx context.Context) {
	for {
		r.mu.Lock()
		var (
			l    *lane
			d    *delivery
			park bool
		)
		for {
			if r.lanes.stopping {
				r.mu.Unlock()
				return
			}
			if l, d, park = r.lanes.next(time.Now()); l != nil {
				break
			}
			r.cond.Wait()
		}
		attempt := l.attempts + 1
		ctx, cancel := context.WithCancelCause(hctx)
		r.cancels[l] = cancel
		r.mu.Unlock()

		switch {
		case d == nil:
			r.replay(ctx, l)
		case park:
			r.park(ctx, l, d)
		default:
			r.process(ctx, l, d, attempt)
		}
		r.mu.Lock()
		delete(r.cancels, l)
		r.mu.Unlock()
		cancel(nil)
	}
}

// message builds what the handler sees.
func (r *runner) message(l *lane, d *delivery, attempt int) *Message {
	hdr := d.msg.Headers()
	msg := &Message{
		Subject:    strings.TrimPrefix(d.msg.Subject(), r.queuePrefix),
		Header:     hdr,
		Data:       d.msg.Data(),
		IngressSeq: d.seq,
		Epoch:      d.epoch,
		Fence:      Fence{Epoch: d.epoch, IngressSeq: d.seq},
		Attempt:    attempt,
		Closing:    hdr.Get(wire.HeaderGroupSeq) == "-1",
	}
	if !strings.HasPrefix(l.group, "\x00") {
		msg.Group = l.group
	}
	if meta, err := d.msg.Metadata(); err == nil {
		msg.Redelivered = meta.NumDelivered > 1
	}
	// A copy moved from a node whose consumer had been delivered the
	// message and stalled: that consumer may have processed it.
	msg.Redelivered = msg.Redelivered || hdr.Get(wire.HeaderDeliveredBefore) != ""
	return msg
}

// call runs the handler, turning a panic into an error.
func (r *runner) call(ctx context.Context, msg *Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrPanic, p, debug.Stack())
		}
	}()
	return r.h(ctx, msg)
}

// process runs the handler on d, the head of l, and acks or retries.
func (r *runner) process(ctx context.Context, l *lane, d *delivery, attempt int) {
	err := r.call(ctx, r.message(l, d, attempt))
	r.mu.Lock()
	stale, cur := l.stale, l.running
	r.mu.Unlock()
	if stale {
		// The group moved on while it ran: drop it, whatever it returned.
		r.m.stale.Inc()
		r.log.Debug("consumer: dropped a message whose group moved to a newer epoch while it ran", "group", l.group, "ingress_seq", d.seq, "err", err)
		_ = cur.msg.Ack()
		r.finish(l, succeeded)
		return
	}
	if err == nil {
		// The done mark moves now, so the lane goes on while the ack is
		// confirmed: a redelivery of the message, should the ack be lost,
		// is at or below the done mark and dropped.
		r.m.processed.Inc()
		r.finish(l, succeeded)
		if r.o.plainAcks {
			if aerr := cur.msg.Ack(); aerr != nil {
				r.log.Debug("consumer: ack not sent", "group", l.group, "ingress_seq", d.seq, "err", aerr)
			}
			return
		}
		r.acks.Add(1)
		go func() {
			defer r.acks.Done()
			actx, cancel := context.WithTimeout(context.Background(), opTimeout)
			defer cancel()
			if aerr := cur.msg.DoubleAck(actx); aerr != nil {
				r.log.Debug("consumer: ack not confirmed", "group", l.group, "ingress_seq", d.seq, "err", aerr)
			}
		}()
		return
	}
	if errors.Is(err, ErrDrainTimeout) || context.Cause(ctx) == ErrDrainTimeout {
		r.finish(l, interrupted)
		return
	}
	o := failed
	if errors.Is(err, ErrTerminal) {
		o = failedTerminal
	}
	r.mu.Lock()
	l.reason = err.Error()
	parkedNow, retryAt := r.lanes.finish(l, o, r.o.maxAttempts, r.o.backoff, time.Now())
	r.schedule(l, retryAt)
	r.cond.Signal()
	r.mu.Unlock()
	if parkedNow {
		r.warn("parking", "consumer: parking a group", "group", l.group, "ingress_seq", d.seq, "attempts", attempt, "err", err)
	} else {
		r.m.retries.Inc()
		r.log.Debug("consumer: handler failed; retrying after backoff", "group", l.group, "ingress_seq", d.seq, "attempt", attempt, "retry_at", retryAt, "err", err)
	}
}

func (r *runner) finish(l *lane, o outcome) {
	r.mu.Lock()
	_, retryAt := r.lanes.finish(l, o, r.o.maxAttempts, r.o.backoff, time.Now())
	r.schedule(l, retryAt)
	r.cond.Signal()
	r.mu.Unlock()
}

// schedule wakes l at retryAt (if set). Call with mu held.
func (r *runner) schedule(l *lane, retryAt time.Time) {
	if retryAt.IsZero() || r.lanes.stopping {
		return
	}
	if t := r.timers[l]; t != nil {
		t.Stop()
	}
	r.timers[l] = time.AfterFunc(time.Until(retryAt), func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.timers, l)
		r.lanes.kick(l, time.Now())
		r.cond.Signal()
	})
}

// tick sends InProgress for what is held, checks barriers and forgets
// idle lanes, until ctx ends.
func (r *runner) tick(ctx context.Context) {
	every := max(r.ackWait/4, 20*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		r.mu.Lock()
		due := r.lanes.progressDue(now, r.ackWait/2)
		barriers := r.lanes.barriersDue(now, r.ackWait/2)
		if n := r.lanes.replaysDue(now); n > 0 {
			r.cond.Broadcast()
			r.log.Debug("consumer: replays whose claim ran out are due here", "count", n)
		}
		if n := r.lanes.sweep(now, r.o.idleLane); n > 0 {
			r.log.Debug("consumer: forgot idle lanes", "count", n)
		}
		r.mu.Unlock()
		for _, d := range due {
			_ = d.msg.InProgress()
		}
		r.checkBarriers(ctx, barriers)
	}
}
