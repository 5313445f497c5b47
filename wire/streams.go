package wire

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrStreamConflict is returned when an existing stream does not fit
// the configuration (e.g. the ingress stream captures another address).
var ErrStreamConflict = errors.New("grouping: existing stream does not match the configuration")

// CheckStream returns nil if the stream exists and captures spec's
// subjects, an error wrapping jetstream.ErrStreamNotFound if it does not
// exist.
func CheckStream(ctx context.Context, js jetstream.JetStream, spec jetstream.StreamConfig) error {
	s, err := js.Stream(ctx, spec.Name)
	if err != nil {
		return fmt.Errorf("grouping: stream %s: %w", spec.Name, err)
	}
	got := s.CachedInfo().Config.Subjects
	for _, want := range spec.Subjects {
		if want == HeldSubjectPrefix+">" {
			continue // added to a queue stream created before it by a LOCAL node (router's queueHolds)
		}
		if !slices.Contains(got, want) {
			return fmt.Errorf("%w: stream %s captures %v, not %s", ErrStreamConflict, spec.Name, got, want)
		}
	}
	return nil
}

// EnsureStream creates spec's stream unless it exists (see CheckStream).
// Another process may be creating it at the same moment (a LOCAL node and
// the consumers of package consumer start together, and ask for the
// parked stream with other replicas): until that create is done, the
// stream's info goes unanswered (no stream leader yet) or says not found,
// while a create of another configuration finds the name in use. So each
// look has a deadline of its own, and a name in use is looked at again,
// every 100 ms, until the stream answers or ctx ends; any other create
// error is returned after three tries.
func EnsureStream(ctx context.Context, js jetstream.JetStream, spec jetstream.StreamConfig) error {
	for attempt := 0; ; {
		lctx, cancel := context.WithTimeout(ctx, streamLookTimeout)
		err := CheckStream(lctx, js, spec)
		cancel()
		unanswered := errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil
		if !errors.Is(err, jetstream.ErrStreamNotFound) && !unanswered {
			return err
		}
		_, err = js.CreateStream(ctx, spec)
		if err == nil {
			return nil
		}
		err = fmt.Errorf("grouping: create stream %s: %w", spec.Name, err)
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			if attempt++; attempt >= 3 {
				return err
			}
			continue // another node may have created it concurrently: look again
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (the stream did not answer: %w)", err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// streamLookTimeout bounds one look at a stream in EnsureStream: a
// stream being created answers no info request until it has a leader.
const streamLookTimeout = 2 * time.Second
