package proposals

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// Queues is what the handler needs of the node queues: pausing and
// resuming a node's queue consumer while its queue is drained, and the
// ingress stream's last sequence to check the sequences nodes report.
// The router supplies it.
type Queues interface {
	// Pause pauses node's queue consumer until until.
	Pause(ctx context.Context, node string, until time.Time) error
	// Resume resumes node's queue consumer.
	Resume(ctx context.Context, node string) error
	// IngressLast returns the ingress stream's last sequence.
	IngressLast(ctx context.Context) (uint64, error)
}

// DefaultMaxGroups is HandlerConfig.MaxGroups's default: a node's cache
// holds a bound group in about 100-200 bytes whatever the length of its
// id (docs/operations.md, "Memory"), so a full cluster costs each node a
// few hundred MB at most.
const DefaultMaxGroups = 1_000_000

// HandlerConfig configures a LOCAL handler.
type HandlerConfig struct {
	// Name is the grouping-handler name; a hot backup uses the same name.
	Name string
	// Node is the id of the node the handler runs on.
	Node string
	// LeaseTTL is how long the active handler's lease lives without
	// renewal. A standby also probes the active handler and takes over at
	// once when it has stopped answering (a crashed process). Default 2s;
	// the registry rounds it to whole seconds.
	LeaseTTL time.Duration
	// NodeGrace is how long a node may be gone (its liveness record
	// expired) before its groups move to other nodes. Default 15s.
	NodeGrace time.Duration
	// RebindAfter is how long a live node's queue may have no consumer,
	// while another node's has one, before its groups move. Default 30s;
	// negative disables.
	RebindAfter time.Duration
	// FenceDeadline is how long a node may take to fence a group moving
	// away from it before the handler fences it from the node's
	// checkpoint, as for a node that is gone. Default 10s.
	FenceDeadline time.Duration
	// RecordTTL is how long an ended record (released, dead-lettered) is
	// kept. Default 10m.
	RecordTTL time.Duration
	// InboxPrefix: requests are answered only when the first token of
	// their reply subject starts with the first token of InboxPrefix.
	// Default "_INBOX". Only the first token counts so that nodes with
	// their own prefixes under one stem (_INBOX.node-n1, _INBOX.node-n2:
	// the per-user inboxes of `grouprouter permissions`) reach the handler
	// of a node whose own prefix is _INBOX.node-n0.
	InboxPrefix string
	// Queues pauses and resumes queue consumers during moves; nil disables
	// pausing and the ingress sequence check (tests of the protocol alone).
	Queues Queues
	// Rebalance tunes the moves that spread groups over the nodes whose
	// queue has a consumer; nil: DefaultRebalance. Zero MaxMoves,
	// MaxInFlight, CoolDown and Slack take DefaultRebalance's.
	Rebalance *RebalanceConfig
	// MaxGroups bounds the groups bound at once (bound or being moved;
	// ended records expire by themselves): a new group past it is refused
	// (ErrGroupLimit) and its messages are dead-lettered by the node that
	// proposed it, so that a flood of distinct ids cannot exhaust any
	// node's memory (each node caches every binding). Room comes back as
	// groups close or expire (GroupTimeout). Default DefaultMaxGroups;
	// negative: no limit. Concurrent batches count each other's binds
	// while they are written (groupLimit), so one handler never binds past
	// it; a handler that just took over counts what its cache holds.
	MaxGroups int
	// Workers bounds how many requests are decided at once. Default 16.
	Workers int
	// Version is reported by the NATS micro service. Default "0.0.0-dev".
	Version string
	// Metrics is where the handler counts (see Metrics); nil: in metrics
	// of its own that nobody registered.
	Metrics *Metrics
	// Logger defaults to a discarding logger.
	Logger *slog.Logger
}

func (c HandlerConfig) withDefaults() HandlerConfig {
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 2 * time.Second
	}
	if c.NodeGrace <= 0 {
		c.NodeGrace = 15 * time.Second
	}
	if c.RebindAfter == 0 {
		c.RebindAfter = 30 * time.Second
	}
	if c.FenceDeadline <= 0 {
		c.FenceDeadline = 10 * time.Second
	}
	if c.RecordTTL <= 0 {
		c.RecordTTL = 10 * time.Minute
	}
	if c.InboxPrefix == "" {
		c.InboxPrefix = nats.InboxPrefix[:len(nats.InboxPrefix)-1]
	}
	if c.Workers <= 0 {
		c.Workers = 16
	}
	if c.MaxGroups == 0 {
		c.MaxGroups = DefaultMaxGroups
	}
	rb := DefaultRebalance
	if c.Rebalance != nil {
		rb = *c.Rebalance
		if rb.MaxMoves <= 0 {
			rb.MaxMoves = DefaultRebalance.MaxMoves
		}
		if rb.MaxInFlight <= 0 {
			rb.MaxInFlight = DefaultRebalance.MaxInFlight
		}
		if rb.CoolDown <= 0 {
			rb.CoolDown = DefaultRebalance.CoolDown
		}
		if rb.ReturnCoolDown == 0 {
			rb.ReturnCoolDown = DefaultRebalance.ReturnCoolDown
		}
		rb.Tolerance = max(rb.Tolerance, 0)
		if rb.Slack == 0 {
			rb.Slack = DefaultRebalance.Slack
		}
		rb.Slack = max(rb.Slack, 0)
	}
	c.Rebalance = &rb
	if c.Version == "" {
		c.Version = "0.0.0-dev"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// ServiceName is the NATS micro service name of the handler: `nats micro
// ls` lists the active handler (metadata role=active) and its standbys
// (role=standby).
const ServiceName = "grouprouter"

// SubjectHandlerPrefix + <name> + ".ping" is the active handler's ping
// subject: standbys probe it to learn at once that the active one is gone.
const SubjectHandlerPrefix = "grouping.handler."

func pingSubject(name string) string { return SubjectHandlerPrefix + name + ".ping" }

// Handler is a LOCAL grouping handler, the only writer of binding records.
// Run competes for the handler lease named after the handler; only the
// holder answers, so among a handler and its hot backups exactly one
// answers at a time. Records are written with KV create or compare-and-set
// before the reply, so even two overlapping handlers converge on one
// record per group.
type Handler struct {
	locks *groupLocks // one decision at a time per group
	nc    *nats.Conn
	store *kvbinding.Store
	cache *kvbinding.Cache
	reg   *kvbinding.Registry
	cfg   HandlerConfig
	log   *slog.Logger
	id    string

	active    atomic.Bool
	decisions atomic.Uint64
	dropped   atomic.Uint64 // requests dropped: reply subject not an inbox
	busy      atomic.Uint64 // requests refused: too many in progress
	// Binds refused at the group limit (limit.go).
	limit        groupLimit
	limitRefused atomic.Uint64
	limitEvent   atomic.Int64 // unix nanoseconds of the last limit event
	warnLimit    *logagg.Warner
	mon          monitor
	// pauses carries requests to the pauser goroutine (pauser.go), which
	// runs while pauserRunning.
	pauses        chan pauseReq
	pauserRunning atomic.Bool
	ingress       ingressLast
	metrics       *Metrics
	svcStats      serviceStats

	// The routing floor (floor.go): binds below it are refused.
	// floorWarned is keepFloor's (one at a time: one per term).
	floor       atomic.Uint64
	floorWarned time.Time

	// lastHolder is the last other holder of the lease seen; suspect is
	// the node of a holder whose lease expired or that stopped answering
	// (it did not release it: presumably crashed), ineligible until it
	// announces itself again.
	lastHolder   atomic.Value // string
	suspectMu    sync.Mutex
	suspect      string
	suspectSince time.Time

	harden registryHardening // harden.go

	// auth is until when this handler may decide, by its own clock
	// (authority.go).
	auth authority

	// After the bindings bucket went back (rewind.go): the revision the
	// bucket is known to be past, and the one advance at a time.
	advanced  atomic.Uint64
	advancing sync.Mutex
}

// NewHandler returns a handler deciding with the given shared state. cache
// and reg must be kept current by their Run methods.
func NewHandler(nc *nats.Conn, store *kvbinding.Store, cache *kvbinding.Cache, reg *kvbinding.Registry, cfg HandlerConfig) *Handler {
	cfg = cfg.withDefaults()
	h := &Handler{
		locks: newGroupLocks(),
		nc:    nc, store: store, cache: cache, reg: reg, cfg: cfg,
		log: cfg.Logger.With("component", "handler"),
		id:  cfg.Name + "/" + cfg.Node,

		metrics: cfg.Metrics,
		pauses:  make(chan pauseReq, 64),
		auth:    newAuthority(),
	}
	if h.metrics == nil {
		h.metrics = NewMetrics()
	}
	h.metrics.h.Store(h)
	h.warnLimit = logagg.New(h.log, "new groups refused: as many groups are bound as the limit (--max-groups); their messages are dead-lettered", logagg.DefaultEvery)
	return h
}

// ID returns the handler's id, name/node.
func (h *Handler) ID() string { return h.id }

// Active reports whether this handler currently holds the lease and answers.
func (h *Handler) Active() bool { return h.active.Load() }

// Decisions returns how many proposals this handler has answered.
func (h *Handler) Decisions() uint64 { return h.decisions.Load() }

// Dropped returns how many requests were dropped unanswered because their
// reply subject was not under the inbox prefix.
func (h *Handler) Dropped() uint64 { return h.dropped.Load() }

// Run competes for the lease and answers proposals while holding it, until
// ctx ends; then it stops answering and releases the lease so that a
// backup takes over at once. Every goroutine it starts has ended when it
// returns.
func (h *Handler) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	notify := func(holder string) {
		if holder == h.id {
			return // our own renewal
		}
		if holder != "" {
			h.lastHolder.Store(holder)
		}
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	var bg sync.WaitGroup
	defer bg.Wait()
	defer h.warnLimit.Close()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	bg.Add(1)
	h.pauserRunning.Store(true)
	go func() {
		defer bg.Done()
		defer h.pauserRunning.Store(false)
		h.runPauser(watchCtx)
	}()
	if err := h.reg.WatchLease(watchCtx, h.cfg.Name, notify, &bg); err != nil {
		return fmt.Errorf("proposals: watch lease: %w", err)
	}
	tick := max(h.cfg.LeaseTTL/4, 100*time.Millisecond)
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	// Standbys probe the active handler more often than they look at the
	// lease: a crashed handler's subscriptions vanish at once, its lease
	// only after its TTL.
	probe := time.NewTicker(max(tick/2, 100*time.Millisecond))
	defer probe.Stop()

	var (
		lease kvbinding.Lease
		term  *term
		svc   micro.Service
	)
	// authEnd fires when the authority of the last successful renewal
	// ends (authority.go): the handler then stands down unless a renewal
	// succeeded meanwhile.
	authEnd := time.NewTimer(time.Hour)
	authEnd.Stop()
	defer authEnd.Stop()
	h.auth.revoke()
	standby := func() {
		if svc != nil {
			_ = svc.Stop()
		}
		svc = h.addService(nil)
	}
	stop := func() {
		if term != nil {
			h.auth.revoke()
			term.end()
			term = nil
			h.active.Store(false)
			h.mon.reset()
		}
	}
	granted := func(sent time.Time) {
		until := h.auth.grant(sent, h.cfg.LeaseTTL)
		authEnd.Reset(max(time.Until(until), 0))
	}
	// lapsed stands down a handler whose lease was not renewed in time by
	// its own clock: a standby may take the lease once the servers expire
	// it, and this handler, cut off from them, cannot know whether they did.
	lapsed := func(cause string) {
		if term == nil || h.auth.holds(time.Now()) {
			return
		}
		h.log.Warn("lease not renewed within its TTL by this handler's clock: stopped deciding, standing down",
			"cause", cause, "lease_ttl", h.cfg.LeaseTTL, "margin", authorityMargin(h.cfg.LeaseTTL))
		standby()
		stop()
	}
	defer func() {
		held := term != nil
		if svc != nil {
			_ = svc.Stop() // first: no request is admitted that no worker would take
		}
		stop()
		if held {
			h.release()
		}
	}()
	standby()
	for {
		timeout := max(h.cfg.LeaseTTL/2, time.Second)
		if term != nil {
			// A renewal that outlasts the authority is useless: give up on
			// it then, and stand down.
			timeout = min(timeout, max(h.auth.left(time.Now()), 10*time.Millisecond))
		}
		opCtx, cancel := context.WithTimeout(ctx, timeout)
		if term == nil {
			sent := time.Now()
			l, err := h.reg.AcquireLease(opCtx, h.cfg.Name, h.id, h.cfg.LeaseTTL)
			if err == nil && !h.auth.grantable(sent, h.cfg.LeaseTTL) {
				// Acquired, but the answer took so long that the lease may
				// lapse before this handler could use it: renew first.
				lease = l
				err = errLeaseLate
			}
			if err == nil {
				lease = l
				granted(sent)
				suspect := h.suspectPrevious()
				if svc != nil {
					// The standby's registration goes first: discovery
					// never lists this node twice.
					_ = svc.Stop()
					svc = nil
				}
				h.loadFloor(opCtx)
				t, s, err := h.begin(ctx)
				if err != nil {
					cancel()
					return err
				}
				term, svc = t, s
				t.goFn(func() { h.keepFloor(t.ctx) }) // floor.go
				h.active.Store(true)
				h.log.Info("handler active", "lease_rev", lease.Revision, "decides_for", h.auth.left(time.Now()).Round(time.Millisecond))
				// Nodes retry their failed asks at once, and stop counting
				// on the previous holder's node (PrevNode) to propose.
				h.publish(Event{Kind: EventHandlerTakeover, By: h.id, PrevNode: suspect, Reason: "lease acquired"})
			} else if !errors.Is(err, kvbinding.ErrLeaseHeld) && !errors.Is(err, errLeaseLate) && ctx.Err() == nil {
				h.log.Warn("lease acquire failed; retrying", "err", err)
			}
		} else {
			sent := time.Now()
			l, err := h.reg.RenewLease(opCtx, h.cfg.Name, lease, h.cfg.LeaseTTL)
			switch {
			case err == nil:
				lease = l
				granted(sent)
			case errors.Is(err, kvbinding.ErrLeaseLost):
				h.log.Warn("lease lost: standing down")
				standby() // first: the active service stops admitting requests
				stop()
			default:
				// Transient (e.g. a leader election, or this handler cut
				// off from the servers' quorum): keep deciding only while
				// the last renewal that succeeded lasts by this handler's
				// own clock.
				if ctx.Err() == nil {
					h.log.Warn("lease renew failed", "err", err, "decides_for", h.auth.left(time.Now()).Round(time.Millisecond))
				}
				lapsed("renew failed: " + err.Error())
			}
		}
		cancel()
		if term != nil {
			h.watchNodes(ctx, term)
		}
		// Each pass of the outer loop renews (or acquires) the lease: the
		// active handler's passes are its ticker's, a wake-up and its
		// authority's end; its monitor also runs on the probe's beat.
	wait:
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-ticker.C:
			case <-wake:
			case <-authEnd.C:
				lapsed("no renewal succeeded in time")
			case <-probe.C:
				if term != nil {
					h.watchNodes(ctx, term)
					continue wait
				}
				// Two probes 50 ms apart without a responder: the active
				// handler's process is gone (one miss may be a handler that
				// just took the lease and is subscribing). A probe that times
				// out is not enough (authority.go): the handler may be alive
				// behind a link that holds its traffic.
				if h.activeGone(ctx) && sleepCtx(ctx, 50*time.Millisecond) && h.activeGone(ctx) {
					h.breakLease(ctx)
				}
			}
			break
		}
	}
}

// errLeaseLate: a lease acquisition was answered too late to be used.
var errLeaseLate = errors.New("proposals: lease acquired too late to use; renewing it first")

// term is one stretch of time this handler is active: its workers and
// the channel carrying admitted requests to them.
type term struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	work   chan func()
}

func (t *term) end() {
	t.cancel()
	t.wg.Wait()
}

// go runs fn in a goroutine the term waits for.
func (t *term) goFn(fn func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		fn()
	}()
}

// begin starts a term: the workers, then the service with its endpoints.
func (h *Handler) begin(ctx context.Context) (*term, micro.Service, error) {
	tctx, cancel := context.WithCancel(ctx)
	work := make(chan func(), 4*h.cfg.Workers)
	t := &term{ctx: tctx, cancel: cancel, work: work}
	for i := 0; i < h.cfg.Workers; i++ {
		t.goFn(func() {
			for {
				select {
				case <-tctx.Done():
					return
				case fn := <-work:
					fn()
				}
			}
		})
	}
	svc := h.addService(t)
	if svc == nil {
		t.end()
		return nil, nil, fmt.Errorf("proposals: cannot start the %s service", ServiceName)
	}
	_ = h.nc.Flush()
	return t, svc, nil
}

// addService registers the handler as a NATS micro service: with its
// endpoints while active (t != nil), as a visible standby otherwise.
func (h *Handler) addService(t *term) micro.Service {
	role := "standby"
	if t != nil {
		role = "active"
	}
	svc, err := micro.AddService(h.nc, micro.Config{
		Name:        ServiceName,
		Version:     h.cfg.Version,
		Description: "grouprouter LOCAL grouping handler " + h.cfg.Name,
		Metadata:    map[string]string{"handler": h.cfg.Name, "node": h.cfg.Node, "role": role},
		QueueGroup:  handlerQueue,
		// The endpoints hand requests to workers (see admit), so micro's
		// own processing time is the hand-off's; each endpoint's stats
		// data carries the real figures (serviceStats).
		StatsHandler: h.statsData,
	})
	if err != nil {
		h.log.Error("NATS service not registered", "err", err)
		return nil
	}
	if t == nil {
		return svc
	}
	add := func(name, subject string, fn micro.HandlerFunc) bool {
		if err := svc.AddEndpoint(name, fn, micro.WithEndpointSubject(subject)); err != nil {
			h.log.Error("NATS service endpoint not registered", "endpoint", name, "err", err)
			return false
		}
		return true
	}
	if !add("propose", SubjectPropose, func(r micro.Request) { h.admit(t, r, h.serve, &h.svcStats.propose) }) ||
		!add("admin", SubjectAdmin, func(r micro.Request) { h.admit(t, r, h.serveAdmin, &h.svcStats.admin) }) ||
		!add("ping", pingSubject(h.cfg.Name), func(r micro.Request) {
			if h.inbox(r.Reply()) {
				_ = r.Respond([]byte(h.id))
			}
		}) {
		_ = svc.Stop()
		return nil
	}
	return svc
}

// admit checks a request's reply subject and hands it to a worker without
// blocking the subscription's callback: a request whose reply subject is
// not an inbox is dropped (and counted); one that finds every worker busy
// is answered with an error at once (the asker retries). The worker
// answers with respond, never with r's own methods: micro reads what they
// record once this callback returns, which would race with the worker.
func (h *Handler) admit(t *term, r micro.Request, serve func(context.Context, micro.Request) bool, st *endpointStats) {
	if !h.inbox(r.Reply()) {
		n := h.dropped.Add(1)
		if n&(n-1) == 0 {
			h.log.Warn("dropped a request whose reply subject is not an inbox", "subject", r.Subject(), "reply", truncate(r.Reply(), 128), "dropped", n)
		}
		return
	}
	admitted := time.Now()
	select {
	case t.work <- func() { st.served(time.Since(admitted), serve(t.ctx, r)) }:
	default:
		h.busy.Add(1)
		_ = r.Error("503", "handler busy; try again", nil)
	}
}

// inbox reports whether a reply subject is under the inbox prefix: its
// first token starts with the prefix's first token, and it is a plain
// subject (no wildcards).
func (h *Handler) inbox(reply string) bool {
	first, _, _ := strings.Cut(reply, ".")
	stem, _, _ := strings.Cut(h.cfg.InboxPrefix, ".")
	if reply == "" || !strings.HasPrefix(first, stem) || strings.ContainsAny(reply, "*> \t\r\n") ||
		strings.Contains(reply, "..") || strings.HasSuffix(reply, ".") {
		return false
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// activeGone probes the active handler; it reports true when nobody
// answers on its ping subject while the lease still names another holder.
func (h *Handler) activeGone(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, max(h.cfg.LeaseTTL/4, 250*time.Millisecond))
	defer cancel()
	_, err := h.nc.RequestWithContext(pctx, pingSubject(h.cfg.Name), nil)
	return errors.Is(err, nats.ErrNoResponders)
}

// sleepCtx waits d, or less if ctx ends; it reports whether ctx is live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// breakLease takes over the lease of an active handler that stopped
// answering: it deletes the lease at the revision it has (so a handler
// that renewed it meanwhile keeps it) and lets the next tick acquire it.
func (h *Handler) breakLease(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	cur, err := h.reg.GetLease(ctx, h.cfg.Name)
	if err != nil || cur.Holder == h.id {
		return
	}
	if err := h.reg.ReleaseLease(ctx, h.cfg.Name, cur); err != nil {
		return
	}
	h.lastHolder.Store(cur.Holder)
	h.log.Warn("the active handler stopped answering; taking its lease over", "holder", cur.Holder)
	l, err := h.reg.AcquireLease(ctx, h.cfg.Name, h.id, h.cfg.LeaseTTL)
	if err == nil {
		// Let the run loop's next acquire find it ours.
		_ = l
	}
}

// release deletes this handler's lease so that a backup takes over at
// once. The revision known here may be stale (a renewal in flight when the
// run ended was stored without its ack being read), so it reads the lease
// and deletes it at its current revision while this handler still holds it.
func (h *Handler) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for attempt := 0; attempt < 3; attempt++ {
		cur, err := h.reg.GetLease(ctx, h.cfg.Name)
		if err != nil || cur.Holder != h.id {
			return // expired or taken over already
		}
		if err = h.reg.ReleaseLease(ctx, h.cfg.Name, cur); err == nil {
			h.log.Info("handler stopped and released its lease")
			return
		}
		h.log.Warn("lease release failed", "err", err)
	}
}

// suspectPrevious marks the node of the previous lease holder as crashed
// when this handler took over a lease that was not released.
func (h *Handler) suspectPrevious() string {
	prev, _ := h.lastHolder.Load().(string)
	if prev == "" || prev == h.id {
		return ""
	}
	node := prev
	if i := strings.LastIndexByte(prev, '/'); i >= 0 {
		node = prev[i+1:]
	}
	if node == h.cfg.Node {
		return ""
	}
	h.suspectMu.Lock()
	h.suspect, h.suspectSince = node, time.Now()
	h.suspectMu.Unlock()
	h.log.Warn("took over the lease of a handler that did not release it; its node is ineligible until it announces again", "node", node)
	return node
}

// liveState returns the live nodes the rules may choose from, with their
// bound group counts.
func (h *Handler) liveState() map[string]NodeState {
	h.suspectMu.Lock()
	suspect, since := h.suspect, h.suspectSince
	h.suspectMu.Unlock()
	return LiveState(time.Now(), h.reg, h.cache.Counts(), suspect, since)
}

// LiveState returns the live nodes the rules may choose from at now, with
// their bound group counts (counts: Cache.Counts): those announced, but
// not suspect (a node whose lease the handler took over without its
// release, until it announces itself after since) nor silent for longer
// than their liveness record's TTL by this process's clock.
func LiveState(now time.Time, reg LiveReader, counts map[string]int, suspect string, since time.Time) map[string]NodeState {
	live := reg.Live()
	out := make(map[string]NodeState, len(live))
	for id, info := range live {
		seen := reg.Seen(id)
		if id == suspect && !seen.After(since) {
			continue
		}
		if info.Every > 0 && !seen.IsZero() && now.Sub(seen) > kvbinding.NodeTTL(info.Every) {
			continue
		}
		out[id] = NodeState{HasConsumer: info.HasConsumer, Groups: counts[id]}
	}
	return out
}

// publish sends an event (fire and forget).
func (h *Handler) publish(e Event) { e.Publish(h.nc) }

// ingressLast caches the ingress stream's last sequence for checking the
// sequences nodes report: refreshed when a report is past it. mu is not
// held across the stream read: one caller reads (fetching), the others
// use the cached value meanwhile.
type ingressLast struct {
	mu       sync.Mutex
	last     uint64
	at       time.Time
	fetching bool
}

// ingressLastFor returns the ingress stream's last sequence, to check a
// dead-letter ask through seq: the cached one when it covers seq, else a
// fresh one (the stream is asked at most every 50 ms, by one caller at a
// time); 0 when unknown (the ask then fails and is asked again).
func (h *Handler) ingressLastFor(ctx context.Context, seq uint64) uint64 {
	q := h.cfg.Queues
	if q == nil {
		return 0
	}
	il := &h.ingress
	il.mu.Lock()
	if seq <= il.last || time.Since(il.at) < 50*time.Millisecond || il.fetching {
		defer il.mu.Unlock()
		return il.last
	}
	il.fetching = true
	il.mu.Unlock()
	last, err := q.IngressLast(ctx)
	il.mu.Lock()
	defer il.mu.Unlock()
	il.fetching = false
	if err != nil {
		h.log.Warn("cannot read the ingress stream's last sequence to check a dead-letter ask", "err", err)
		return il.last
	}
	il.last, il.at = max(il.last, last), time.Now()
	return il.last
}
