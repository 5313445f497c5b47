package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// Names of the JetStream resources a router uses.
const (
	// IngressStream stores what producers publish on <address>.>.
	IngressStream = "GROUPING_INGRESS"
	// QueueStream holds the per-node queues, subjects grouping.queue.>.
	QueueStream = "GROUPING_QUEUE"
	// DeadLetterStream holds messages that could not be routed, subjects grouping.dlq.>.
	DeadLetterStream = "GROUPING_DLQ"
	// EventsStream keeps the events published on grouping.events.<kind>
	// (proposals.SubjectEventsPrefix), for Config.EventsMaxAge and at most
	// EventsMaxBytes, the oldest dropped first.
	EventsStream = "GROUPING_EVENTS"
	// EventsMaxBytes bounds the events stream: about a million events
	// (a bind event is ~200 bytes stored).
	EventsMaxBytes = 256 << 20

	// QueueSubjectPrefix + <node> + "." + <ingress subject> is a node's queue subject.
	QueueSubjectPrefix = "grouping.queue."
	// HeldSubjectPrefix + <node> + "." + <group key> + "." + <ingress
	// subject> holds, in the queue stream, a group's messages past its
	// share of node's queue window (fairshare.go): read by no consumer,
	// moved onto the queue as the consumer acknowledges the group's
	// earlier messages. The group key is kvbinding.Key's (two tokens).
	HeldSubjectPrefix = "grouping.held."
	// DeadLetterSubjectPrefix + <ingress subject> is a dead-letter subject.
	DeadLetterSubjectPrefix = "grouping.dlq."
	// QueueConsumerPrefix + <node> is the durable consumer of a node's queue.
	QueueConsumerPrefix = "grouping-node-"
	// PriorityGroup is the priority group consumers of a node's queue pull with.
	PriorityGroup = "grouping"
)

// Headers the router sets on the messages it republishes.
const (
	// HeaderIngressSeq carries the ingress stream sequence of the message.
	HeaderIngressSeq = "Grouping-Ingress-Seq"
	// HeaderEpoch carries the group's epoch on every message a node puts
	// on a queue (kvbinding.Binding.Epoch): the revision of the binding
	// record that made the node the group's owner. It grows with every
	// move and is the same for every node, so a consumer that sees a
	// message of a lower epoch than one it processed knows it for a copy
	// made before a move (see docs/protocol.md, "Hand-over and epochs").
	HeaderEpoch = "Grouping-Epoch"
	// HeaderGroupSeq set to -1 on a message closes its group after it (the
	// JMS JMSXGroupSeq convention): the binding is released cluster-wide.
	HeaderGroupSeq = "Group-Seq"
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

// QueueSubject returns the queue subject of a message for node.
func QueueSubject(node, ingressSubject string) string {
	return QueueSubjectPrefix + node + "." + ingressSubject
}

// HeldSubject returns the held subject of a message of group for node.
func HeldSubject(node, group, ingressSubject string) string {
	key, _ := kvbinding.Key(group)
	return HeldSubjectPrefix + node + "." + key + "." + ingressSubject
}

// HeldFilter returns the filter of node's held messages of the group with
// key (kvbinding.Key), or of all its groups for key "*.*".
func HeldFilter(node, key string) string { return HeldSubjectPrefix + node + "." + key + ".>" }

// QueueFilter returns the filter subject of node's queue consumer.
func QueueFilter(node string) string { return QueueSubjectPrefix + node + ".>" }

// QueueConsumer returns the durable consumer name of node's queue.
func QueueConsumer(node string) string { return QueueConsumerPrefix + node }

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

// checkStream returns nil if the stream exists and captures spec's
// subjects, an error wrapping jetstream.ErrStreamNotFound if it does not
// exist.
func checkStream(ctx context.Context, js jetstream.JetStream, spec jetstream.StreamConfig) error {
	s, err := js.Stream(ctx, spec.Name)
	if err != nil {
		return fmt.Errorf("grouping: stream %s: %w", spec.Name, err)
	}
	got := s.CachedInfo().Config.Subjects
	for _, want := range spec.Subjects {
		if want == HeldSubjectPrefix+">" {
			continue // added to a queue stream created before it by a LOCAL node (queueHolds)
		}
		if !slices.Contains(got, want) {
			return fmt.Errorf("%w: stream %s captures %v, not %s", ErrStreamConflict, spec.Name, got, want)
		}
	}
	return nil
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

// ensureStream creates spec's stream unless it exists (see checkStream).
// Another process may be creating it at the same moment (a LOCAL node and
// the consumers of package consumer start together, and ask for the
// parked stream with other replicas): until that create is done, the
// stream's info goes unanswered (no stream leader yet) or says not found,
// while a create of another configuration finds the name in use. So each
// look has a deadline of its own, and a name in use is looked at again,
// every 100 ms, until the stream answers or ctx ends; any other create
// error is returned after three tries.
func ensureStream(ctx context.Context, js jetstream.JetStream, spec jetstream.StreamConfig) error {
	for attempt := 0; ; {
		lctx, cancel := context.WithTimeout(ctx, streamLookTimeout)
		err := checkStream(lctx, js, spec)
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

// streamLookTimeout bounds one look at a stream in ensureStream: a
// stream being created answers no info request until it has a leader.
const streamLookTimeout = 2 * time.Second

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
