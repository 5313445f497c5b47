package router

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// msgStore is what the hand-over shell does on a stream's stored messages
// (the queue stream; the ingress, for its side reads): narrow, and in this
// package's terms, so that a stand-in can take its place. nats.go's
// jetstream.Stream takes its filters as options a stand-in cannot read.
type msgStore interface {
	// get returns the message at seq.
	get(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error)
	// next returns the first message at or after seq whose subject
	// matches filter.
	next(ctx context.Context, seq uint64, filter string) (*jetstream.RawStreamMsg, error)
	// state returns the stream's state restricted to filter: its
	// Subjects hold how many messages each matching subject stores.
	state(ctx context.Context, filter string) (jetstream.StreamState, error)
	// delete removes the message at seq.
	delete(ctx context.Context, seq uint64) error
}

// jsStore is msgStore on a JetStream stream.
type jsStore struct{ s jetstream.Stream }

func (j jsStore) get(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	return j.s.GetMsg(ctx, seq)
}

func (j jsStore) next(ctx context.Context, seq uint64, filter string) (*jetstream.RawStreamMsg, error) {
	return j.s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
}

func (j jsStore) state(ctx context.Context, filter string) (jetstream.StreamState, error) {
	info, err := j.s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return jetstream.StreamState{}, err
	}
	return info.State, nil
}

func (j jsStore) delete(ctx context.Context, seq uint64) error { return j.s.DeleteMsg(ctx, seq) }

// queueIO is what the hand-over shell does on JetStream besides reading
// and deleting stored messages, on js: publish (a copy, a catch-up), pause
// a node's queue consumer, read that consumer's state, read the ingress
// from a sequence on.
type queueIO struct {
	publish  func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error)
	pause    func(ctx context.Context, node string, until time.Time) error
	consumer func(ctx context.Context, node string) (*jetstream.ConsumerInfo, error)
	// ingress returns an ordered consumer of the ingress from seq on,
	// making one attempt at each re-creation of its server consumer (see
	// readIngress).
	ingress func(ctx context.Context, seq uint64) (jetstream.Consumer, error)
	// queue returns the queue stream's stored messages.
	queue func(ctx context.Context) (msgStore, error)
	// side returns a stream's stored messages for the reads a step waits
	// for (sidereads.go: one lookup, cached).
	side func(ctx context.Context, stream string) (msgStore, error)
}

// jsQueueIO is queueIO on js, with side's lookups of streams.
func jsQueueIO(js jetstream.JetStream, side *sideReads) queueIO {
	return queueIO{
		publish: func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) { return js.PublishMsg(ctx, m) },
		pause: func(ctx context.Context, node string, until time.Time) error {
			_, err := js.PauseConsumer(ctx, QueueStream, QueueConsumer(node), until)
			return err
		},
		consumer: func(ctx context.Context, node string) (*jetstream.ConsumerInfo, error) {
			// Looking the consumer up reads its info: one request, not a
			// second (Info) for the same answer.
			cons, err := js.Consumer(ctx, QueueStream, QueueConsumer(node))
			if err != nil {
				return nil, err
			}
			return cons.CachedInfo(), nil
		},
		ingress: func(ctx context.Context, seq uint64) (jetstream.Consumer, error) {
			return js.OrderedConsumer(ctx, IngressStream, jetstream.OrderedConsumerConfig{
				DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: seq, MaxResetAttempts: 1,
			})
		},
		queue: func(ctx context.Context) (msgStore, error) {
			s, err := js.Stream(ctx, QueueStream)
			if err != nil {
				return nil, err
			}
			return jsStore{s}, nil
		},
		side: side.store,
	}
}
