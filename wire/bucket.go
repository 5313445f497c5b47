package wire

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// HardenedBucketConfig is the stream configuration of a key-value bucket
// of history 1 that refuses roll-ups and purges: one publish with a
// Nats-Rollup: all header on any key a client may write would otherwise
// erase every other key. It therefore keeps no expiry markers (nats-server
// allows them only with roll-ups); with ttls, records may carry per-key
// TTLs. maxValueSize 0 means no bound.
func HardenedBucketConfig(bucket, description string, replicas int, maxValueSize int32, ttls bool) jetstream.StreamConfig {
	if maxValueSize <= 0 {
		maxValueSize = -1
	}
	return jetstream.StreamConfig{
		Name:              "KV_" + bucket,
		Description:       description,
		Subjects:          []string{"$KV." + bucket + ".>"},
		MaxMsgsPerSubject: 1,
		MaxBytes:          -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		MaxMsgSize:        maxValueSize,
		Storage:           jetstream.FileStorage,
		Replicas:          max(replicas, 1),
		Discard:           jetstream.DiscardNew,
		Duplicates:        2 * time.Minute,
		AllowDirect:       true,
		DenyDelete:        true,
		DenyPurge:         true,
		AllowMsgTTL:       ttls,
	}
}

// OpenHardenedBucket binds to the bucket of cfg (a HardenedBucketConfig),
// creating it when it does not exist yet; an existing bucket is used as it
// is (see HardenBucket). Another process may be creating it at the same
// moment: until it has a stream leader the bucket answers no lookup, and a
// create of another configuration finds the name in use. So each lookup
// has a deadline of its own, and it looks again, every 100 ms, until the
// bucket answers or ctx ends.
func OpenHardenedBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.KeyValue, error) {
	bucket := strings.TrimPrefix(cfg.Name, "KV_")
	for {
		lctx, cancel := context.WithTimeout(ctx, bucketLookTimeout)
		kv, err := js.KeyValue(lctx, bucket)
		cancel()
		if err == nil {
			return kv, nil
		}
		unanswered := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
		if !errors.Is(err, jetstream.ErrBucketNotFound) && !unanswered {
			return nil, fmt.Errorf("kvbinding: open bucket %s: %w", bucket, err)
		}
		if _, cerr := js.CreateStream(ctx, cfg); cerr == nil {
			continue
		} else if !errors.Is(cerr, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("kvbinding: create bucket %s: %w", bucket, cerr)
		}
		// Being created by another process (or there, of another
		// configuration, and not answering yet).
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kvbinding: open bucket %s: %w", bucket, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// bucketLookTimeout bounds one lookup of a bucket in OpenHardenedBucket.
const bucketLookTimeout = 2 * time.Second
