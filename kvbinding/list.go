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
		digest := errors.Is(err, ErrDigestKey)
		if err != nil && !digest {
			return // not a key of ours
		}
		b, ok := decodeBinding(value, true)
		if !ok || b.Validate() != nil {
			var err error
			if b, err = UnmarshalBinding(value); err != nil {
				return
			}
		}
		if digest {
			group = b.Group // the key does not name it: the record does
		}
		if b.Group != group || !KeyHolds(key, b.Group) {
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

// namesByGet is the most long ids Names reads one by one; more are read
// in one scan of the bucket.
const namesByGet = 8

// errNamed stops the scan of Names once every ref is named.
var errNamed = errors.New("kvbinding: every ref named")

// Names returns the group ids of refs (see Ref), by ref: a ref that is a
// group id names itself; the long ids are read from their records in the
// bucket (the cache does not keep them), one by one when there are a few,
// else in one scan of the bucket. A ref whose record is gone, or is not
// its group's, is left out. It returns the error of a read (the refs named
// so far with it).
func (s *Store) Names(ctx context.Context, refs []string) (map[string]string, error) {
	out := make(map[string]string, len(refs))
	want := map[string]bool{}
	for _, r := range refs {
		if IsRef(r) {
			want[r] = true
		} else {
			out[r] = r
		}
	}
	if len(want) > 0 && len(want) <= namesByGet {
		for r := range want {
			e, err := s.kv.Get(ctx, r[len(refMark):])
			if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
				continue // gone, or under a legacy key: the scan looks
			}
			if err != nil {
				return out, fmt.Errorf("kvbinding: names: %w", err)
			}
			if b, err := decodeEntry(e); err == nil && Ref(b.Group) == r {
				out[r] = b.Group
				delete(want, r)
			}
		}
	}
	if len(want) == 0 {
		return out, nil
	}
	err := ScanBindings(ctx, s.js, s.bucket, func(b Binding) error {
		if !digested(b.Group) {
			return nil
		}
		if r := Ref(b.Group); want[r] {
			out[r] = b.Group
			delete(want, r)
			if len(want) == 0 {
				return errNamed
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errNamed) {
		return out, fmt.Errorf("kvbinding: names: %w", err)
	}
	return out, nil
}
