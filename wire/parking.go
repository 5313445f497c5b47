package wire

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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
	return HardenedBucketConfig(ParkedBucket, "grouprouter parked groups: key per group, value a consumer.ParkRecord", replicas, 0, false)
}

// EnsureParking looks the parked stream and bucket up and creates the
// missing ones (a concurrent creator is looked up again). An existing
// stream or bucket is used as it is. It returns the bucket.
func EnsureParking(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	if err := EnsureStream(ctx, js, ParkedStreamConfig(replicas)); err != nil {
		return nil, err
	}
	kv, err := OpenHardenedBucket(ctx, js, ParkedBucketConfig(replicas))
	if err != nil {
		return nil, fmt.Errorf("grouping: %w", err)
	}
	return kv, nil
}
