// Package consumer processes a grouprouter node's queue: each group's
// messages one at a time and in ingress order, many groups in parallel,
// with retries, ordered parking of a failing group, and the group's epoch
// as a fence for the application's writes.
//
//	err := consumer.Consume(ctx, js, "n1", func(ctx context.Context, m *consumer.Message) error {
//		return store.Apply(ctx, m.Group, m.Fence, m.Data) // nil acks it
//	}, consumer.WithConcurrency(64))
//
// Import path: github.com/grouprouter/grouprouter/consumer (go get
// github.com/grouprouter/grouprouter/consumer).
//
// # Lanes
//
// Consume pulls from the node's durable queue consumer (with priority
// group wire.PriorityGroup when the queue is pinned, the default) and
// puts each message into its group's lane, ordered by the
// Grouping-Ingress-Seq header. A lane runs its lowest message when no
// other of its group runs; up to WithConcurrency lanes run at once. A
// message is acknowledged, with a confirmed ack (DoubleAck), only after
// its handler returned nil; while it waits or runs, Consume sends
// InProgress so that JetStream does not redeliver it.
//
// # Order under redelivery
//
// A group's done mark is the last ingress sequence it processed: a copy
// at or below it is dropped (and counted). A redelivered message that
// arrives behind later ones of its group takes its place in the lane.
// When Consume starts, messages of the node delivered to another process
// and not acknowledged (a process that died, or the pinned one while this
// one waited) hold their groups' later messages until JetStream delivers
// them again after the ack wait, or they leave the queue.
//
// # Fencing
//
// Every queued message carries its group's epoch (wire.HeaderEpoch),
// which grows with every move of the group. A lane that sees a message of
// a newer epoch drops the older ones it holds, cancels a running
// handler's context with cause ErrStale, and drops older copies that
// arrive later. Message.Fence, (epoch, ingress seq), lets the application
// refuse a write older than the last it applied for the group.
//
// # Retry and parking
//
// A handler error is retried after a backoff (WithBackoff) while other
// groups go on. After WithMaxAttempts failures, or at once for an error
// wrapped with Terminal, the message and every later message of its group
// are published in order to stream ParkedStream (subject
// ParkedSubjectPrefix + node + "." + the group's key + "." + the ingress
// subject, the reason in HeaderParkReason) and acknowledged, and the group
// is recorded in bucket ParkedBucket, so that its later messages, on any
// node, follow it there. The stream and the bucket are the router's: a
// LOCAL router node creates them (wire.EnsureParking). Through a
// JetStream API prefix Consume waits for them; with the account's own API
// it creates missing ones. Consume works through an API prefix (js from
// jetstream.NewWithAPIPrefix), as a consumer in an account of its own does
// (grouprouter permissions prints that layout).
//
// # Replay
//
// Replay (grouprouter retry, skip, release) marks the record for a
// replay: every Consume then holds the group's arrivals, and the one of
// the record's node claims the replay, handles the parked messages in
// order (Message.Replayed), deleting each once handled, and deletes the
// record. The state is in the record, so a process that dies mid-replay
// is taken over after its claim runs out, without losing or repeating a
// message (the one whose handler may have run is flagged Redelivered).
// ListParked and GetParked report the parked groups.
//
// See docs/consuming.md.
package consumer
