package proposals

import (
	"context"
	"sync/atomic"
	"time"
)

// hardenRetry is how long the handler waits before trying again to harden
// the registry bucket after a failure (a leader election, or a handler
// user whose permissions predate the right to update the bucket).
const hardenRetry = time.Minute

// registryHardening is the active handler's upgrade of a registry bucket
// of an earlier release (expiry markers, roll-ups allowed) to one that
// denies roll-ups and purges (kvbinding.Registry.Harden). It waits until
// every live node announces a TTL with its liveness record: nodes of
// earlier releases see a node expire only by the marker the hardened
// bucket no longer leaves.
type registryHardening struct {
	running atomic.Bool
	done    atomic.Bool
	next    time.Time // guarded by running
	// waitingOn is the node of an earlier release last logged as what the
	// hardening waits for (the lease ticks' goroutine only).
	waitingOn string
}

// maybeHardenRegistry starts the hardening if it is due; it runs on the
// lease ticks of the active handler and does its I/O in t's goroutines.
func (h *Handler) maybeHardenRegistry(t *term) {
	hr := &h.harden
	if hr.done.Load() {
		return
	}
	live := h.reg.Live()
	if len(live) == 0 {
		return
	}
	for node, info := range live {
		if info.TTL <= 0 {
			if hr.waitingOn != node {
				hr.waitingOn = node
				h.log.Debug("registry bucket not hardened yet: waiting for a node of an earlier release to be upgraded", "node", node)
			}
			return
		}
	}
	hr.waitingOn = ""
	if !hr.running.CompareAndSwap(false, true) {
		return
	}
	t.goFn(func() {
		defer hr.running.Store(false)
		if time.Now().Before(hr.next) {
			return
		}
		ctx, cancel := context.WithTimeout(t.ctx, 5*time.Second)
		defer cancel()
		changed, err := h.reg.Harden(ctx)
		if err != nil {
			if t.ctx.Err() == nil {
				hr.next = time.Now().Add(hardenRetry)
				h.log.Warn("could not harden the registry bucket (deny roll-ups and purges); retrying in "+hardenRetry.String(), "err", err)
			}
			return
		}
		hr.done.Store(true)
		if changed {
			h.log.Info("registry bucket hardened: roll-ups and purges denied, records expire without markers", "live_nodes", len(live))
		}
	})
}
