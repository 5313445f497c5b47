package router

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"grouprouter/internal/jspub"
	"grouprouter/kvbinding"
	"grouprouter/proposals"
)

// Stats are a node's counters since it started.
type Stats struct {
	Routed         uint64 // messages republished onto queues by this node
	Skipped        uint64 // messages routed by other nodes
	DeadLettered   uint64 // messages this node put on the dead-letter stream
	DecisionErrors uint64 // failed proposal attempts (timeouts, no handler, failures)
	PublishErrors  uint64 // failed queue publishes (retried)
	Proposals      uint64 // proposals sent
	Held           int    // messages in memory now (undecided or queued behind their group)
	Position       uint64 // next ingress sequence to read
}

// Router is one grouprouter node. Create it with New and start it with Run.
type Router struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	cfg Config
	log *slog.Logger

	store   *kvbinding.Store
	cache   *kvbinding.Cache
	reg     *kvbinding.Registry
	handler *proposals.Handler
	client  *proposals.Client
	pub     *jspub.Publisher

	ready   chan struct{}
	started time.Time

	mu        sync.Mutex
	cond      *sync.Cond // signalled when held or in-flight work shrinks
	lanes     map[string]*lane
	heldMsgs  int
	heldBytes int64
	inflight  int
	track     tracker
	resume    resumePoint
	propQ     []*lane
	retryQ    retryHeap
	assigned  map[string]int // proposals in flight per proposed node
	rr        int
	live      []string                       // live node ids, sorted
	liveState map[string]proposals.NodeState // without group counts
	closing   bool
	// lastActive: when each group bound here last had a message routed
	// (only with GroupTimeout > 0).
	lastActive map[string]int64
	// handoffs: groups handed to this node, waiting for handoffLoop.
	handoffs map[string]bool
	held     heldTracker // since when groups are held undecided (inspect.go)

	propWake    chan struct{}
	handoffWake chan struct{}

	hasConsumer atomic.Bool
	routed      atomic.Uint64
	skipped     atomic.Uint64
	deadLetters atomic.Uint64
	decErrs     atomic.Uint64
	pubErrs     atomic.Uint64
	proposed    atomic.Uint64
}

// msgRec is an ingress message held by the router.
type msgRec struct {
	seq     uint64
	hdr     nats.Header // as read from the ingress, until out is prepared
	data    []byte
	out     *nats.Msg // the message to republish, prepared when first needed
	subject string    // ingress subject
	size    int
	invalid string // why its group id is unusable ("" if fine)
	close   bool   // Group-Seq: -1: the group ends after this message
}

// lane holds one group's messages that are not done yet, in ingress order.
// For a group, at most one message (the head) is being published at a time.
// The lane of ungrouped messages (group "") publishes without that limit.
type lane struct {
	group         string
	msgs          []*msgRec
	inflight      int
	waiting       bool // the head needs a decision
	prop          *propState
	deadLettering bool
	// changing is true while this node writes a change of the group's
	// record (handing it over, releasing it): nothing moves meanwhile.
	changing bool
}

// New returns a router node for cfg on connection nc (which the caller
// owns). It validates cfg; errors wrap ErrConfig.
func New(nc *nats.Conn, cfg Config) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	r := &Router{
		nc:        nc,
		js:        js,
		cfg:       cfg,
		log:       cfg.Logger.With("node", cfg.Node),
		ready:     make(chan struct{}),
		lanes:     make(map[string]*lane),
		assigned:  make(map[string]int),
		liveState: map[string]proposals.NodeState{},
		propWake:  make(chan struct{}, 1),

		handoffWake: make(chan struct{}, 1),
	}
	if cfg.GroupTimeout > 0 {
		r.lastActive = make(map[string]int64)
	}
	r.cond = sync.NewCond(&r.mu)
	return r, nil
}

// Ready is closed once the node routes: its streams exist and its binding
// cache is complete.
func (r *Router) Ready() <-chan struct{} { return r.ready }

// Node returns the node id.
func (r *Router) Node() string { return r.cfg.Node }

// HandlerActive reports whether this node's LOCAL handler is the one
// answering proposals.
func (r *Router) HandlerActive() bool { return r.handler != nil && r.handler.Active() }

// Cache returns the node's binding cache (nil before Run).
func (r *Router) Cache() *kvbinding.Cache { return r.cache }

// Stats returns the node's counters.
func (r *Router) Stats() Stats {
	r.mu.Lock()
	held, pos := r.heldMsgs, r.track.next()
	r.mu.Unlock()
	return Stats{
		Routed: r.routed.Load(), Skipped: r.skipped.Load(), DeadLettered: r.deadLetters.Load(),
		DecisionErrors: r.decErrs.Load(), PublishErrors: r.pubErrs.Load(), Proposals: r.proposed.Load(),
		Held: held, Position: pos,
	}
}

// Run sets up the streams and buckets, then routes until ctx ends; then it
// drains (finishes in-flight publishes, saves its checkpoint, withdraws its
// liveness record, releases a handler lease) and returns nil. It returns an
// error if setup fails.
func (r *Router) Run(ctx context.Context) error {
	replicas := Replicas(r.nc, r.cfg.Replicas)
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := ensureStreams(setupCtx, r.js, r.cfg, replicas); err != nil {
		return err
	}
	queueCons, err := ensureQueueConsumer(setupCtx, r.js, r.cfg.Node, r.cfg.QueueMode, r.cfg.PinnedTTL)
	if err != nil {
		return err
	}
	if r.store, err = kvbinding.OpenStore(setupCtx, r.js, kvbinding.StoreConfig{Replicas: replicas}); err != nil {
		return err
	}
	defer r.store.Close()
	if r.reg, err = kvbinding.OpenRegistry(setupCtx, r.js, kvbinding.RegistryConfig{Replicas: replicas}, r.onLiveChange); err != nil {
		return err
	}
	r.cache = kvbinding.NewCache(r.onBinding)
	if r.pub, err = jspub.New(r.nc, 5*time.Second); err != nil {
		return err
	}
	defer r.pub.Close()
	r.client = proposals.NewClient(r.nc, r.cfg.Node, r.cfg.Timeout)

	// Background state: the binding cache and the node registry.
	bgCtx, stopBg := context.WithCancel(context.WithoutCancel(ctx))
	bg, bgCtx := errgroup.WithContext(bgCtx)
	bg.Go(func() error { return ignoreCanceled(r.cache.Run(bgCtx, r.store)) })
	bg.Go(func() error { return ignoreCanceled(r.reg.Run(bgCtx)) })
	defer func() { stopBg(); _ = bg.Wait() }()
	for _, ch := range []<-chan struct{}{r.cache.Ready(), r.reg.Ready()} {
		select {
		case <-ch:
		case <-ctx.Done():
			return nil
		case <-bgCtx.Done():
			return fmt.Errorf("grouping: loading state: %w", bg.Wait())
		}
	}
	ckpt, _, err := r.reg.LoadCheckpoint(setupCtx, r.cfg.Node)
	if err != nil {
		return err
	}
	r.resume = resumePoint{ckpt: ckpt}
	if r.cfg.Type == Local {
		r.handler = proposals.NewHandler(r.nc, r.store, r.cache, r.reg, proposals.HandlerConfig{
			Name: r.cfg.Name, Node: r.cfg.Node, LeaseTTL: r.cfg.LeaseTTL, Logger: r.cfg.Logger,
			NodeGrace: r.cfg.NodeGrace, RebindAfter: r.cfg.RebindAfter, RecordTTL: r.cfg.RecordTTL,
		})
	}
	r.started = time.Now().UTC()
	r.announce(setupCtx, queueCons)
	r.log.Info("node ready", "type", r.cfg.Type, "address", r.cfg.Address, "bindings", r.cache.Len(),
		"resume_at", r.resume.start(), "replicas", replicas)
	close(r.ready)

	// Routing.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	g, gctx := errgroup.WithContext(runCtx)
	if r.handler != nil {
		g.Go(func() error { return ignoreCanceled(r.handler.Run(gctx)) })
	}
	if r.cfg.GroupTimeout > 0 {
		g.Go(func() error { r.reaper(gctx); return nil })
	}
	g.Go(func() error { r.handoffLoop(gctx); return nil })
	r.resumeChanges()
	g.Go(func() error { r.heartbeat(gctx, queueCons); return nil })
	g.Go(func() error { r.checkpointLoop(gctx); return nil })
	g.Go(func() error { r.proposer(gctx); return nil })
	g.Go(func() error { return r.read(gctx) })
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

// drain waits (bounded) for in-flight publishes, then saves the checkpoint
// and withdraws the node's liveness record.
func (r *Router) drain() {
	deadline := time.Now().Add(5 * time.Second)
	r.mu.Lock()
	r.closing = true
	r.cond.Broadcast()
	for r.inflight > 0 && time.Now().Before(deadline) {
		r.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		r.mu.Lock()
	}
	ckpt := r.track.checkpoint()
	r.mu.Unlock()
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
	r.log.Info("node stopped", "position", ckpt.Next, "routed", r.routed.Load())
}

// read consumes the ingress stream in order from the checkpoint.
func (r *Router) read(ctx context.Context) error {
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if start := r.resume.start(); start > 1 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = start
	}
	var cons jetstream.Consumer
	for {
		var err error
		cons, err = r.js.OrderedConsumer(ctx, IngressStream, cfg)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		r.log.Warn("ingress consumer not created, retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(250 * time.Millisecond):
		}
	}
	// Short heartbeats: when the stream leader's server dies, the ordered
	// consumer is recreated after two missed heartbeats (the default expiry
	// of 30 s made that a ~30 s stall, measured).
	it, err := cons.Messages(jetstream.PullMaxMessages(1024), jetstream.PullExpiry(5*time.Second), jetstream.PullHeartbeat(time.Second))
	if err != nil {
		return fmt.Errorf("grouping: ingress: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			r.log.Warn("ingress read error", "err", err)
			continue
		}
		r.ingest(msg)
	}
}

// ingest takes one ingress message, in stream order.
func (r *Router) ingest(msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		r.log.Warn("ingress message without metadata", "err", err)
		return
	}
	seq := meta.Sequence.Stream
	hdr := msg.Headers()
	group, present := groupID(hdr, r.cfg.GroupHeader)
	rec := &msgRec{seq: seq, subject: msg.Subject(), size: len(msg.Data()) + len(msg.Subject())}
	if v, ok := hdr[HeaderGroupSeq]; ok && len(v) > 0 && v[0] == "-1" {
		rec.close = true
	}
	if present {
		if err := kvbinding.ValidateGroupID(group); err != nil {
			rec.invalid = fmt.Sprintf("invalid %s header: %v", r.cfg.GroupHeader, err)
			group = ""
		}
	}
	rec.hdr, rec.data = hdr, msg.Data()

	r.mu.Lock()
	defer r.mu.Unlock()
	for !r.closing && (r.heldMsgs >= r.cfg.MaxHeldMessages || r.heldBytes >= r.cfg.MaxHeldBytes || r.inflight >= r.cfg.MaxInFlight) {
		r.cond.Wait()
	}
	if r.closing {
		return
	}
	r.track.add(seq)
	if r.resume.done(seq) {
		r.track.resolve(seq)
		return
	}
	ln := r.lanes[group]
	if ln == nil {
		if route, ok := r.cache.Lookup(group); ok {
			if owner, act := route.Owner(seq, r.cfg.Node); act == kvbinding.ActRoute && owner != r.cfg.Node {
				// Routed by another node (or dead-lettered by one).
				r.track.resolve(seq)
				r.skipped.Add(1)
				return
			}
		}
		ln = &lane{group: group}
		r.lanes[group] = ln
	}
	ln.msgs = append(ln.msgs, rec)
	r.heldMsgs++
	r.heldBytes += int64(rec.size)
	r.pump(ln)
}

// groupID returns the group header's value and whether it is present. NATS
// headers are case-sensitive; a differently cased name is accepted too.
func groupID(h nats.Header, name string) (string, bool) {
	if v, ok := h[name]; ok && len(v) > 0 {
		return v[0], true
	}
	for k, v := range h {
		if len(v) > 0 && len(k) == len(name) && equalFold(k, name) {
			return v[0], true
		}
	}
	return "", false
}

func equalFold(a, b string) bool {
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// prepare builds the message to republish: body and headers kept, the
// producer's JetStream control headers renamed, dedup id from the ingress
// sequence. The subject is filled in when the destination is known.
func (r *Router) prepare(rec *msgRec, hdr nats.Header, data []byte) *nats.Msg {
	out := &nats.Msg{Header: nats.Header{}, Data: data}
	for k, v := range hdr {
		if len(k) > 5 && equalFold(k[:5], "Nats-") {
			out.Header[HeaderOrigPrefix+k] = v
			continue
		}
		out.Header[k] = v
	}
	seq := strconv.FormatUint(rec.seq, 10)
	out.Header.Set(jetstream.MsgIDHeader, IngressStream+":"+seq)
	out.Header.Set(HeaderIngressSeq, seq)
	return out
}

// pump moves a lane forward as far as it can. r.mu is held.
func (r *Router) pump(ln *lane) {
	if ln.deadLettering || ln.changing {
		return
	}
	for len(ln.msgs) > 0 && (ln.inflight == 0 || ln.group == "") {
		m := ln.msgs[0]
		route, known := r.cache.Lookup(ln.group)
		owner, act := "", kvbinding.ActPropose
		if known {
			owner, act = route.Owner(m.seq, r.cfg.Node)
		}
		switch act {
		case kvbinding.ActPropose:
			ln.waiting = true
			r.needProposal(ln)
			return
		case kvbinding.ActWait:
			ln.waiting = false
			r.dropProposal(ln)
			r.concerns(ln.group, route, ln)
			return
		}
		ln.waiting = false
		r.dropProposal(ln)
		if owner != r.cfg.Node {
			r.popDone(ln)
			r.skipped.Add(1)
			continue
		}
		if ln.group == "" {
			// Ungrouped: no order to keep, publish them all at once.
			ln.msgs = ln.msgs[1:]
			ln.inflight++
			r.inflight++
			r.publishUngrouped(ln, m)
			continue
		}
		ln.inflight = 1
		r.inflight++
		r.publishQueue(ln, m, QueueSubject(r.cfg.Node, m.subject))
		return
	}
	if len(ln.msgs) == 0 && ln.inflight == 0 {
		r.dropProposal(ln)
		delete(r.lanes, ln.group)
	}
}

// popDone removes a lane's head as done. r.mu is held.
func (r *Router) popDone(ln *lane) {
	m := ln.msgs[0]
	ln.msgs[0] = nil
	ln.msgs = ln.msgs[1:]
	r.release(m)
}

// release accounts a message as done. r.mu is held.
func (r *Router) release(m *msgRec) {
	r.heldMsgs--
	r.heldBytes -= int64(m.size)
	r.track.resolve(m.seq)
	r.cond.Broadcast()
}

func (r *Router) publishUngrouped(ln *lane, m *msgRec) {
	if m.invalid != "" {
		r.publishDeadLetter(ln, m, m.invalid)
		return
	}
	r.publishQueue(ln, m, QueueSubject(r.ungroupedDestination(), m.subject))
}

// ungroupedDestination picks the node for an ungrouped message: this node
// if LocalFirst and it has a consumer, else round-robin over the nodes with
// a consumer (over all live nodes when none has one). r.mu is held.
func (r *Router) ungroupedDestination() string {
	if r.cfg.LocalFirst && r.hasConsumer.Load() {
		return r.cfg.Node
	}
	eligible := proposals.Eligible(r.liveState, false)
	if len(eligible) == 0 {
		return r.cfg.Node
	}
	r.rr++
	return eligible[r.rr%len(eligible)]
}

// outMsg returns m's message to republish, preparing it on first use (a
// node skips most messages: it copies only those it routes). r.mu is held.
func (r *Router) outMsg(m *msgRec) *nats.Msg {
	if m.out == nil {
		m.out = r.prepare(m, m.hdr, m.data)
		m.hdr, m.data = nil, nil
	}
	return m.out
}

func (r *Router) publishQueue(ln *lane, m *msgRec, subject string) {
	r.outMsg(m)
	m.out.Subject = subject
	m.out.Header.Set(jetstream.ExpectedStreamHeader, QueueStream)
	r.send(ln, m, func() { r.routed.Add(1) })
}

func (r *Router) publishDeadLetter(ln *lane, m *msgRec, reason string) {
	r.outMsg(m)
	m.out.Subject = DeadLetterSubjectPrefix + m.subject
	m.out.Header.Set(HeaderDeadReason, reason)
	m.out.Header.Set(jetstream.ExpectedStreamHeader, DeadLetterStream)
	m.out.Header.Set(jetstream.MsgIDHeader, "dlq:"+IngressStream+":"+strconv.FormatUint(m.seq, 10))
	r.send(ln, m, func() { r.deadLetters.Add(1) })
}

// send publishes m.out and, once stored, releases it and moves the lane on.
// A failure is retried with the same message (same Nats-Msg-Id) after a
// pause; the lane stays blocked meanwhile, so the group keeps its order.
// r.mu is held.
func (r *Router) send(ln *lane, m *msgRec, onStored func()) {
	err := r.pub.Publish(m.out, func(_ jspub.Ack, err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil {
			r.retrySend(ln, m, onStored, err)
			return
		}
		onStored()
		ln.inflight--
		r.inflight--
		if ln.group != "" {
			ln.msgs[0] = nil
			ln.msgs = ln.msgs[1:]
			r.touch(ln.group)
		}
		r.release(m)
		if m.close && ln.group != "" {
			// The group's last message is on its queue: release the binding
			// (later messages of the group wait for it, then bind afresh).
			r.startRelease(ln, m.seq, proposals.EventClose, "closed by a "+HeaderGroupSeq+": -1 message")
			return
		}
		r.pump(ln)
	})
	if err != nil {
		r.retrySend(ln, m, onStored, err)
	}
}

// retrySend schedules a publish retry. r.mu is held.
func (r *Router) retrySend(ln *lane, m *msgRec, onStored func(), err error) {
	n := r.pubErrs.Add(1)
	if n&(n-1) == 0 { // log at powers of two: visible without flooding
		r.log.Warn("queue publish failed, retrying", "seq", m.seq, "subject", m.out.Subject, "err", err, "failures", n)
	}
	time.AfterFunc(100*time.Millisecond, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.closing {
			ln.inflight--
			r.inflight--
			return
		}
		r.send(ln, m, onStored)
	})
}

// onBinding is called by the cache after a binding changed.
func (r *Router) onBinding(b kvbinding.Binding, deleted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ln := r.lanes[b.Group]; ln != nil {
		r.pump(ln)
		return
	}
	if !deleted {
		if route, ok := r.cache.Lookup(b.Group); ok {
			r.concerns(b.Group, route, nil)
		}
	}
}

// resumeChanges picks up, after a start, the changes in progress that
// concern this node (hand-overs it owes, takeovers handed to it).
func (r *Router) resumeChanges() {
	type pending struct {
		group string
		route kvbinding.Route
	}
	var todo []pending
	r.cache.Each(func(g string, route kvbinding.Route) bool {
		if (route.State == kvbinding.StateMoving && route.PrevNode == r.cfg.Node) ||
			(route.State == kvbinding.StateBound && route.Handoff && route.Node == r.cfg.Node) {
			todo = append(todo, pending{g, route})
		}
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range todo {
		r.concerns(p.group, p.route, r.lanes[p.group])
	}
}

// onLiveChange is called by the registry when the set of live nodes (or
// their consumer presence) changed.
func (r *Router) onLiveChange() {
	live := r.reg.Live()
	ids := make([]string, 0, len(live))
	state := make(map[string]proposals.NodeState, len(live))
	for id, info := range live {
		ids = append(ids, id)
		state[id] = proposals.NodeState{HasConsumer: info.HasConsumer}
	}
	sort.Strings(ids)
	r.mu.Lock()
	r.live, r.liveState = ids, state
	r.mu.Unlock()
}

// isProposer reports whether this node is the one that proposes for group:
// the highest rendezvous hash over the live nodes (and itself). r.mu is held.
func (r *Router) isProposer(group string) bool {
	best, bestNode := uint64(0), ""
	consider := func(node string) {
		h := fnv.New64a()
		_, _ = h.Write([]byte(node))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(group))
		// FNV-1a alone leaves ids that share a prefix clustered in the
		// high bits; a 64-bit finalizer spreads them.
		if v := mix64(h.Sum64()); bestNode == "" || v > best || (v == best && node < bestNode) {
			best, bestNode = v, node
		}
	}
	consider(r.cfg.Node)
	for _, n := range r.live {
		consider(n)
	}
	return bestNode == r.cfg.Node
}

// mix64 is the MurmurHash3 64-bit finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb93e53ca34d5
	x ^= x >> 33
	return x
}

// heartbeat announces the node every cfg.Heartbeat, with whether its queue
// consumer has an active puller.
func (r *Router) heartbeat(ctx context.Context, cons jetstream.Consumer) {
	every(ctx, r.cfg.Heartbeat, func() { r.announce(ctx, cons) })
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

func (r *Router) nodeTTL() time.Duration {
	ttl := 3 * r.cfg.Heartbeat
	if ttl < time.Second {
		ttl = time.Second
	}
	return ttl
}

func (r *Router) announce(ctx context.Context, cons jetstream.Consumer) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Heartbeat)
	defer cancel()
	if info, err := cons.Info(ctx); err == nil {
		r.hasConsumer.Store(info.NumWaiting > 0)
	}
	st := r.Stats()
	info := kvbinding.NodeInfo{
		Node: r.cfg.Node, Type: string(r.cfg.Type), Handler: r.cfg.Name,
		HasConsumer: r.hasConsumer.Load(), Started: r.started, Heartbeat: time.Now().UTC(), Every: r.cfg.Heartbeat,
		Position: st.Position, Held: st.Held, Routed: st.Routed,
		DecisionErrors: st.DecisionErrors, DeadLettered: st.DeadLettered,
	}
	info.Waiting, info.WaitingGroups = r.heldUndecided(info.Heartbeat)
	if err := r.reg.Announce(ctx, info, r.nodeTTL()); err != nil && ctx.Err() == nil {
		r.log.Warn("announce failed", "err", err)
	}
}

// checkpointLoop saves the routing position every cfg.CheckpointInterval.
func (r *Router) checkpointLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.CheckpointInterval)
	defer t.Stop()
	var last kvbinding.Checkpoint
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		c := r.track.checkpoint()
		r.mu.Unlock()
		if c.Next == 0 || (c.Next == last.Next && len(c.Pending) == 0 && len(last.Pending) == 0) {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, r.cfg.CheckpointInterval)
		if err := r.reg.SaveCheckpoint(sctx, r.cfg.Node, c); err == nil {
			last = c
		} else if ctx.Err() == nil {
			r.log.Warn("checkpoint not saved", "err", err)
		}
		cancel()
	}
}
