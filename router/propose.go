package router

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"grouprouter/kvbinding"
	"grouprouter/proposals"
)

// propState is a lane's pending proposal.
type propState struct {
	attempt  int
	due      time.Time
	inFlight bool
	node     string // node proposed while in flight
	index    int    // in retryHeap, -1 when not there
	lane     *lane
}

// retryHeap orders proposals waiting for their next attempt by due time.
type retryHeap []*propState

func (h retryHeap) Len() int           { return len(h) }
func (h retryHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h retryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *retryHeap) Push(x any) { p := x.(*propState); p.index = len(*h); *h = append(*h, p) }
func (h *retryHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	p.index = -1
	return p
}

const (
	maxBatch           = proposals.MaxProposalsPerRequest
	maxBatchesInFlight = 8
	backoffBase        = 100 * time.Millisecond
	backoffMax         = 5 * time.Second
)

func backoff(attempt int) time.Duration {
	d := backoffBase << min(attempt-1, 10)
	if d > backoffMax || d <= 0 {
		d = backoffMax
	}
	return d/2 + rand.N(d/2+1)
}

// needProposal schedules a proposal for a waiting lane: at once if this
// node is the group's proposer, else after the timeout as a fallback in
// case the proposer is gone. r.mu is held.
func (r *Router) needProposal(ln *lane) {
	if ln.prop != nil || ln.deadLettering {
		return
	}
	p := &propState{lane: ln, index: -1}
	ln.prop = p
	if r.isProposer(ln.group) {
		r.propQ = append(r.propQ, p.lane)
		r.wakeProposer()
		return
	}
	p.due = time.Now().Add(r.cfg.Timeout)
	heap.Push(&r.retryQ, p)
	r.wakeProposer()
}

// dropProposal forgets a lane's pending proposal once it is decided. A
// proposal in flight is left to its reply, which then finds the lane decided.
// r.mu is held.
func (r *Router) dropProposal(ln *lane) {
	p := ln.prop
	if p == nil {
		return
	}
	if p.index >= 0 {
		heap.Remove(&r.retryQ, p.index)
	}
	ln.prop = nil
}

func (r *Router) wakeProposer() {
	select {
	case r.propWake <- struct{}{}:
	default:
	}
}

// proposer sends due proposals in batches, at most maxBatchesInFlight at a time.
func (r *Router) proposer(ctx context.Context) {
	sem := make(chan struct{}, maxBatchesInFlight)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			// Wait for batches in flight.
			for i := 0; i < cap(sem); i++ {
				sem <- struct{}{}
			}
			return
		case <-r.propWake:
		case <-timer.C:
		}
		for {
			batch, next := r.takeBatch()
			if len(batch) == 0 {
				if !next.IsZero() {
					timer.Reset(time.Until(next))
				}
				break
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				r.abandon(batch)
				continue
			}
			go func() {
				defer func() { <-sem }()
				r.sendBatch(ctx, batch)
			}()
		}
	}
}

type sent struct {
	p    *propState
	prop proposals.Proposal
}

// takeBatch collects up to maxBatch due proposals and marks them in flight.
// It returns when the next retry is due when there is nothing to send now.
func (r *Router) takeBatch() ([]sent, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for r.retryQ.Len() > 0 && !r.retryQ[0].due.After(now) {
		p := heap.Pop(&r.retryQ).(*propState)
		r.propQ = append(r.propQ, p.lane)
	}
	var batch []sent
	for len(r.propQ) > 0 && len(batch) < maxBatch {
		ln := r.propQ[0]
		r.propQ[0] = nil
		r.propQ = r.propQ[1:]
		p := ln.prop
		if p == nil || p.inFlight || !ln.waiting || ln.deadLettering || r.lanes[ln.group] != ln || len(ln.msgs) == 0 {
			continue
		}
		p.inFlight = true
		p.node = r.chooseNode(ln.group)
		r.assigned[p.node]++
		batch = append(batch, sent{p: p, prop: proposals.Proposal{Group: ln.group, Node: p.node, FromSeq: ln.msgs[0].seq}})
	}
	var next time.Time
	if len(batch) == 0 && r.retryQ.Len() > 0 {
		next = r.retryQ[0].due
	}
	return batch, next
}

// chooseNode picks the node to propose for a new group, as the seeds'
// normal cluster routing does: only nodes whose queue has a consumer (all
// live nodes if none has one); this node first with LocalFirst; else the
// fewest bound groups, counting proposals in flight, ties round-robin.
// r.mu is held.
func (r *Router) chooseNode(group string) string {
	eligible := proposals.Eligible(r.liveState, group == "")
	if len(eligible) == 0 {
		return r.cfg.Node
	}
	if r.cfg.LocalFirst {
		for _, n := range eligible {
			if n == r.cfg.Node {
				return n
			}
		}
	}
	counts := r.cache.Counts()
	r.rr++
	best, bestLoad := "", 0
	for i := range eligible {
		n := eligible[(r.rr+i)%len(eligible)]
		load := counts[n] + r.assigned[n]
		if best == "" || load < bestLoad {
			best, bestLoad = n, load
		}
	}
	return best
}

func (r *Router) abandon(batch []sent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range batch {
		s.p.inFlight = false
		r.assigned[s.p.node]--
	}
}

// sendBatch sends one batch and applies the decisions.
func (r *Router) sendBatch(ctx context.Context, batch []sent) {
	ps := make([]proposals.Proposal, len(batch))
	for i, s := range batch {
		ps[i] = s.prop
	}
	r.proposed.Add(uint64(len(ps)))
	decisions, err := r.client.Propose(ctx, ps)
	if err != nil {
		if ctx.Err() != nil {
			r.abandon(batch)
			return
		}
		r.log.Warn("proposal failed; groups wait and are retried", "groups", len(batch), "err", err)
		r.mu.Lock()
		for _, s := range batch {
			r.assigned[s.p.node]--
			r.failed(s.p, err)
		}
		r.mu.Unlock()
		return
	}
	// Apply bindings first (outside r.mu: the cache calls back into the router).
	for _, d := range decisions {
		if d.Binding != nil {
			r.cache.Apply(*d.Binding)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, s := range batch {
		r.assigned[s.p.node]--
		d := decisions[i]
		if d.Outcome == proposals.Failed {
			r.failed(s.p, fmt.Errorf("%w: %s", proposals.ErrHandlerFailed, d.Error))
			continue
		}
		s.p.inFlight = false
		ln := s.p.lane
		if ln.prop == s.p && ln.waiting {
			// Decided, yet this lane's head is still undecided (the
			// record came back older than our cache): try again later.
			r.failed(s.p, errors.New("decision did not cover the group's first waiting message"))
		}
	}
}

// failed records a failed attempt: announce it, and retry after a backoff,
// or dead-letter the group's held messages after MaxAttempts. r.mu is held.
func (r *Router) failed(p *propState, err error) {
	p.inFlight = false
	ln := p.lane
	if ln.prop != p || !ln.waiting || r.lanes[ln.group] != ln {
		return // decided meanwhile
	}
	p.attempt++
	r.decErrs.Add(1)
	kind := proposals.EventTimeout
	proposals.Event{Kind: kind, Group: ln.group, Node: r.cfg.Node, Attempt: p.attempt, Reason: err.Error(),
		By: r.cfg.Node, Count: len(ln.msgs)}.Publish(r.nc)
	if r.cfg.MaxAttempts > 0 && p.attempt >= r.cfg.MaxAttempts && r.isProposer(ln.group) {
		r.startDeadLetter(ln, fmt.Sprintf("no routing decision after %d attempts: %v", p.attempt, err))
		return
	}
	p.due = time.Now().Add(backoff(p.attempt))
	heap.Push(&r.retryQ, p)
	r.wakeProposer()
}

// startDeadLetter moves a waiting group's held messages to the dead-letter
// stream, then records that in the bindings bucket so that every node drops
// them; later messages of the group get a new proposal. The messages are
// written before the record: a crash in between leaves a duplicate in the
// dead-letter stream, never a loss. r.mu is held.
func (r *Router) startDeadLetter(ln *lane, reason string) {
	ln.deadLettering = true
	r.dropProposal(ln)
	msgs := append([]*msgRec(nil), ln.msgs...)
	for _, m := range msgs {
		r.outMsg(m)
	}
	through := msgs[len(msgs)-1].seq
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, m := range msgs {
			out := &nats.Msg{Subject: DeadLetterSubjectPrefix + m.subject, Header: nats.Header{}, Data: m.out.Data}
			for k, v := range m.out.Header {
				out.Header[k] = v
			}
			out.Header.Set(HeaderDeadReason, reason)
			out.Header.Set(jetstream.ExpectedStreamHeader, DeadLetterStream)
			out.Header.Set(jetstream.MsgIDHeader, "dlq:"+IngressStream+":"+strconv.FormatUint(m.seq, 10))
			for {
				if _, err := r.js.PublishMsg(ctx, out); err == nil {
					break
				} else if ctx.Err() != nil {
					r.abortDeadLetter(ln, err)
					return
				}
				time.Sleep(backoffBase)
			}
		}
		tomb := kvbinding.Binding{Group: ln.group, State: kvbinding.StateDeadLettered, ThroughSeq: through,
			DecidedAt: time.Now().UTC(), DecidedBy: r.cfg.Node, Reason: reason}
		var rev uint64
		if cur, ok := r.cache.Lookup(ln.group); ok && cur.State == kvbinding.StateDeadLettered {
			rev = cur.Revision
		}
		b, err := r.store.ReplaceTTL(ctx, tomb, rev, r.cfg.RecordTTL)
		if err != nil && b.Revision == 0 {
			r.abortDeadLetter(ln, err)
			return
		}
		tomb = b
		r.cache.Apply(tomb)
		r.deadLetters.Add(uint64(len(msgs)))
		proposals.Event{Kind: proposals.EventDeadLetter, Group: ln.group, By: r.cfg.Node, Reason: reason,
			Count: len(msgs), FromSeq: msgs[0].seq}.Publish(r.nc)
		r.log.Warn("group dead-lettered", "group", ln.group, "messages", len(msgs), "through_seq", through, "reason", reason)
		r.mu.Lock()
		ln.deadLettering = false
		r.pump(ln)
		r.mu.Unlock()
	}()
}

func (r *Router) abortDeadLetter(ln *lane, err error) {
	r.log.Error("dead-lettering failed; the group keeps waiting", "group", ln.group, "err", err)
	r.mu.Lock()
	defer r.mu.Unlock()
	ln.deadLettering = false
	r.pump(ln)
}
