package router

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// liveness announces the node in its liveness record every heartbeat,
// with whether its queue has a consumer, and tells the engine until when
// the record surely exists: past that, the node publishes nothing (its
// groups may have moved). It owns what it last announced and reaches the
// rest of the node only through the functions it is given.
type liveness struct {
	reg   announcer     // the registry, opened by setup
	every time.Duration // Config.Heartbeat
	clock clock
	log   *slog.Logger
	warn  *logagg.Warner // failed announcements, one line per interval
	// yielded: the node id is another process's, whose record this is.
	yielded *atomic.Bool

	// report is what the node announces of itself at now: identity,
	// position, counters and the groups it holds (announce adds the
	// consumer and the record's times).
	report func(now time.Time) kvbinding.NodeInfo
	// consumerChanged hands the engine the queue consumer's presence
	// when it changed.
	consumerChanged func(has bool)
	// lastRevision reads the bindings bucket's last revision; records
	// says how far the binding cache holds the records (catchUp).
	lastRevision func(ctx context.Context) (uint64, error)
	records      func() uint64
	// alive hands the engine until when the record surely exists.
	alive func(until time.Time)

	hasConsumer atomic.Bool
	// until is until when the last stored announcement keeps the record
	// sure to exist (announce's alone: the first announcement, then run).
	until time.Time
}

// announcer stores a node's liveness record (kvbinding.Registry).
type announcer interface {
	Announce(ctx context.Context, info kvbinding.NodeInfo, ttl time.Duration) error
}

// presencePoll is how often a node without a queue consumer looks for one
// (consumer info), so that a consumer's first pull is announced within
// about this much instead of at the next heartbeat.
const presencePoll = 100 * time.Millisecond

// run announces the node every heartbeat, with whether its queue consumer
// has an active puller; while it has none, it looks every presencePoll and
// announces at once when one appears (the handler then counts the node
// eligible for new groups and rebalancing). With one, it wakes only for
// the heartbeat.
func (l *liveness) run(ctx context.Context, cons jetstream.Consumer) {
	tick := min(presencePoll, l.every)
	var last time.Time
	t := l.clock.NewTimer(tick)
	defer t.Stop()
	for fired(ctx, t) {
		now := l.clock.Now()
		due := last.IsZero() || now.Sub(last)+tick/2 >= l.every
		if !due && !l.hasConsumer.Load() {
			due = l.consumerAppeared(ctx, cons)
		}
		if due {
			last = now
			if err := l.announce(ctx, cons); err != nil && ctx.Err() == nil {
				l.warn.Warn("", "err", err)
			}
		}
		// With a consumer, nothing is looked at before the next
		// heartbeat; without one, every tick.
		next := tick - since(l.clock, now)
		if l.hasConsumer.Load() {
			next = l.every - since(l.clock, last)
		}
		t.Reset(max(next, 0))
	}
}

// consumerAppeared reports whether the node's queue, which had no consumer
// at the last announcement, has one now.
func (l *liveness) consumerAppeared(ctx context.Context, cons jetstream.Consumer) bool {
	ctx, cancel := l.clock.WithTimeout(ctx, presencePoll)
	defer cancel()
	info, err := cons.Info(ctx)
	if err != nil || !consumerPresent(info, l.clock.Now()) {
		return false
	}
	l.log.Debug("queue consumer appeared; announcing now")
	return true
}

// announce stores the node's liveness record once. After a lapse it
// catches up with the binding records before the engine may publish
// again.
func (l *liveness) announce(ctx context.Context, cons jetstream.Consumer) error {
	if l.yielded.Load() {
		return nil // the record is the other process's
	}
	ctx, cancel := l.clock.WithTimeout(ctx, l.every)
	defer cancel()
	var pending, unacked uint64
	if info, err := cons.Info(ctx); err == nil {
		pending, unacked = info.NumPending, uint64(info.NumAckPending)
		has := consumerPresent(info, l.clock.Now())
		if l.hasConsumer.Swap(has) != has {
			l.consumerChanged(has)
		}
	}
	now := l.clock.Now().UTC()
	info := l.report(now)
	info.HasConsumer, info.Heartbeat, info.Every = l.hasConsumer.Load(), now, l.every
	info.QueuePending, info.QueueUnacked = pending, unacked
	sent := l.clock.Now()
	// Lapsed: the last stored announcement is too old for the record to be
	// sure to exist; the engine publishes nothing (fenced).
	lapsed := !l.until.IsZero() && !sent.Before(l.until)
	if err := l.reg.Announce(ctx, info, kvbinding.NodeTTL(l.every)); err != nil {
		return err
	}
	// The record lives NodeTTL from when it was stored, after sent. A
	// margin of one heartbeat keeps this node's publishes stopped before
	// the record can have expired anywhere (the handler moves a node's
	// groups only NodeGrace after that).
	until := sent.Add(kvbinding.NodeTTL(l.every) - l.every)
	if lapsed {
		// While the record may have been gone (a partition, a pause), the
		// handler may have moved this node's groups, and this node's
		// cache may not have those records yet: its view is its side's.
		// It publishes again only once it has every record stored before
		// this announcement (docs/protocol.md, "Who may decide, and until
		// when").
		l.log.Info("liveness renewed after it may have lapsed: catching up with the binding records before publishing again",
			"lapsed_for", sent.Sub(l.until).Round(time.Millisecond))
		if err := l.catchUp(ctx); err != nil {
			return fmt.Errorf("catching up with the binding records after a lapse (still not publishing): %w", err)
		}
		l.log.Info("caught up with the binding records; publishing again", "records_through", l.records())
	}
	l.until = until
	l.alive(until)
	return nil
}

// catchUp waits until the binding cache holds every record stored before
// it was called: the bucket's last record, as its stream leader says, has
// reached the cache through the watch.
func (l *liveness) catchUp(ctx context.Context) error {
	last, err := l.lastRevision(ctx)
	if err != nil {
		return err
	}
	for l.records() < last {
		if err := l.clock.Sleep(ctx, 5*time.Millisecond); err != nil {
			return fmt.Errorf("the cache has records through %d, the bucket through %d: %w", l.records(), last, err)
		}
	}
	return nil
}
