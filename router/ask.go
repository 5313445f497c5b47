package router

import (
	"context"
	"sync"
	"time"

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
// at a time, and gives the engine the answers. It waits for the requests
// in flight before it returns.
func (r *Router) asker(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, maxBatchesInFlight)
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake.ask:
		}
		for {
			var batch []*ask
			r.mu.Lock()
			batch = r.eng.askBatch(maxBatch, time.Now())
			r.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				r.mu.Lock()
				r.eng.abandon(batch)
				r.mu.Unlock()
				return
			}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				r.sendAsks(ctx, batch)
			}()
		}
	}
}

// sendAsks sends one batch and gives the engine the answers.
func (r *Router) sendAsks(ctx context.Context, batch []*ask) {
	ps := make([]proposals.Proposal, len(batch))
	for i, a := range batch {
		ps[i] = a.p
	}
	ds, err := r.dec.client.Propose(ctx, ps)
	if err != nil && ctx.Err() != nil {
		r.mu.Lock()
		r.eng.abandon(batch)
		r.mu.Unlock()
		return
	}
	if err != nil {
		r.log.Debug("asks failed; retried", "asks", len(batch), "err", err)
	}
	r.do(func(e *engine, now time.Time) { e.replied(batch, ds, err, now) })
}
