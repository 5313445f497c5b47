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
	"golang.org/x/sync/errgroup"

	"grouprouter/kvbinding"
)

// HandlerConfig configures a LOCAL handler.
type HandlerConfig struct {
	// Name is the grouping-handler name; a hot backup uses the same name.
	Name string
	// Node is the id of the node the handler runs on.
	Node string
	// LeaseTTL is how long the active handler's lease lives without
	// renewal; a standby takes over at most about this long after the
	// active one dies. Default 2s; the registry rounds it to whole seconds.
	LeaseTTL time.Duration
	// NodeGrace is how long a node may be gone (its liveness record
	// expired) before its groups move to other nodes. Default 15s.
	NodeGrace time.Duration
	// RebindAfter is how long a live node's queue may have no consumer,
	// while another node's has one, before its groups move. Default 30s;
	// negative disables.
	RebindAfter time.Duration
	// RecordTTL is how long an ended record (released) is kept. Default 10m.
	RecordTTL time.Duration
	// Logger defaults to a discarding logger.
	Logger *slog.Logger
}

// Handler is a LOCAL grouping handler. Run competes for the handler lease
// named after the handler; only the holder answers proposals, so among a
// handler and its hot backups exactly one answers at a time. Bindings are
// written with KV create or compare-and-set before the reply, so even two
// overlapping handlers converge on one binding per group.
type Handler struct {
	nc    *nats.Conn
	store *kvbinding.Store
	cache *kvbinding.Cache
	reg   *kvbinding.Registry
	cfg   HandlerConfig
	log   *slog.Logger
	id    string

	active    atomic.Bool
	decisions atomic.Uint64
	wg        sync.WaitGroup
	sem       chan struct{}
	mon       monitor

	// lastHolder is the last other holder of the lease seen; suspect is
	// the node of a holder whose lease expired (it did not release it:
	// presumably crashed), ineligible until it announces itself again.
	lastHolder   atomic.Value // string
	suspectMu    sync.Mutex
	suspect      string
	suspectSince time.Time
}

// NewHandler returns a handler deciding with the given shared state. cache
// and reg must be kept current by their Run methods.
func NewHandler(nc *nats.Conn, store *kvbinding.Store, cache *kvbinding.Cache, reg *kvbinding.Registry, cfg HandlerConfig) *Handler {
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 2 * time.Second
	}
	if cfg.NodeGrace <= 0 {
		cfg.NodeGrace = 15 * time.Second
	}
	if cfg.RebindAfter == 0 {
		cfg.RebindAfter = 30 * time.Second
	}
	if cfg.RecordTTL <= 0 {
		cfg.RecordTTL = 10 * time.Minute
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handler{
		nc: nc, store: store, cache: cache, reg: reg, cfg: cfg,
		log: log.With("component", "handler"),
		id:  cfg.Name + "/" + cfg.Node,
		sem: make(chan struct{}, 16),
	}
}

// Active reports whether this handler currently holds the lease and answers.
func (h *Handler) Active() bool { return h.active.Load() }

// Decisions returns how many proposals this handler has answered.
func (h *Handler) Decisions() uint64 { return h.decisions.Load() }

// Run competes for the lease and answers proposals while holding it, until
// ctx ends; then it stops answering and releases the lease so that a
// backup takes over at once.
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
	if err := h.reg.WatchLease(ctx, h.cfg.Name, notify); err != nil {
		return fmt.Errorf("proposals: watch lease: %w", err)
	}
	renew := h.cfg.LeaseTTL / 4
	if renew < 100*time.Millisecond {
		renew = 100 * time.Millisecond
	}
	ticker := time.NewTicker(renew)
	defer ticker.Stop()

	var (
		lease    kvbinding.Lease
		sub      *nats.Subscription
		adminSub *nats.Subscription
	)
	stop := func() {
		if sub != nil {
			_ = sub.Drain()
			sub = nil
		}
		if adminSub != nil {
			_ = adminSub.Drain()
			adminSub = nil
		}
		h.wg.Wait()
		h.active.Store(false)
		h.mon.reset()
	}
	defer func() {
		held := sub != nil
		stop()
		if held {
			h.release()
		}
	}()
	for {
		opCtx, cancel := context.WithTimeout(ctx, h.cfg.LeaseTTL/2)
		if sub == nil {
			l, err := h.reg.AcquireLease(opCtx, h.cfg.Name, h.id, h.cfg.LeaseTTL)
			if err == nil {
				lease = l
				h.suspectPrevious()
				s, serr := h.nc.QueueSubscribe(SubjectPropose, handlerQueue, h.onRequest)
				if serr != nil {
					cancel()
					return fmt.Errorf("proposals: subscribe: %w", serr)
				}
				as, serr := h.nc.QueueSubscribe(SubjectAdmin, handlerQueue, h.onAdmin)
				if serr != nil {
					_ = s.Unsubscribe()
					cancel()
					return fmt.Errorf("proposals: subscribe: %w", serr)
				}
				_ = h.nc.Flush()
				sub, adminSub = s, as
				h.active.Store(true)
				h.log.Info("handler active", "lease_rev", lease.Revision)
				Event{Kind: EventHandlerTakeover, By: h.id, Reason: "lease acquired"}.Publish(h.nc)
			} else if !errors.Is(err, kvbinding.ErrLeaseHeld) && ctx.Err() == nil {
				h.log.Warn("lease acquire failed", "err", err)
			}
		} else {
			l, err := h.reg.RenewLease(opCtx, h.cfg.Name, lease, h.cfg.LeaseTTL)
			switch {
			case err == nil:
				lease = l
			case errors.Is(err, kvbinding.ErrLeaseLost):
				h.log.Warn("lease lost: standing down")
				stop()
			default:
				// Transient (e.g. a leader election): keep answering; the
				// KV writes stay compare-and-set, so an overlap is safe.
				if ctx.Err() == nil {
					h.log.Warn("lease renew failed", "err", err)
				}
			}
		}
		cancel()
		if sub != nil {
			h.watchNodes(ctx)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
		case <-wake:
		}
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

func (h *Handler) onRequest(m *nats.Msg) {
	h.wg.Add(1)
	h.sem <- struct{}{}
	go func() {
		defer func() { <-h.sem; h.wg.Done() }()
		h.serve(m)
	}()
}

func (h *Handler) serve(m *nats.Msg) {
	reply := Reply{Handler: h.id}
	req, err := DecodeRequest(m.Data)
	if err != nil {
		reply.Error = err.Error()
		h.log.Warn("bad proposal request", "err", err)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		reply.Decisions = h.DecideAll(ctx, req)
		cancel()
	}
	data, err := EncodeReply(reply, req)
	if err != nil {
		return
	}
	if m.Reply != "" {
		_ = m.Respond(data)
	}
}

// DecideAll decides every proposal of req, writing accepted bindings before
// it returns. Independent groups are written concurrently.
func (h *Handler) DecideAll(ctx context.Context, req Request) []Decision {
	out := make([]Decision, len(req.Proposals))
	live := h.liveState()
	now := time.Now()
	// New groups (nearly all proposals) are written in one pipelined round
	// of KV creates; the rest one at a time per group.
	type planned struct {
		i  int
		st State
		v  Verdict
	}
	var others []planned
	creates := make([]int, 0, len(req.Proposals))
	bs := make([]kvbinding.Binding, 0, len(req.Proposals))
	verdicts := make([]Verdict, len(req.Proposals))
	for i, p := range req.Proposals {
		out[i] = Decision{Group: p.Group, Outcome: Failed}
		if err := p.Validate(); err != nil {
			out[i].Error = fmt.Sprintf("invalid proposal: %v", err)
			continue
		}
		st := State{Live: live}
		if r, ok := h.cache.Lookup(p.Group); ok {
			existing := r
			st.Existing = &existing
		}
		v := Decide(st, p, now)
		if v.Action == Create || v.Action == Replace {
			v.Binding.DecidedBy, v.Binding.ProposedBy = h.id, req.Proposer
			// Count the choice now so the rest of the batch spreads.
			if n, ok := live[v.Binding.Node]; ok && p.Group != "" {
				n.Groups++
				live[v.Binding.Node] = n
			}
		}
		if v.Action == Create {
			creates = append(creates, i)
			bs = append(bs, v.Binding)
			verdicts[i] = v
		} else {
			others = append(others, planned{i, st, v})
		}
	}
	if len(creates) > 0 {
		for k, res := range h.store.CreateMany(ctx, bs) {
			i := creates[k]
			out[i] = h.settle(req.Proposer, req.Proposals[i], verdicts[i], res.Binding, res.Err)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(64)
	for _, o := range others {
		g.Go(func() error {
			out[o.i] = h.carryOut(gctx, req.Proposer, req.Proposals[o.i], o.st, o.v)
			return nil
		})
	}
	_ = g.Wait()
	h.decisions.Add(uint64(len(req.Proposals)))
	return out
}

func (h *Handler) liveState() map[string]NodeState {
	live := h.reg.Live()
	counts := h.cache.Counts()
	now := time.Now()
	h.suspectMu.Lock()
	suspect, since := h.suspect, h.suspectSince
	h.suspectMu.Unlock()
	out := make(map[string]NodeState, len(live))
	for id, info := range live {
		seen := h.reg.Seen(id)
		if id == suspect && !seen.After(since) {
			continue
		}
		if info.Every > 0 && !seen.IsZero() && now.Sub(seen) > 2*info.Every {
			continue
		}
		out[id] = NodeState{HasConsumer: info.HasConsumer, Groups: counts[id]}
	}
	return out
}

// suspectPrevious marks the node of the previous lease holder as crashed
// when this handler took over an expired lease.
func (h *Handler) suspectPrevious() {
	prev, _ := h.lastHolder.Load().(string)
	if prev == "" || prev == h.id {
		return
	}
	node := prev
	if i := strings.LastIndexByte(prev, '/'); i >= 0 {
		node = prev[i+1:]
	}
	if node == h.cfg.Node {
		return
	}
	h.suspectMu.Lock()
	h.suspect, h.suspectSince = node, time.Now()
	h.suspectMu.Unlock()
	h.log.Warn("took over the lease of a handler that did not release it; its node is ineligible until it announces again", "node", node)
}

func (h *Handler) carryOut(ctx context.Context, proposer string, p Proposal, st State, v Verdict) Decision {
	d := Decision{Group: p.Group, Outcome: Failed}
	var (
		b   kvbinding.Binding
		err error
	)
	switch v.Action {
	case Fail:
		d.Error = v.Reason
		return d
	case Keep:
		// Return the full record as stored.
		b, err = h.store.Get(ctx, p.Group)
		if err != nil {
			d.Error = err.Error()
			return d
		}
		return h.rejected(d, proposer, p, b, v.Reason)
	case Create:
		b, err = h.store.Create(ctx, v.Binding)
	case Replace:
		b, err = h.store.Replace(ctx, v.Binding, st.Existing.Revision)
	}
	return h.settle(proposer, p, v, b, err)
}

// settle turns the outcome of a binding write into the decision to reply.
func (h *Handler) settle(proposer string, p Proposal, v Verdict, b kvbinding.Binding, err error) Decision {
	d := Decision{Group: p.Group, Outcome: Failed}
	switch {
	case err == nil:
	case errors.Is(err, kvbinding.ErrExists), errors.Is(err, kvbinding.ErrConflict):
		if b.Revision == 0 {
			d.Error = err.Error()
			return d
		}
		// Someone else decided first (another proposal, an overlapping
		// handler): their record stands.
		h.cache.Apply(b)
		return h.rejected(d, proposer, p, b, "decided concurrently")
	default:
		d.Error = err.Error()
		h.log.Warn("binding write failed", "group", p.Group, "err", err)
		return d
	}
	h.cache.Apply(b)
	d.Binding, d.Revision = &b, b.Revision
	d.Outcome = Accepted
	if v.Redirected {
		d.Outcome = Rejected
	}
	Event{Kind: EventBind, Group: p.Group, Node: b.Node, FromSeq: b.FromSeq, By: h.id, Reason: v.Reason}.Publish(h.nc)
	return d
}

func (h *Handler) rejected(d Decision, proposer string, p Proposal, b kvbinding.Binding, reason string) Decision {
	d.Outcome = Rejected
	d.Binding, d.Revision = &b, b.Revision
	Event{Kind: EventReject, Group: p.Group, Node: b.Node, By: h.id, Reason: reason + " (proposed " + p.Node + " by " + proposer + ")"}.Publish(h.nc)
	return d
}
