package router

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

const (
	maxBatch           = proposals.MaxProposalsPerRequest
	maxBatchesInFlight = 8
	// windowMax and windowMin bound the window of proposals in flight
	// (pace.go): wide open, as many as the requests in flight carry;
	// after timeouts, down to a sixteenth of a batch.
	windowMax = maxBatchesInFlight * maxBatch
	windowMin = maxBatch / 16
)

// asker sends the engine's asks (bindings, fences, releases, dead-letter
// records) to the handler in batches, at most maxBatchesInFlight requests
// at a time, and gives the engine the answers. It reaches the engine only
// through pull and step, and the rest of the node through the functions
// it is given.
type asker struct {
	wake <-chan struct{} // the engine has asks to send (actAsk)
	// pull takes the next asks to send (engine.askBatch, a pull).
	pull func(max int) []sentAsk
	step func(input)
	// markClean says clean on the fences whose group this node's queue
	// stores nothing of (handOver.markClean).
	markClean func(ctx context.Context, ps []proposals.Proposal)
	// propose sends one request to the active LOCAL handler.
	propose func(ctx context.Context, ps []proposals.Proposal) ([]proposals.Decision, error)
	log     *slog.Logger
}

// newAsker returns r's asker.
func (r *Router) newAsker() *asker {
	return &asker{
		wake: r.wake.ask,
		pull: func(max int) []sentAsk {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.eng.askBatch(max, time.Now())
		},
		step:      r.step,
		markClean: r.ho.markClean,
		propose:   r.dec.client.Propose,
		log:       r.log,
	}
}

// run sends asks until ctx ends, then waits for the requests in flight.
func (a *asker) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, maxBatchesInFlight)
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.wake:
		}
		for {
			batch := a.pull(maxBatch)
			if len(batch) == 0 {
				break
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				a.step(inAbandon{batch: batch})
				return
			}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				a.send(ctx, batch)
			}()
		}
	}
}

// send sends one batch and gives the engine the answers.
func (a *asker) send(ctx context.Context, batch []sentAsk) {
	ps := make([]proposals.Proposal, len(batch))
	for i, q := range batch {
		ps[i] = q.p
	}
	a.markClean(ctx, ps)
	ds, err := a.propose(ctx, ps)
	if err != nil && ctx.Err() != nil {
		a.step(inAbandon{batch: batch})
		return
	}
	if err != nil {
		a.log.Debug("asks failed; retried", "asks", len(batch), "err", err)
	}
	a.step(inReplied{batch: batch, ds: ds, err: err})
}

// cleanScanMax is the most messages this node's queue may store for a
// fence to look through them for its group's (markClean); past it, the
// group's next node drains the queue as before.
const cleanScanMax = 256

// errScanLimit: a queue stores more than a scan was allowed to read.
var errScanLimit = errors.New("the queue stores more messages than the scan reads")

// markClean says clean on the fences of ps whose group this node's queue
// and held subject store no message of, read as a drain reads them
// (scanQueues): then the handler hands the group over without pausing and
// draining this queue, and the next node goes straight to its catch-up —
// a move costs its two record writes, and the node's other groups do not
// stall behind a paused consumer. The engine asks for a fence only once
// the group has no publish in flight and no release of held messages
// under way, and routes none of it meanwhile: what the scan reads stays
// true. A publish of the group that lands later after all (held by the
// network past its timeout) is the "fenced while alive" window a drain
// has too (docs/protocol.md). On any error, or a queue storing more than
// cleanScanMax messages, no fence says clean.
func (h *handOver) markClean(ctx context.Context, ps []proposals.Proposal) {
	groups := map[string]bool{}
	for _, p := range ps {
		if p.Op == proposals.OpFence && p.Group != "" {
			groups[p.Group] = true
		}
	}
	if len(groups) == 0 {
		return
	}
	routes := make(map[string]kvbinding.Binding, len(groups))
	for g := range groups {
		routes[g], _ = h.lookup(g)
	}
	sctx, cancel := h.clock.WithTimeout(ctx, cleanScanWait)
	defer cancel()
	stream, err := h.io.side(sctx, QueueStream)
	var found map[string][]queued
	if err == nil {
		found, err = h.scanQueues(sctx, stream, map[string]map[string]bool{h.node: groups}, routes, cleanScanMax)
	}
	if err != nil {
		h.log.Debug("fences sent without looking at this node's queue: the next nodes drain it", "groups", len(groups), "err", err)
		return
	}
	clean := 0
	for i := range ps {
		if ps[i].Op == proposals.OpFence && groups[ps[i].Group] && len(found[ps[i].Group]) == 0 {
			ps[i].Clean = true
			clean++
		}
	}
	h.log.Debug("fences: this node's queue looked at", "fences", len(groups), "clean", clean)
}

// cleanScanWait bounds markClean's reads: a fence waits for them.
const cleanScanWait = 2 * time.Second
