package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/wire"
)

// Names of the JetStream resources a router uses.
const (
	// IngressStream stores what producers publish on <address>.>.
	IngressStream = "GROUPING_INGRESS"
	// QueueStream is wire.QueueStream.
	QueueStream = wire.QueueStream
	// DeadLetterStream holds messages that could not be routed, subjects grouping.dlq.>.
	DeadLetterStream = "GROUPING_DLQ"
	// EventsStream keeps the events published on grouping.events.<kind>
	// (proposals.SubjectEventsPrefix), for Config.EventsMaxAge and at most
	// EventsMaxBytes, the oldest dropped first.
	EventsStream = "GROUPING_EVENTS"
	// EventsMaxBytes bounds the events stream: about a million events
	// (a bind event is ~200 bytes stored).
	EventsMaxBytes = 256 << 20

	// QueueSubjectPrefix is wire.QueueSubjectPrefix.
	QueueSubjectPrefix = wire.QueueSubjectPrefix
	// HeldSubjectPrefix is wire.HeldSubjectPrefix.
	HeldSubjectPrefix = wire.HeldSubjectPrefix
	// DeadLetterSubjectPrefix + <ingress subject> is a dead-letter subject.
	DeadLetterSubjectPrefix = "grouping.dlq."
	// QueueConsumerPrefix is wire.QueueConsumerPrefix.
	QueueConsumerPrefix = wire.QueueConsumerPrefix
	// PriorityGroup is wire.PriorityGroup.
	PriorityGroup = wire.PriorityGroup
)

// Headers the router sets on the messages it republishes.
const (
	// HeaderIngressSeq is wire.HeaderIngressSeq.
	HeaderIngressSeq = wire.HeaderIngressSeq
	// HeaderEpoch is wire.HeaderEpoch.
	HeaderEpoch = wire.HeaderEpoch
	// HeaderGroupSeq is wire.HeaderGroupSeq.
	HeaderGroupSeq = wire.HeaderGroupSeq
	// HeaderDeliveredBefore is wire.HeaderDeliveredBefore.
	HeaderDeliveredBefore = wire.HeaderDeliveredBefore
	// HeaderMovedFrom is set on a message moved from another node's queue
	// when its group changed node.
	HeaderMovedFrom = "Grouping-Moved-From"
	// HeaderDeadReason says why a message was dead-lettered.
	HeaderDeadReason = "Grouping-Dead-Reason"
	// HeaderBodyDropped is set, to the body's size, on a dead-letter copy
	// stored without the message's body and headers because the servers
	// refused the whole one (too large once the router's headers are
	// added); its original stays in the ingress at HeaderIngressSeq for
	// the ingress's max age.
	HeaderBodyDropped = "Grouping-Body-Dropped"
	// HeaderOrigSubject carries the ingress subject of a message
	// dead-lettered because that subject is too long to republish.
	HeaderOrigSubject = "Grouping-Orig-Subject"
	// HeaderOrigPrefix prefixes JetStream control headers ("Nats-...") the
	// producer set on the ingress publish; they applied there and are kept
	// under this prefix so they do not act again on the queue stream.
	HeaderOrigPrefix = "Grouping-Orig-"
)

// queueDuplicates is the queue stream's duplicate window: a message routed
// twice within it (same Nats-Msg-Id) is stored once.
const queueDuplicates = 2 * time.Minute

// QueueSubject is wire.QueueSubject.
func QueueSubject(node, ingressSubject string) string { return wire.QueueSubject(node, ingressSubject) }

// HeldSubject returns the held subject of a message of group for node.
func HeldSubject(node, group, ingressSubject string) string {
	key, _ := kvbinding.Key(group)
	return HeldSubjectPrefix + node + "." + key + "." + ingressSubject
}

// HeldFilter returns the filter of node's held messages of the group with
// key (kvbinding.Key), or of all its groups for key "*.*".
func HeldFilter(node, key string) string { return HeldSubjectPrefix + node + "." + key + ".>" }

// QueueFilter is wire.QueueFilter.
func QueueFilter(node string) string { return wire.QueueFilter(node) }

// QueueConsumer is wire.QueueConsumer.
func QueueConsumer(node string) string { return wire.QueueConsumer(node) }

// Replicas returns the replica count the router asks for on connection
// nc: want if > 0, else (auto) 3 when nc's server is in a cluster, 1
// otherwise. The servers place the replicas: a cluster that cannot place
// three refuses (see cannotPlace), and the node falls back to one after
// waiting clusterFormingWait for the cluster to form.
func Replicas(nc *nats.Conn, want int) int {
	switch {
	case want > 0:
		return want
	case nc.ConnectedClusterName() != "":
		return 3
	}
	return 1
}

// cannotPlace reports whether err is the servers' refusal to place a
// stream's replicas: not enough servers in the cluster (yet), or none.
func cannotPlace(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case 10005, // no suitable peers for placement
		10023, // insufficient resources
		10074: // replicas > 1 not supported in non-clustered mode
		return true
	}
	return false
}

// ensureStreams creates the ingress, queue, dead-letter and events streams
// if they are missing, and checks that existing ones capture the right
// subjects. Only a LOCAL node creates them (and then the buckets): a
// REMOTE node waits, until ctx ends, for them and the buckets to exist, so
// that its NATS user needs no right to create (or to shape) a stream.
func ensureStreams(ctx context.Context, js jetstream.JetStream, cfg Config, replicas int) error {
	// A republished message carries the producer's headers and body plus
	// the router's headers (ingress sequence, message id, a reason, the
	// original subject): the queue and dead-letter streams allow for them.
	routed := int32(0)
	if cfg.MaxMessageSize > 0 {
		routed = cfg.MaxMessageSize + routerHeaderBytes
	}
	specs := []jetstream.StreamConfig{
		{
			Name:        IngressStream,
			Description: "grouprouter ingress: producers publish on " + cfg.Address + ".>",
			Subjects:    []string{cfg.Address + ".>"},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      cfg.IngressMaxAge,
			MaxBytes:    orUnlimited(cfg.IngressMaxBytes),
			MaxMsgSize:  orUnlimited32(cfg.MaxMessageSize),
			Discard:     jetstream.DiscardNew,
			Storage:     jetstream.FileStorage,
			Replicas:    replicas,
			// Nothing removes an ingress message but its age: a removed
			// one would be a loss (reported as a gap, but a loss). A purge
			// stays allowed, for an operator resetting a deployment (the
			// bench does between phases); no role has the right.
			DenyDelete: true,
		},
		{
			Name:        QueueStream,
			Description: "grouprouter per-node queues: grouping.queue.<node>.<subject>; held-back messages: grouping.held.<node>.<group key>.<subject>",
			Subjects:    []string{QueueSubjectPrefix + ">", HeldSubjectPrefix + ">"},
			Retention:   jetstream.WorkQueuePolicy,
			MaxBytes:    orUnlimited(cfg.QueueMaxBytes),
			MaxMsgSize:  orUnlimited32(routed),
			Discard:     jetstream.DiscardNew,
			Storage:     jetstream.FileStorage,
			Replicas:    replicas,
			Duplicates:  queueDuplicates,
			// A move deletes the messages it copied, one by one; nothing
			// purges a queue.
			DenyPurge: true,
			// A group's backlog is published in batches (protocol.md,
			// "Batches"): atomic ones on replicated streams, fast-ingest
			// ones on a stream of one replica.
			AllowAtomicPublish: true,
			AllowBatchPublish:  replicas < 2,
		},
		{
			Name:        DeadLetterStream,
			Description: "grouprouter dead letters, reason in " + HeaderDeadReason,
			Subjects:    []string{DeadLetterSubjectPrefix + ">"},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      cfg.DeadLetterMaxAge,
			MaxBytes:    orUnlimited(cfg.DeadLetterMaxBytes),
			MaxMsgSize:  orUnlimited32(routed),
			// Full, it refuses new dead letters rather than evict old ones
			// silently: the group waits, in order, and every failed
			// publish is counted and logged (aggregated) until an
			// operator makes room.
			Discard:  jetstream.DiscardNew,
			Storage:  jetstream.FileStorage,
			Replicas: replicas,
		},
		{
			// Events are published on core NATS (fire and forget); the
			// stream captures them without acknowledging.
			Name:        EventsStream,
			Description: "grouprouter events: " + proposals.SubjectEventsPrefix + "<kind>, deduplicate on id",
			Subjects:    []string{proposals.SubjectEventsPrefix + ">"},
			Retention:   jetstream.LimitsPolicy,
			MaxAge:      cfg.EventsMaxAge,
			MaxBytes:    EventsMaxBytes,
			Discard:     jetstream.DiscardOld,
			Storage:     jetstream.FileStorage,
			Replicas:    replicas,
			DenyDelete:  true,
			DenyPurge:   true,
		},
	}
	if cfg.Type != Local {
		for _, bucket := range []string{kvbinding.DefaultBucket, kvbinding.DefaultNodesBucket} {
			specs = append(specs, jetstream.StreamConfig{Name: "KV_" + bucket, Subjects: []string{"$KV." + bucket + ".>"}})
		}
		for _, spec := range specs {
			if err := waitStream(ctx, js, spec, cfg.Logger.With("node", cfg.Node)); err != nil {
				return err
			}
		}
		return nil
	}
	for _, spec := range specs {
		if err := ensureStream(ctx, js, spec); err != nil {
			return err
		}
	}
	return nil
}

// routerHeaderBytes is room for the headers the router adds to a message it
// republishes.
const routerHeaderBytes = 8 << 10

func orUnlimited(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

func orUnlimited32(n int32) int32 {
	if n <= 0 {
		return -1
	}
	return n
}

// checkStream is wire.CheckStream.
func checkStream(ctx context.Context, js jetstream.JetStream, spec jetstream.StreamConfig) error {
	return wire.CheckStream(ctx, js, spec)
}

// waitStream waits until the stream exists (see checkStream), for a node
// that does not create it.
func waitStream(ctx context.Context, js jetstream.JetStream, spec jetstream.StreamConfig, log *slog.Logger) error {
	pause := 100 * time.Millisecond
	for logged := false; ; logged = true {
		err := checkStream(ctx, js, spec)
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return err
		}
		if !logged {
			log.Info("waiting for a LOCAL node to create the stream (REMOTE nodes do not create streams or buckets)", "stream", spec.Name)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (REMOTE nodes do not create streams or buckets: a LOCAL node or an operator does)", err)
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// ensureStream is wire.EnsureStream.
func ensureStream(ctx context.Context, js jetstream.JetStream, spec jetstream.StreamConfig) error {
	return wire.EnsureStream(ctx, js, spec)
}

// ensureQueueConsumer creates or updates node's durable queue consumer.
func ensureQueueConsumer(ctx context.Context, js jetstream.JetStream, node string, mode QueueMode, pinnedTTL, ackWait time.Duration) (jetstream.Consumer, error) {
	cfg := jetstream.ConsumerConfig{
		Durable:       QueueConsumer(node),
		Description:   "grouprouter queue of node " + node + " (one consumer process at a time)",
		FilterSubject: QueueFilter(node),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: 1000,
		AckWait:       ackWait,
	}
	if mode != QueuePlain {
		cfg.Description = "grouprouter queue of node " + node + ": pull with priority group " + PriorityGroup
		cfg.PriorityGroups = []string{PriorityGroup}
		cfg.PriorityPolicy = jetstream.PriorityPolicyPinned
		cfg.PinnedTTL = pinnedTTL
	}
	c, err := js.CreateOrUpdateConsumer(ctx, QueueStream, cfg)
	if err != nil {
		return nil, fmt.Errorf("grouping: queue consumer %s (mode %s): %w", QueueConsumer(node), mode, err)
	}
	return c, nil
}
