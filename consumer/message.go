package consumer

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
)

// Handler processes one message. It is called for one message of a group
// at a time, in ingress order, and for many groups at once. Returning nil
// acknowledges the message; an error retries it after a backoff, and a
// Terminal error (or the last attempt) parks it with the later messages of
// its group. ctx ends when Consume stops past its drain bound, or with
// cause ErrStale (context.Cause) when the group moved to a newer epoch.
type Handler func(ctx context.Context, msg *Message) error

// Message is a queued message as a Handler sees it. The handler must not
// keep it past its return.
type Message struct {
	// Subject is the subject the producer published on.
	Subject string
	// Header holds the producer's headers and the router's.
	Header nats.Header
	// Data is the body.
	Data []byte
	// Group is the group id ("" for a message without one).
	Group string
	// IngressSeq is the message's sequence in the ingress stream: it
	// orders a group's messages and identifies the message.
	IngressSeq uint64
	// Epoch is the group's epoch when the message was queued (0 when the
	// router did not set one): the revision of the binding that made this
	// node the group's owner. It only grows.
	Epoch uint64
	// Fence orders this message's effects against any other copy's:
	// store it with the effect and write only if the stored one is lower.
	Fence Fence
	// Redelivered is true when JetStream delivered the message before,
	// to this process or another (that one may have processed it in part),
	// and on a copy moved from a node whose consumer had been delivered it
	// and stalled (wire.HeaderDeliveredBefore).
	Redelivered bool
	// Attempt counts this process's tries of the message, from 1.
	Attempt int
	// Closing is true on a message that closes its group (Group-Seq: -1).
	Closing bool
	// Replayed is true on a message replayed from the parked stream after
	// an operator's retry, skip or release.
	Replayed bool
}

// Fence is a message's fencing token: (Epoch, IngressSeq), ordered by
// epoch first. An application that keeps the highest fence it applied for
// a group, and refuses a write whose fence is not higher, never lets a
// stale copy (made before a move) overwrite the current owner's effects.
type Fence struct {
	Epoch      uint64
	IngressSeq uint64
}

// Less reports whether f orders before g.
func (f Fence) Less(g Fence) bool {
	if f.Epoch != g.Epoch {
		return f.Epoch < g.Epoch
	}
	return f.IngressSeq < g.IngressSeq
}

// String returns "<epoch>:<ingress seq>", zero-padded to 20 digits each
// so that the strings sort as the fences do.
func (f Fence) String() string { return fmt.Sprintf("%020d:%020d", f.Epoch, f.IngressSeq) }
