package kvbinding

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/wire"
)

// HardenedBucketConfig is wire.HardenedBucketConfig.
func HardenedBucketConfig(bucket, description string, replicas int, maxValueSize int32, ttls bool) jetstream.StreamConfig {
	return wire.HardenedBucketConfig(bucket, description, replicas, maxValueSize, ttls)
}

// OpenHardenedBucket is wire.OpenHardenedBucket.
func OpenHardenedBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.KeyValue, error) {
	return wire.OpenHardenedBucket(ctx, js, cfg)
}

// IsHardened reports whether a bucket's stream configuration refuses
// roll-ups and purges.
func IsHardened(c jetstream.StreamConfig) bool {
	return !c.AllowRollup && c.DenyPurge && c.SubjectDeleteMarkerTTL == 0
}

// BucketHardened reports whether bucket refuses roll-ups and purges.
func BucketHardened(ctx context.Context, js jetstream.JetStream, bucket string) (bool, error) {
	s, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return false, fmt.Errorf("kvbinding: read bucket %s: %w", bucket, err)
	}
	return IsHardened(s.CachedInfo().Config), nil
}

// HardenBucket updates a bucket created as nats.go creates them (roll-ups
// allowed, perhaps expiry markers) to refuse roll-ups and purges, keeping
// per-key TTLs if it had them; it reports whether it changed the bucket.
func HardenBucket(ctx context.Context, js jetstream.JetStream, bucket string) (bool, error) {
	s, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return false, fmt.Errorf("kvbinding: read bucket %s: %w", bucket, err)
	}
	c := s.CachedInfo().Config
	if IsHardened(c) {
		return false, nil
	}
	c.AllowMsgTTL = c.AllowMsgTTL || c.SubjectDeleteMarkerTTL > 0
	c.SubjectDeleteMarkerTTL = 0
	c.AllowRollup, c.DenyPurge = false, true
	if _, err := js.UpdateStream(ctx, c); err != nil {
		return false, fmt.Errorf("kvbinding: harden bucket %s: %w", bucket, err)
	}
	return true, nil
}
