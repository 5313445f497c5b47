package proposals

import (
	"context"
	"time"
)

// The pauser is the one goroutine that pauses and resumes queue consumers
// (it runs for as long as Handler.Run). Its calls reach the server in the
// order it decides them, and it decides a resume only after every pause
// asked of it before: a resume never lands after a pause it did not see,
// with no lock held across a JetStream call. A writer that pauses a queue
// counts itself in monitor.pausing first and waits for its pause to be
// done before it writes the record that drains the queue; the keeper reads
// pausing, then the cache's drains, and resumes only the queues neither
// names.

// pauseReq asks the pauser to pause node's queue consumer (keep false), or
// to renew and lift pauses as the records say (keep true).
type pauseReq struct {
	ctx  context.Context
	node string
	keep bool
	done chan error // nil: nobody waits
}

// runPauser serves pause requests until ctx ends.
func (h *Handler) runPauser(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-h.pauses:
			if r.keep {
				h.keepPausedNow(ctx)
				continue
			}
			rctx := r.ctx
			if rctx == nil {
				rctx = ctx
			}
			err := h.pauseNow(rctx, r.node)
			if r.done != nil {
				r.done <- err
			}
		}
	}
}

// pause has node's queue consumer paused for pauseWindow, unless this
// handler did so recently enough, and returns once it is (or ctx ended).
func (h *Handler) pause(ctx context.Context, node string) error {
	if h.cfg.Queues == nil {
		return nil
	}
	if !h.pauserRunning.Load() {
		// No Run: no keeper either, nothing to order against.
		return h.pauseNow(ctx, node)
	}
	done := make(chan error, 1)
	select {
	case h.pauses <- pauseReq{ctx: ctx, node: node, done: done}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// keepPaused asks the pauser to renew the pauses of queues being drained
// and lift the others, without waiting (when its queue of requests is
// full, the next tick asks again).
func (h *Handler) keepPaused() {
	if h.cfg.Queues == nil || !h.pauserRunning.Load() {
		return
	}
	select {
	case h.pauses <- pauseReq{keep: true}:
	default:
	}
}

// pauseNow is the pauser's pause: the call itself, with no lock held.
func (h *Handler) pauseNow(ctx context.Context, node string) error {
	m := &h.mon
	now := time.Now()
	m.mu.Lock()
	m.init()
	need := NeedsPause(m.paused, node, now, pauseWindow)
	m.mu.Unlock()
	if !need {
		return nil
	}
	if !h.auth.holds(now) {
		return errNoAuthority
	}
	until := now.Add(pauseWindow)
	if err := h.cfg.Queues.Pause(ctx, node, until); err != nil {
		return err
	}
	m.mu.Lock()
	m.init()
	m.paused[node] = until
	m.mu.Unlock()
	h.log.Debug("queue consumer paused for a drain", "node", node, "until", until)
	return nil
}

// keepPausedNow is the pauser's keeper: it renews the pause of every queue
// a record says is being drained or caught up from (PlanPauses), and
// resumes the queues it paused that no record and no write in flight
// needs paused any more.
func (h *Handler) keepPausedNow(ctx context.Context) {
	m := &h.mon
	m.mu.Lock()
	m.init()
	in := PauseInput{Now: time.Now(), Paused: clone(m.paused), Pausing: clone(m.pausing), Window: pauseWindow}
	m.mu.Unlock()
	// Read after the writes in flight were counted: a write that paused a
	// queue and is done has its record in the cache by now.
	in.Draining, in.CatchingUp = h.cache.Draining(), h.cache.CatchingUp()
	m.mu.Lock()
	m.init()
	TrackCatchUps(m.catchUps, in.CatchingUp, in.Draining, in.Now)
	in.CatchUpSince = clone(m.catchUps)
	m.mu.Unlock()
	renew, resume := PlanPauses(in)
	for _, node := range renew {
		if err := h.pauseNow(ctx, node); err != nil && ctx.Err() == nil {
			h.log.Warn("cannot renew the pause of a queue being drained", "node", node, "err", err)
		}
	}
	for _, node := range resume {
		if !h.auth.holds(time.Now()) {
			// A resume from a handler past its lease could lift a pause the
			// next handler's drain counts on; the pause lapses by itself.
			return
		}
		if err := h.cfg.Queues.Resume(ctx, node); err != nil && ctx.Err() == nil {
			h.log.Warn("cannot resume a drained queue; its pause lapses by itself", "node", node, "err", err)
			continue
		}
		m.mu.Lock()
		delete(m.paused, node)
		m.mu.Unlock()
		h.log.Debug("queue consumer resumed: no drain of it left", "node", node)
	}
}

// pausingFor counts a record write in flight that pauses nodes' queues
// (delta 1 before the pause, -1 once the record is in the cache).
func (h *Handler) pausingFor(nodes []string, delta int) {
	if len(nodes) == 0 {
		return
	}
	m := &h.mon
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	for _, n := range nodes {
		m.pausing[n] += delta
		if m.pausing[n] <= 0 {
			delete(m.pausing, n)
		}
	}
}

func clone[V any](m map[string]V) map[string]V {
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
