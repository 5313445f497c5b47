package proposals

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// A bindings bucket that went back (its servers lost acknowledged writes,
// sequences included) gives its next records revisions it gave before.
// A record's revision is its group's epoch when it changes the group's
// owner, and consumers drop a copy of an older epoch than their group
// showed (package consumer's fencing): a group bound again at a revision
// below the one it had before would have its messages dropped, acked, by
// the consumer that saw the old epoch (TestBindingsRewoundUnderARunningNode,
// 1 of 20 runs). So before it writes again, the handler moves the bucket
// past every revision its cache had read (kvbinding.Store.Advance).

// errAdvancing fails a decision while another one moves the bucket's
// revisions past a rewind.
var errAdvancing = errors.New("proposals: the bindings bucket went back; its revisions are being moved past those read before; ask again")

// pastRewind returns nil once the bindings bucket's revisions are past
// every one the cache had read before the bucket went back (at once when
// it never did). One caller at a time writes (the others get
// errAdvancing, and ask again): advancing holds no other lock, and no
// caller waits for it.
func (h *Handler) pastRewind(ctx context.Context) error {
	through := h.cache.RewoundThrough()
	if through == 0 || h.advanced.Load() >= through {
		return nil
	}
	if !h.advancing.TryLock() {
		return errAdvancing
	}
	defer h.advancing.Unlock()
	if h.advanced.Load() >= through {
		return nil
	}
	start := time.Now()
	h.log.Warn("the bindings bucket went back: moving its revisions past those read before it did, before writing records again",
		"through", through)
	last, err := h.store.Advance(ctx, through)
	if err != nil {
		return fmt.Errorf("proposals: the bindings bucket went back; its revisions are not past %d yet (at %d): %w", through, last, err)
	}
	h.advanced.Store(last)
	h.log.Info("bindings bucket revisions moved past those read before it went back", "through", through, "last", last,
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}
