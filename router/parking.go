package router

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	natsretry "grouprouter/internal/retry"
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

// ParkedBucketConfig is the parked bucket's configuration.
func ParkedBucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      ParkedBucket,
		Description: "grouprouter parked groups: key per group, value a consumer.ParkRecord",
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}
}

// EnsureParking looks the parked stream and bucket up and creates the
// missing ones (a concurrent creator is looked up again). An existing
// stream or bucket is used as it is. It returns the bucket.
func EnsureParking(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	if err := ensureStream(ctx, js, ParkedStreamConfig(replicas)); err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		kv, err := js.KeyValue(ctx, ParkedBucket)
		if !errors.Is(err, jetstream.ErrBucketNotFound) {
			if err != nil {
				return nil, fmt.Errorf("grouping: bucket %s: %w", ParkedBucket, err)
			}
			return kv, nil
		}
		kv, err = js.CreateKeyValue(ctx, ParkedBucketConfig(replicas))
		if err == nil {
			return kv, nil
		}
		if attempt >= 2 {
			return nil, fmt.Errorf("grouping: create bucket %s: %w", ParkedBucket, err)
		}
	}
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
