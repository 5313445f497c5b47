package kvbinding

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"grouprouter/internal/jsack"
	"grouprouter/internal/retry"
)

// entryOp is what a bucket record does to its key.
type entryOp uint8

const (
	opPut entryOp = iota
	opDelete
)

// watchBucket follows a KV bucket's stream with an ordered consumer: first
// the latest record of every key matching filter, then every change, calling
// onEntry for each in stream order and onReady once the initial records are
// done. onStart, if not nil, first learns how many initial records there
// are. It returns when ctx ends.
//
// It exists instead of KeyValue.Watch because it resumes right after the
// last record it delivered when its consumer is lost (a server restart):
// measured here, the library watcher stalled ~20 s after a restart and can
// replay the whole bucket, while an ordered pull consumer resets as soon as
// the client reconnects.
func watchBucket(ctx context.Context, js jetstream.JetStream, bucket, filter string, onStart func(records uint64), onEntry func(key string, op entryOp, value []byte, rev uint64), onReady func()) error {
	stream := "KV_" + bucket
	prefix := "$KV." + bucket + "."
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + filter},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	}
	// A failure to start following the bucket is a cluster still forming
	// or electing, and is retried until ctx ends, unless waiting cannot fix
	// it; a missing bucket is reported (the bucket is created before it is
	// watched, and ScanBindings reports a missing one).
	var cons jetstream.Consumer
	backoff := retry.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for {
		before := js.Conn().LastError()
		var err error
		cons, err = js.OrderedConsumer(ctx, stream, cfg)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if v := retry.Violation(js.Conn(), before); v != nil {
			return fmt.Errorf("kvbinding: watch %s: %w (%w)", bucket, v, err)
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) || retry.Permanent(err) {
			return fmt.Errorf("kvbinding: watch %s: %w", bucket, err)
		}
		if err := retry.Sleep(ctx, backoff.Next()); err != nil {
			return err
		}
	}
	readyDone := false
	if info := cons.CachedInfo(); info != nil {
		if onStart != nil {
			onStart(info.NumPending)
		}
		if info.NumPending == 0 {
			onReady()
			readyDone = true
		}
	}
	// The iterator, not Consume: Consume saved a timer per message, but an
	// ordered Consume only reports a re-create that fails, and with it the
	// soak test failed in two of three runs (none in six with Next).
	it, err := cons.Messages(jetstream.PullMaxMessages(4096), jetstream.PullHeartbeat(time.Second), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		return fmt.Errorf("kvbinding: watch %s: %w", bucket, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return ctx.Err()
			}
			continue
		}
		d, ok := jsack.Parse(msg.Reply())
		seq, pending := d.StreamSeq, d.Pending
		if !ok {
			meta, err := msg.Metadata()
			if err != nil {
				continue
			}
			seq, pending = meta.Sequence.Stream, meta.NumPending
		}
		subj := msg.Subject()
		if len(subj) > len(prefix) {
			op := opPut
			if h := msg.Headers(); h != nil && (h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != "") {
				op = opDelete
			}
			onEntry(subj[len(prefix):], op, msg.Data(), seq)
		}
		if !readyDone && pending == 0 {
			onReady()
			readyDone = true
		}
	}
}
