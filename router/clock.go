package router

import (
	"context"
	"time"

	natsretry "github.com/grouprouter/grouprouter/internal/retry"
)

// clock is where the hand-over shell and liveness read the time and wait:
// the system's in production (sysClock), the simulation's virtual one in
// its tests, where every timer they set is an event of the simulated world
// and so fires in the same order on every replay of a seed.
type clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once, d from now.
	NewTimer(d time.Duration) clockTimer
	// Sleep waits d, or until ctx ends (its error).
	Sleep(ctx context.Context, d time.Duration) error
	// WithTimeout is context.WithTimeout on this clock.
	WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc)
}

// clockTimer is a timer of a clock, as time.Timer: C delivers the time
// once it fires; Stop and Reset report whether it was still to fire.
type clockTimer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// fired waits for t to fire (true) or ctx to end (false).
func fired(ctx context.Context, t clockTimer) bool {
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// after returns a channel that delivers the time d from now on c.
func after(c clock, d time.Duration) <-chan time.Time { return c.NewTimer(d).C() }

// since returns the time elapsed since t on c.
func since(c clock, t time.Time) time.Duration { return c.Now().Sub(t) }

// sysClock is the system's clock.
type sysClock struct{}

func (sysClock) Now() time.Time { return time.Now() }

func (sysClock) NewTimer(d time.Duration) clockTimer { return sysTimer{time.NewTimer(d)} }

func (sysClock) Sleep(ctx context.Context, d time.Duration) error { return natsretry.Sleep(ctx, d) }

func (sysClock) WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}

type sysTimer struct{ t *time.Timer }

func (t sysTimer) C() <-chan time.Time        { return t.t.C }
func (t sysTimer) Stop() bool                 { return t.t.Stop() }
func (t sysTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }
