package proposals

import (
	"errors"
	"sync/atomic"
	"time"
)

// The handler's authority ends by its own clock (docs/protocol.md, "Who
// may decide, and until when").
//
// The lease is a KV record with a TTL: the servers delete it LeaseTTL
// after they stored its last renewal, and a standby's create then takes
// it. A handler cut off from the servers' quorum cannot learn that: its
// renewals just fail. So it counts on its own monotonic clock from the
// moment it *sent* the last renewal (or acquisition) that succeeded: that
// renewal was stored after it was sent, so the record lives at least
// LeaseTTL from then. It decides nothing once LeaseTTL minus a margin has
// passed since, and stands down; a standby's create can succeed only once
// the servers expired the record, at least LeaseTTL after the send. The
// margin absorbs a difference in clock rate between this process and the
// servers (a quarter of the TTL: 25%, far more than any clock drifts) and
// the time between a worker's check and its write leaving the process.
//
// Standbys take over earlier in one case only: when the active handler's
// ping subject has no responders at all (activeGone), i.e. no server on
// the standby's side holds the active process's subscription any more:
// its connection or its servers' route closed, so nothing it sends can
// reach the servers late through that path. A handler cut off by a link
// or route that holds traffic keeps its interest, and its pings time out
// instead: the standby then waits for the TTL.

// authorityMargin is what the handler keeps of its lease's TTL for
// clock-rate differences and scheduling: it stops deciding at
// LeaseTTL-authorityMargin after its last successful renewal was sent.
func authorityMargin(ttl time.Duration) time.Duration {
	return max(ttl/4, 100*time.Millisecond)
}

// AuthorityEnd is when a handler whose lease acquisition or renewal sent
// at sent succeeded stops deciding, by its own clock: LeaseTTL minus the
// margin after the send. The handler and the simulation's model of it
// (package router) both run this rule.
func AuthorityEnd(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - authorityMargin(ttl))
}

// errNoAuthority fails a write the handler no longer has the authority to
// make: its lease was not renewed in time by its own clock.
var errNoAuthority = errors.New("proposals: this handler's lease was not renewed within its TTL by its own clock; it decides nothing until it holds the lease again")

// authority is until when this handler may decide, on its monotonic clock.
// The zero value imposes no limit (a handler whose Run was never called:
// tests of the protocol alone); Run sets it before it first competes for
// the lease.
type authority struct {
	base  time.Time    // the handler's creation, with its monotonic reading
	until atomic.Int64 // nanoseconds since base; 0: not enforced; <0: none
}

func newAuthority() authority { return authority{base: time.Now()} }

// since returns t on the monotonic clock (nanoseconds since base, at
// least 1).
func (a *authority) since(t time.Time) int64 { return max(int64(t.Sub(a.base)), 1) }

// grant records a lease acquisition or renewal sent at sent that
// succeeded: authority lasts until sent+ttl-margin.
func (a *authority) grant(sent time.Time, ttl time.Duration) time.Time {
	until := AuthorityEnd(sent, ttl)
	a.until.Store(a.since(until))
	return until
}

// grantable reports whether a lease acquired with a request sent at sent
// still leaves authority to use: its end is ahead of now.
func (a *authority) grantable(sent time.Time, ttl time.Duration) bool {
	return time.Now().Before(AuthorityEnd(sent, ttl))
}

// revoke ends the authority now (standing down, not yet holding).
func (a *authority) revoke() { a.until.Store(-1) }

// holds reports whether the handler may decide at now.
func (a *authority) holds(now time.Time) bool {
	u := a.until.Load()
	return u == 0 || (u > 0 && a.since(now) < u)
}

// left returns how long the authority lasts from now (0 when ended; a
// large value when not enforced).
func (a *authority) left(now time.Time) time.Duration {
	u := a.until.Load()
	switch {
	case u == 0:
		return time.Hour
	case u < 0:
		return 0
	}
	return max(time.Duration(u-a.since(now)), 0)
}
