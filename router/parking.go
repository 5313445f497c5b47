package router

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	natsretry "github.com/grouprouter/grouprouter/internal/retry"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/wire"
)

// The parked stream and bucket of package consumer: see wire.ParkedStream.
const (
	// ParkedStream is wire.ParkedStream.
	ParkedStream = wire.ParkedStream
	// ParkedSubjectPrefix is wire.ParkedSubjectPrefix.
	ParkedSubjectPrefix = wire.ParkedSubjectPrefix
	// ParkedBucket is wire.ParkedBucket.
	ParkedBucket = wire.ParkedBucket
	// HeaderParkReason is wire.HeaderParkReason.
	HeaderParkReason = wire.HeaderParkReason
)

// ParkedStreamConfig is wire.ParkedStreamConfig.
func ParkedStreamConfig(replicas int) jetstream.StreamConfig {
	return wire.ParkedStreamConfig(replicas)
}

// ParkedBucketConfig is wire.ParkedBucketConfig.
func ParkedBucketConfig(replicas int) jetstream.StreamConfig {
	return wire.ParkedBucketConfig(replicas)
}

// EnsureParking is wire.EnsureParking.
func EnsureParking(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	return wire.EnsureParking(ctx, js, replicas)
}

// ensureParking creates the parked stream and bucket, on a LOCAL node,
// once the node routes: in the background, so that they do not delay its
// start, retrying (with a backoff up to 30 s) until they exist or ctx ends.
// Consumers wait for them meanwhile.
func (r *Router) ensureParking(ctx context.Context, replicas int) {
	backoff := natsretry.Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second}
	for logged := false; ; logged = true {
		before := r.nc.LastError()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := EnsureParking(cctx, r.js, replicas)
		cancel()
		if err == nil {
			r.log.Debug("the parked stream and bucket are there", "stream", ParkedStream, "bucket", ParkedBucket, "replicas", replicas)
			r.hardenParking(ctx)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if v := natsretry.Violation(r.nc, before); v != nil {
			err = fmt.Errorf("%w (%w)", v, err)
		}
		if !logged {
			r.log.Warn("creating the parked stream and bucket (package consumer waits for them); retrying", "err", err)
		} else {
			r.log.Debug("creating the parked stream and bucket; retrying", "err", err)
		}
		if natsretry.Sleep(ctx, backoff.Next()) != nil {
			return
		}
	}
}

// hardenParking makes a parked bucket of an earlier release (nats.go's
// defaults: roll-ups allowed) refuse roll-ups and purges, once; a failure (a permissions block that predates
// the right to update the bucket) is logged and left for the next start.
func (r *Router) hardenParking(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	before := r.nc.LastError()
	changed, err := kvbinding.HardenBucket(cctx, r.js, ParkedBucket)
	switch {
	case err != nil && ctx.Err() == nil:
		if v := natsretry.Violation(r.nc, before); v != nil {
			err = fmt.Errorf("%w (%w)", v, err)
		}
		r.log.Warn("the parked bucket allows roll-ups (created by an earlier release) and could not be updated to deny them; a consumer could erase every parked record", "bucket", ParkedBucket, "err", err)
	case changed:
		r.log.Info("parked bucket hardened: roll-ups and purges denied", "bucket", ParkedBucket)
	}
}
