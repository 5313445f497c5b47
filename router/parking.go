package router

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	natsretry "github.com/grouprouter/grouprouter/internal/retry"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// The parked stream and bucket of package consumer (see its doc): they
// live with the router's other state, in the router's account, and a LOCAL
// node creates them with its streams, so that a consumer's NATS user needs
// no right to create (or to shape) a stream. A consumer creates them only
// where it may and they are missing (a deployment without a LOCAL node of
// this release).
const (
	// ParkedStream holds parked messages, subjects
	// ParkedSubjectPrefix + <node> + "." + <ingress subject>.
	ParkedStream = "GROUPING_PARKED"
	// ParkedSubjectPrefix starts the subjects of ParkedStream.
	ParkedSubjectPrefix = "grouping.parked."
	// ParkedBucket is the KV bucket that records the parked groups.
	ParkedBucket = "grouping-parked"
	// HeaderParkReason says why a message was parked.
	HeaderParkReason = "Grouping-Park-Reason"
)

// ParkedStreamConfig is the parked stream's configuration.
func ParkedStreamConfig(replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        ParkedStream,
		Description: "grouprouter parked messages: " + ParkedSubjectPrefix + "<node>.<subject>, reason in " + HeaderParkReason,
		Subjects:    []string{ParkedSubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		Duplicates:  2 * time.Minute,
		// Replays delete parked messages one by one; nothing purges.
		DenyPurge: true,
	}
}

// ParkedBucketConfig is the configuration of the parked bucket's stream: a
// key-value bucket of history 1 that denies roll-ups and purges. Consumers
// of every node write its records (per group, through their accounts'
// imports), and on a bucket that allows roll-ups one publish with a
// Nats-Rollup: all header would erase every parked group's record, and
// with it the order those records keep. Nothing needs roll-ups: replays
// end a record with a delete.
func ParkedBucketConfig(replicas int) jetstream.StreamConfig {
	return kvbinding.HardenedBucketConfig(ParkedBucket, "grouprouter parked groups: key per group, value a consumer.ParkRecord", replicas, 0, false)
}

// EnsureParking looks the parked stream and bucket up and creates the
// missing ones (a concurrent creator is looked up again). An existing
// stream or bucket is used as it is. It returns the bucket.
func EnsureParking(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	if err := ensureStream(ctx, js, ParkedStreamConfig(replicas)); err != nil {
		return nil, err
	}
	kv, err := kvbinding.OpenHardenedBucket(ctx, js, ParkedBucketConfig(replicas))
	if err != nil {
		return nil, fmt.Errorf("grouping: %w", err)
	}
	return kv, nil
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
