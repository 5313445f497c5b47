package proposals

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/micro"
	"golang.org/x/sync/errgroup"

	"grouprouter/kvbinding"
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
	cur *kvbinding.Route
	res Result
	// cause is set when the record starts moving the group (metrics).
	cause string
}

// DecideAll decides every proposal of req, writing the records before it
// returns. New groups (nearly all binds) are written in one pipelined round
// of KV creates; the rest concurrently, one compare-and-set each.
func (h *Handler) DecideAll(ctx context.Context, req Request) []Decision {
	out := make([]Decision, len(req.Proposals))
	env := Env{Now: time.Now(), Handler: h.id, Live: h.liveState()}
	var creates, others []planned
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
		var cur *kvbinding.Route
		if r, ok := h.cache.Lookup(p.Group); ok {
			cur = &r
		}
		res := Transition(p.Group, cur, in, env)
		if res.Write != nil && res.Write.State == kvbinding.StateBound && p.Group != "" {
			// Count the choice now so the rest of the batch spreads.
			if n, ok := env.Live[res.Write.Node]; ok {
				n.Groups++
				env.Live[res.Write.Node] = n
			}
		}
		pl := planned{i: i, cur: cur, res: res}
		if res.Write != nil && res.Create && !res.Ended && len(res.Pause) == 0 {
			creates = append(creates, pl)
		} else {
			others = append(others, pl)
		}
	}
	if len(creates) > 0 {
		bs := make([]kvbinding.Binding, len(creates))
		for k, pl := range creates {
			bs[k] = *pl.res.Write
		}
		for k, res := range h.store.CreateMany(ctx, bs) {
			pl := creates[k]
			out[pl.i] = h.settle(pl, req.Proposals[pl.i], res.Binding, res.Err)
		}
	}
	if len(others) > 0 {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(64)
		for _, pl := range others {
			g.Go(func() error {
				out[pl.i] = h.carryOut(gctx, pl, req.Proposals[pl.i])
				return nil
			})
		}
		_ = g.Wait()
	}
	h.decisions.Add(uint64(len(req.Proposals)))
	for i, p := range req.Proposals {
		h.metrics.decided(p.op(), out[i].Outcome)
	}
	return out
}

// carryOut writes one planned decision.
func (h *Handler) carryOut(ctx context.Context, pl planned, p Proposal) Decision {
	res := pl.res
	if res.Write == nil {
		return h.unwritten(pl, p)
	}
	for _, node := range res.Pause {
		if err := h.pause(ctx, node); err != nil {
			return Decision{Group: p.Group, Outcome: Failed, Error: "cannot pause the queue of " + node + ": " + err.Error()}
		}
	}
	var rev uint64
	if pl.cur != nil {
		rev = pl.cur.Revision
	}
	var (
		b   kvbinding.Binding
		err error
	)
	switch {
	case res.Ended:
		b, err = h.store.ReplaceTTL(ctx, *res.Write, rev, h.cfg.RecordTTL)
	case res.Create:
		b, err = h.store.Create(ctx, *res.Write)
	default:
		b, err = h.store.Replace(ctx, *res.Write, rev)
	}
	return h.settle(pl, p, b, err)
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
		d.Error = res.Reason
		if res.Outcome == Refused {
			h.log.Debug("refused", "group", p.Group, "op", p.op(), "reason", res.Reason)
		}
	}
	return d
}

func routeNode(r *kvbinding.Route) string {
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
		h.log.Warn("record write failed", "group", p.Group, "op", p.op(), "err", err)
		return d
	}
	h.cache.Apply(b)
	d.Outcome, d.Revision = Accepted, b.Revision
	h.metrics.written(p.Group, pl.cause, b, time.Now())
	h.log.Debug("record written", "group", p.Group, "op", p.op(), "by", pl.res.Write.ProposedBy, "state", b.State,
		"step", b.Step, "node", b.Node, "prev_node", b.PrevNode, "from_seq", b.FromSeq, "through_seq", b.ThroughSeq, "revision", b.Revision)
	if ev := pl.res.Event; ev != nil {
		h.publish(*ev)
	}
	return d
}

// apply decides and writes one input the handler or an operator asks for
// (move, unbind, evacuate), on the group's cached record; cause says why
// the group moves.
func (h *Handler) apply(ctx context.Context, group string, in Input, live map[string]NodeState, cause string) (Result, kvbinding.Binding, error) {
	var cur *kvbinding.Route
	if r, ok := h.cache.Lookup(group); ok {
		cur = &r
	}
	res := Transition(group, cur, in, Env{Now: time.Now(), Handler: h.id, Live: live})
	if res.Write == nil {
		h.metrics.decided(in.Op, res.Outcome)
		return res, kvbinding.Binding{}, nil
	}
	d := h.carryOut(ctx, planned{cur: cur, res: res, cause: cause}, Proposal{Op: in.Op, Group: group})
	h.metrics.decided(in.Op, d.Outcome)
	if d.Outcome != Accepted {
		return res, kvbinding.Binding{}, fmt.Errorf("%w: %s", ErrHandlerFailed, d.Error)
	}
	b := *res.Write
	b.Revision = d.Revision
	return res, b, nil
}
