package proposals

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// serve answers one proposal request; it reports whether the whole request
// was answered with an error.
func (h *Handler) serve(ctx context.Context, r micro.Request) bool {
	reply := Reply{Handler: h.id}
	req, err := DecodeRequest(r.Data())
	if err == nil {
		if node, ok := ProposerOf(r.Subject()); !ok || node != req.Proposer {
			err = fmt.Errorf("%w: proposer %q may not propose on %s", ErrBadMessage, req.Proposer, r.Subject())
		}
	}
	if err != nil {
		reply.Error = err.Error()
		h.log.Warn("bad proposal request", "subject", r.Subject(), "err", err)
		data, _ := EncodeReply(reply, Request{})
		_ = h.respond(r, data)
		return true
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	reply.Decisions = h.DecideAll(dctx, req)
	cancel()
	data, err := EncodeReply(reply, req)
	if err != nil {
		return true
	}
	_ = h.respond(r, data)
	return false
}

// planned is one proposal's decision before its record is written.
type planned struct {
	i   int
	cur *kvbinding.Binding
	res Result
	// cause is set when the record starts moving the group (metrics).
	cause string
	// reserved: its record binds a new group, counted in Handler.limit
	// until the record is in the cache or not written (settle, writeAll).
	reserved bool
}

// unreserve ends pl's reservation in the group limit, if it has one.
func (h *Handler) unreserve(pl planned, group string) {
	if pl.reserved {
		h.limit.release(h.cache, group)
	}
}

// DecideAll decides every proposal of req, writing the records before it
// returns, in one pipelined round of compare-and-set writes.
func (h *Handler) DecideAll(ctx context.Context, req Request) []Decision {
	out := make([]Decision, len(req.Proposals))
	groups := make([]string, len(req.Proposals))
	for i, p := range req.Proposals {
		groups[i] = p.Group
	}
	defer h.locks.lock(groups)()
	env := Env{Now: time.Now(), Handler: h.id, Live: h.liveState(), Floor: h.floor.Load(),
		MaxGroups: max(h.cfg.MaxGroups, 0)}
	plans := make([]planned, 0, len(req.Proposals))
	ps := make([]Proposal, 0, len(req.Proposals))
	for i, p := range req.Proposals {
		out[i] = Decision{Group: p.Group, Outcome: Failed}
		if err := p.Validate(); err != nil {
			out[i].Error = fmt.Sprintf("invalid proposal: %v", err)
			continue
		}
		in := p.Input(req.Proposer)
		if in.Op == OpDeadLetter {
			env.IngressLast = h.ingressLastFor(ctx, in.Seq)
		}
		var cur *kvbinding.Binding
		if r, ok := h.cache.Lookup(p.Group); ok {
			cur = &r
		}
		var res Result
		reserved := false // a new bound group, counted in h.limit until its record is in the cache
		if in.Op == OpBind && env.MaxGroups > 0 {
			// Counted and decided under one lock: concurrent batches
			// never bind past the limit together.
			h.limit.decide(h.cache, p.Group, func(bound int) bool {
				env.Bound = bound
				res = Transition(p.Group, cur, in, env)
				reserved = res.Write != nil && res.Write.State == kvbinding.StateBound && p.Group != "" && !countedBound(cur)
				return reserved
			})
		} else {
			res = Transition(p.Group, cur, in, env)
		}
		if res.Write != nil && res.Write.State == kvbinding.StateBound && p.Group != "" {
			// Count the choice now so the rest of the batch spreads.
			if n, ok := env.Live[res.Write.Node]; ok {
				n.Groups++
				env.Live[res.Write.Node] = n
			}
		}
		plans = append(plans, planned{i: i, cur: cur, res: res, reserved: reserved})
		ps = append(ps, p)
	}
	for k, d := range h.writeAll(ctx, plans, ps, nil) {
		out[plans[k].i] = d
	}
	h.decisions.Add(uint64(len(req.Proposals)))
	for i, p := range req.Proposals {
		h.metrics.decided(p.op(), out[i].Outcome)
	}
	return out
}

// writeAll carries out planned decisions: the queues to pause first, then
// every record write in one pipelined round. ps[k] is plans[k]'s proposal.
// guard, if not nil, is asked after the pauses and just before the
// writes: an error fails every write (nothing is written).
func (h *Handler) writeAll(ctx context.Context, plans []planned, ps []Proposal, guard func(context.Context) error) []Decision {
	out := make([]Decision, len(plans))
	paused := map[string]error{}
	// Presized: a Write holds a whole binding, and growing the slice
	// copied each one again and again (the largest allocation of a
	// decision, measured with BenchmarkDecisionService).
	writes := make([]kvbinding.Write, 0, len(plans))
	at := make([]int, 0, len(plans))
	var pausing []string
	// The pause keeper must not lift a pause this batch takes before its
	// records are in the cache.
	for _, pl := range plans {
		if pl.res.Write != nil {
			pausing = append(pausing, pl.res.Pause...)
		}
	}
	// A record written without the drain or the catch-up its previous
	// revision had (a catch-up reported done, an evacuation, a release)
	// may leave a paused queue with nothing that keeps it paused: the
	// keeper lifts that pause now, not at its next tick (every paused
	// moment stalls all the node's groups).
	// Deferred first, so that it runs after this batch's pausing count
	// is dropped.
	lifted := false
	defer func() {
		if lifted {
			h.keepPaused()
		}
	}()
	h.pausingFor(pausing, 1)
	defer h.pausingFor(pausing, -1)
	var blocked error // no record is written
	if !h.auth.holds(time.Now()) {
		blocked = errNoAuthority
	} else if slices.ContainsFunc(plans, func(pl planned) bool { return pl.res.Write != nil }) {
		blocked = h.pastRewind(ctx) // rewind.go
	}
	for k, pl := range plans {
		res := pl.res
		if res.Write == nil {
			out[k] = h.unwritten(pl, ps[k])
			continue
		}
		if blocked != nil {
			h.unreserve(pl, ps[k].Group)
			out[k] = Decision{Group: ps[k].Group, Outcome: Failed, Error: blocked.Error()}
			continue
		}
		var pauseErr error
		for _, node := range res.Pause {
			err, done := paused[node]
			if !done {
				err = h.pause(ctx, node)
				paused[node] = err
			}
			if err != nil {
				pauseErr = fmt.Errorf("cannot pause the queue of %s: %w", node, err)
			}
		}
		if pauseErr != nil {
			h.unreserve(pl, ps[k].Group)
			out[k] = Decision{Group: ps[k].Group, Outcome: Failed, Error: pauseErr.Error()}
			continue
		}
		w := kvbinding.Write{Binding: *res.Write}
		if pl.cur != nil {
			w.Rev = pl.cur.Revision
		}
		if res.Ended {
			w.TTL = h.cfg.RecordTTL
		}
		writes = append(writes, w)
		at = append(at, k)
	}
	if len(writes) > 0 && guard != nil {
		if err := guard(ctx); err != nil {
			for _, k := range at {
				h.unreserve(plans[k], ps[k].Group)
				out[k] = Decision{Group: ps[k].Group, Outcome: Failed, Error: err.Error()}
			}
			return out
		}
	}
	if len(writes) > 0 {
		// A new bound group's record goes into the cache as soon as it
		// is stored, and its limit reservation ends there (the limit
		// counts it once meanwhile, whatever the watch and the rest of the
		// batch do). A write not stored by its first attempt ends its
		// reservation once settled, whatever the outcome.
		released := make([]bool, len(writes))
		stored := func(j int, b kvbinding.Binding) {
			k := at[j]
			if plans[k].reserved {
				h.cache.Apply(b)
				h.unreserve(plans[k], ps[k].Group)
				released[j] = true
			}
		}
		for j, r := range h.store.WriteManyThen(ctx, writes, stored) {
			k := at[j]
			out[k] = h.settle(plans[k], ps[k], r.Binding, r.Err)
			if out[k].Outcome == Accepted && EndsPause(plans[k].cur, r.Binding) {
				lifted = true
			}
			if !released[j] {
				h.unreserve(plans[k], ps[k].Group)
			}
		}
	}
	return out
}

// countedBound reports whether Cache.Bound counts the group of record cur
// (nil: no record).
func countedBound(cur *kvbinding.Binding) bool {
	return cur != nil && !cur.Invalid && (cur.State == kvbinding.StateBound || cur.State == kvbinding.StateMoving)
}

// unwritten answers a decision that writes nothing.
func (h *Handler) unwritten(pl planned, p Proposal) Decision {
	res := pl.res
	d := Decision{Group: p.Group, Outcome: res.Outcome}
	if pl.cur != nil {
		d.Revision = pl.cur.Revision
	}
	switch res.Outcome {
	case Rejected:
		if d.Revision == 0 {
			d.Outcome, d.Error = Failed, res.Reason
		}
		if p.op() == OpBind {
			h.publish(Event{Kind: EventReject, Group: p.Group, Node: routeNode(pl.cur), By: h.id,
				Reason: res.Reason + " (proposed " + p.Node + ")"})
		}
	case Refused, Failed:
		d.Error, d.Floor, d.Limit = res.Reason, res.Floor, res.Limit
		if res.Limit > 0 {
			h.refusedAtLimit(p.Group, res)
		}
		if res.Outcome == Refused {
			h.log.Debug("refused", "group", logagg.Short(p.Group), "op", p.op(), "reason", res.Reason)
		}
	}
	return d
}

func routeNode(r *kvbinding.Binding) string {
	if r == nil {
		return ""
	}
	if r.State == kvbinding.StateMoving {
		return r.PrevNode
	}
	return r.Node
}

// settle turns the outcome of a record write into the decision to reply.
func (h *Handler) settle(pl planned, p Proposal, b kvbinding.Binding, err error) Decision {
	d := Decision{Group: p.Group, Outcome: Failed}
	switch {
	case err == nil:
	case errors.Is(err, kvbinding.ErrExists), errors.Is(err, kvbinding.ErrConflict):
		if b.Revision == 0 {
			d.Error = err.Error()
			return d
		}
		// Someone else wrote first (another proposal, an overlapping
		// handler): their record stands; the asker looks at it.
		h.cache.Apply(b)
		d.Outcome, d.Revision = Rejected, b.Revision
		return d
	default:
		d.Error = err.Error()
		h.log.Warn("record write failed", "group", logagg.Short(p.Group), "op", p.op(), "err", err)
		return d
	}
	h.cache.Apply(b)
	d.Outcome, d.Revision = Accepted, b.Revision
	h.metrics.written(p.Group, pl.cause, b, time.Now())
	if h.log.Enabled(context.Background(), slog.LevelDebug) {
		// Guarded: the arguments alone cost a dozen allocations per
		// decision when debug logging is off.
		h.log.Debug("record written", "group", logagg.Short(p.Group), "op", p.op(), "by", pl.res.Write.ProposedBy, "state", b.State,
			"step", b.Step, "node", b.Node, "prev_node", b.PrevNode, "from_seq", b.FromSeq, "through_seq", b.ThroughSeq, "revision", b.Revision)
	}
	if ev := pl.res.Event; ev != nil {
		h.publish(*ev)
	}
	return d
}

// apply decides and writes one input the handler or an operator asks for
// (move, unbind, evacuate), on the group's cached record; cause says why
// the group moves.
func (h *Handler) apply(ctx context.Context, group string, in Input, live map[string]NodeState, cause string) (Result, kvbinding.Binding, error) {
	defer h.locks.lock([]string{group})()
	var cur *kvbinding.Binding
	if r, ok := h.cache.Lookup(group); ok {
		cur = &r
	}
	res := Transition(group, cur, in, Env{Now: time.Now(), Handler: h.id, Live: live})
	if res.Write == nil {
		h.metrics.decided(in.Op, res.Outcome)
		return res, kvbinding.Binding{}, nil
	}
	d := h.writeAll(ctx, []planned{{cur: cur, res: res, cause: cause}}, []Proposal{{Op: in.Op, Group: group}}, nil)[0]
	h.metrics.decided(in.Op, d.Outcome)
	if d.Outcome != Accepted {
		return res, kvbinding.Binding{}, fmt.Errorf("%w: %s", ErrHandlerFailed, d.Error)
	}
	b := *res.Write
	b.Revision = d.Revision
	return res, b, nil
}
