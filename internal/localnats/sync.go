package localnats

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrSync is wrapped by ParseSync's errors.
var ErrSync = errors.New("localnats: bad sync policy")

// ServerDefaultSync is nats-server's own fsync interval when none is
// configured (v2.15: a background flush every two minutes).
const ServerDefaultSync = 2 * time.Minute

// Sync is a JetStream server's fsync policy: Always (every write reaches
// the disk before it is acknowledged: nats-server's sync_interval:
// always), or Interval between background flushes (an acknowledged write
// not yet flushed is lost when the OS or the machine stops). The zero
// value is the server's default.
type Sync struct {
	Always   bool
	Interval time.Duration
}

// ParseSync parses "always" or a Go duration (> 0), as --sync takes them.
func ParseSync(s string) (Sync, error) {
	if strings.EqualFold(strings.TrimSpace(s), "always") {
		return Sync{Always: true}, nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d <= 0 {
		return Sync{}, fmt.Errorf("%w: %q: want always or a duration > 0 such as 1s or 2m", ErrSync, s)
	}
	return Sync{Interval: d}, nil
}

// String is "always" or the interval ("default" for the zero value).
func (s Sync) String() string {
	switch {
	case s.Always:
		return "always"
	case s.Interval > 0:
		return s.Interval.String()
	default:
		return "default"
	}
}

// Set implements flag.Value.
func (s *Sync) Set(v string) error {
	p, err := ParseSync(v)
	if err != nil {
		return err
	}
	*s = p
	return nil
}

// Apply writes the policy into o (as nats-server's sync_interval does);
// the zero value leaves o as it is.
func (s Sync) Apply(o *server.Options) {
	switch {
	case s.Always:
		o.SyncAlways = true
		o.SyncInterval = ServerDefaultSync // what nats-server sets with "always"
	case s.Interval > 0:
		o.SyncAlways = false
		o.SyncInterval = s.Interval
	}
}

// SyncOf reads the policy o configures (the zero value when it sets none).
func SyncOf(o *server.Options) Sync {
	return Sync{Always: o.SyncAlways, Interval: o.SyncInterval}
}

// Option changes how Start configures its servers.
type Option func(*server.Options)

// WithSync runs the servers with fsync policy s.
func WithSync(s Sync) Option { return s.Apply }
