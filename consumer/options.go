package consumer

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/grouprouter/grouprouter/wire"
)

// Defaults of the options.
const (
	DefaultConcurrency  = 16
	DefaultMaxAttempts  = 5
	DefaultBackoffMin   = 100 * time.Millisecond
	DefaultBackoffMax   = 30 * time.Second
	DefaultDrainTimeout = 10 * time.Second
	DefaultPullBatch    = 500
	// DefaultIdleLane is how long a lane with nothing held is kept (its
	// done mark and epoch) before it is forgotten.
	DefaultIdleLane = 5 * time.Minute
	// ParkedStream holds parked messages, subjects
	// ParkedSubjectPrefix + <node> + "." + <ingress subject>. It lives with
	// the router's state: a LOCAL router node creates it
	// (wire.EnsureParking), and Consume creates it only when it is
	// missing.
	ParkedStream = wire.ParkedStream
	// ParkedSubjectPrefix starts the subjects of ParkedStream.
	ParkedSubjectPrefix = wire.ParkedSubjectPrefix
	// ParkedBucket is the KV bucket that records the parked groups: key
	// kvbinding.FullKey(group), value a JSON ParkRecord.
	ParkedBucket = wire.ParkedBucket
	// HeaderParkReason says why a message was parked.
	HeaderParkReason = wire.HeaderParkReason
	// HeaderParkAttempts says how many times its handler failed.
	HeaderParkAttempts = "Grouping-Park-Attempts"
)

// Option changes how Consume works.
type Option func(*options) error

type options struct {
	concurrency  int
	maxAttempts  int
	backoffMin   time.Duration
	backoffMax   time.Duration
	drainTimeout time.Duration
	pullBatch    int
	plainAcks    bool
	idleLane     time.Duration
	groupHeader  string
	logger       *slog.Logger
	registerer   prometheus.Registerer
	replicas     int
}

func defaultOptions() options {
	return options{
		concurrency:  DefaultConcurrency,
		maxAttempts:  DefaultMaxAttempts,
		backoffMin:   DefaultBackoffMin,
		backoffMax:   DefaultBackoffMax,
		drainTimeout: DefaultDrainTimeout,
		pullBatch:    DefaultPullBatch,
		idleLane:     DefaultIdleLane,
		groupHeader:  wire.DefaultGroupHeader,
		logger:       slog.New(slog.DiscardHandler),
		replicas:     1,
	}
}

// WithConcurrency sets how many handlers run at once, each for a
// different group (default DefaultConcurrency).
func WithConcurrency(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("%w: concurrency must be >= 1, got %d", ErrConfig, n)
		}
		o.concurrency = n
		return nil
	}
}

// WithMaxAttempts sets how many times a message's handler may fail before
// the message and its group's later messages are parked (default
// DefaultMaxAttempts; 1 parks on the first failure).
func WithMaxAttempts(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("%w: max attempts must be >= 1, got %d", ErrConfig, n)
		}
		o.maxAttempts = n
		return nil
	}
}

// WithBackoff sets the wait before a failed message is tried again: min
// after the first failure, doubling up to max. Other groups go on.
func WithBackoff(minWait, maxWait time.Duration) Option {
	return func(o *options) error {
		if minWait <= 0 || maxWait < minWait {
			return fmt.Errorf("%w: backoff needs 0 < min <= max, got %v, %v", ErrConfig, minWait, maxWait)
		}
		o.backoffMin, o.backoffMax = minWait, maxWait
		return nil
	}
}

// WithDrainTimeout bounds how long Consume waits, once ctx ends, for the
// running handlers (default DefaultDrainTimeout).
func WithDrainTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: drain timeout must be > 0, got %v", ErrConfig, d)
		}
		o.drainTimeout = d
		return nil
	}
}

// WithPullBatch sets how many messages the pull keeps buffered
// (jetstream.PullMaxMessages, default DefaultPullBatch). The queue
// consumer's MaxAckPending bounds what is held in all.
func WithPullBatch(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("%w: pull batch must be >= 1, got %d", ErrConfig, n)
		}
		o.pullBatch = n
		return nil
	}
}

// WithIdleLane sets how long the state of a group with nothing held (its
// done mark and epoch) is kept (default DefaultIdleLane).
func WithIdleLane(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return fmt.Errorf("%w: idle lane time must be > 0, got %v", ErrConfig, d)
		}
		o.idleLane = d
		return nil
	}
}

// WithGroupHeader sets the header that holds the group id, as the
// router's Config.GroupHeader (default wire.DefaultGroupHeader).
func WithGroupHeader(name string) Option {
	return func(o *options) error {
		if !wire.ValidHeaderName(name) {
			return fmt.Errorf("%w: group header %q is not a valid header name", ErrConfig, name)
		}
		o.groupHeader = name
		return nil
	}
}

// WithLogger sets the logger (default: none). State changes are logged
// at debug level; parking at warning.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrConfig)
		}
		o.logger = l
		return nil
	}
}

// WithRegisterer registers the metrics (see metrics.go) with r (default:
// not registered). No metric has a label per group.
func WithRegisterer(r prometheus.Registerer) Option {
	return func(o *options) error {
		o.registerer = r
		return nil
	}
}

// WithParkedReplicas sets the replicas of the parked stream and bucket
// when Consume creates them (default 1).
func WithParkedReplicas(n int) Option {
	return func(o *options) error {
		if n < 1 || n > 5 {
			return fmt.Errorf("%w: replicas must be 1..5, got %d", ErrConfig, n)
		}
		o.replicas = n
		return nil
	}
}

// backoff returns the wait after the attempt-th failure.
func (o *options) backoff(attempt int) time.Duration {
	d := o.backoffMin
	for i := 1; i < attempt && d < o.backoffMax; i++ {
		d *= 2
	}
	return min(d, o.backoffMax)
}

// WithUnconfirmedAcks acks a handled message without waiting for the
// server to confirm it (Ack instead of DoubleAck): one publish instead of a
// request per message, for a measuring harness or a handler whose work is
// idempotent. An ack lost in transit then goes unnoticed: the message is
// redelivered after the ack wait, and dropped as at or below its group's
// done mark if this process still runs; a process started meanwhile
// handles it again (flagged Redelivered). Default: confirmed acks.
func WithUnconfirmedAcks() Option {
	return func(o *options) error {
		o.plainAcks = true
		return nil
	}
}
