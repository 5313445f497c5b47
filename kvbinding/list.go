package kvbinding

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ScanBindings reads the bindings bucket once and calls fn with every
// record in it, in the order of their last change (oldest first), then
// returns nil. It reads the bucket as the cache's watch does (one ordered
// consumer, the latest record per key, decoded without reflection) and
// keeps nothing: listing a million bindings takes the memory of one. A
// record that does not decode, or sits under another group's key, is
// skipped. An error from fn stops the scan and is returned; a missing bucket
// is an error wrapping jetstream.ErrStreamNotFound. It does not create the
// bucket.
func ScanBindings(ctx context.Context, js jetstream.JetStream, bucket string, fn func(Binding) error) error {
	if bucket == "" {
		bucket = DefaultBucket
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var fnErr error
	done := false
	err := watchBucket(ctx, js, bucket, ">", watchHooks{entry: func(key string, op entryOp, value []byte, rev uint64) {
		if done || op != opPut {
			return
		}
		group, err := groupOfKey(key)
		if err != nil {
			return // not a key of ours
		}
		b, ok := decodeBinding(value, true)
		if !ok || b.Validate() != nil {
			var err error
			if b, err = UnmarshalBinding(value); err != nil {
				return
			}
		}
		if b.Group != group {
			return
		}
		b.Revision = rev
		if fnErr = fn(b); fnErr != nil {
			done = true
			stop()
		}
	}, ready: func() {
		// The initial records are done: what follows are new changes.
		done = true
		stop()
	}})
	switch {
	case fnErr != nil:
		return fnErr
	case done && errors.Is(err, context.Canceled):
		return nil
	case err != nil:
		return err
	}
	return fmt.Errorf("kvbinding: scan %s: ended early", bucket)
}
