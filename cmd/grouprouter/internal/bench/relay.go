package bench

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/jsack"
	"github.com/grouprouter/grouprouter/internal/jspub"
	"github.com/grouprouter/grouprouter/router"
)

// Relay tuning: what a careful JetStream-to-JetStream relay does.
const (
	relayInFlight  = 1000 // publishes awaiting their PubAck, at most
	relayAckEvery  = 64   // confirmed messages per AckAll
	relayPullBatch = 1024 // messages per pull request
)

// relay is baseline (i), the limit of this design for routing: the
// router's work minus grouping, decisions and per-group ordering, written
// as a careful application would write a JetStream-to-JetStream relay.
//
//   - It reads the ingress with a durable pull consumer (AckAll, from
//     startSeq; replicated like the stream, so its position survives a
//     server), through a Consume callback pulling 1,024 messages at a time.
//   - It republishes every message onto node's queue subject, in a queue
//     stream of limits retention (limitsQueue: the router's work queue
//     writes a tombstone for every message consumed, which the relay need
//     not pay), with headers and body kept, Nats-Msg-Id from the ingress
//     sequence so that the queue stream drops a copy published twice, and
//     the ingress sequence in router.HeaderIngressSeq, as the router sets
//     it (package consumer orders a group's messages by it), asynchronously
//     pipelined with at most 1,000 publishes awaiting their PubAck (jspub:
//     one callback per publish, no goroutine or channel per message).
//   - It acks the ingress in delivery order: once 64 more messages have
//     their PubAck, in order, the latest of them is acked (AckAll acks
//     everything before it too), and when it has caught up (the last
//     delivery said nothing more is pending) as soon as everything
//     delivered is confirmed. A message is acked only after its copy is
//     stored: a crash re-delivers what was not, which the Msg-Id dedups.
//   - A failed publish is retried with the same Msg-Id after 100 ms.
type relay struct {
	node     string
	startSeq uint64
	log      *slog.Logger

	relayed atomic.Uint64 // messages published (acked or not)
	next    atomic.Uint64 // next ingress sequence to read
	errs    atomic.Uint64 // failed publishes (each retried)

	slots chan struct{} // one per publish awaiting its PubAck

	mu       sync.Mutex
	window   []relayEntry // delivered, not yet acked, in delivery order
	base     uint64       // delivery index of window[0]
	head     int          // window[:head] is confirmed and not acked yet
	caughtUp bool         // the latest delivery had nothing pending behind it
}

// relayEntry is a delivered ingress message and whether its copy is stored.
type relayEntry struct {
	msg  jetstream.Msg
	done bool
}

// run relays until ctx ends, calling ready once its consumer exists, and
// then waits (bounded) for the publishes in flight.
func (rl *relay) run(ctx context.Context, nc *nats.Conn, ready func()) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	pub, err := jspub.New(nc, 5*time.Second)
	if err != nil {
		return err
	}
	defer pub.Close()
	cfg := jetstream.ConsumerConfig{
		Durable:       "bench-relay-" + rl.node,
		AckPolicy:     jetstream.AckAllPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		// In flight, confirmed but not acked yet, and a pull batch.
		MaxAckPending: 4 * (relayInFlight + relayAckEvery + relayPullBatch),
		AckWait:       30 * time.Second,
	}
	if rl.startSeq > 1 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = rl.startSeq
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	cons, err := js.CreateOrUpdateConsumer(cctx, router.IngressStream, cfg)
	cancel()
	if err != nil {
		return fmt.Errorf("relay: ingress consumer: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteConsumer(dctx, router.IngressStream, cfg.Durable)
	}()
	rl.slots = make(chan struct{}, relayInFlight)
	prefix := router.QueueSubjectPrefix + rl.node + "."
	rl.next.Store(max(rl.startSeq, 1))
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		d, ok := jsack.Parse(msg.Reply())
		seq, pending := d.StreamSeq, d.Pending
		if !ok {
			meta, err := msg.Metadata()
			if err != nil {
				return
			}
			seq, pending = meta.Sequence.Stream, meta.NumPending
		}
		select {
		case rl.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		h := msg.Headers()
		hdr := make(nats.Header, len(h)+2)
		for k, v := range h {
			hdr[k] = v
		}
		seqText := strconv.FormatUint(seq, 10)
		hdr[jetstream.MsgIDHeader] = []string{router.IngressStream + ":" + seqText}
		hdr[router.HeaderIngressSeq] = []string{seqText}
		out := &nats.Msg{Subject: prefix + msg.Subject(), Header: hdr, Data: msg.Data()}
		rl.mu.Lock()
		idx := rl.base + uint64(len(rl.window))
		rl.window = append(rl.window, relayEntry{msg: msg})
		rl.caughtUp = pending == 0
		rl.mu.Unlock()
		rl.publish(ctx, pub, out, idx)
		rl.relayed.Add(1)
		rl.next.Store(seq + 1)
	}, jetstream.PullMaxMessages(relayPullBatch))
	if err != nil {
		return fmt.Errorf("relay: ingress: %w", err)
	}
	ready()
	<-ctx.Done()
	cc.Stop()
	deadline := time.Now().Add(5 * time.Second)
	for pub.Pending() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// publish sends out (the copy of the delivery at index idx) and, once
// stored, confirms it; a failure is retried after 100 ms.
func (rl *relay) publish(ctx context.Context, pub *jspub.Publisher, out *nats.Msg, idx uint64) {
	done := func(_ jspub.Ack, err error) {
		if err != nil {
			if n := rl.errs.Add(1); n&(n-1) == 0 {
				rl.log.Warn("relay publish failed, retrying", "err", err, "failures", n)
			}
			time.AfterFunc(100*time.Millisecond, func() {
				if ctx.Err() == nil {
					rl.publish(ctx, pub, out, idx)
				}
			})
			return
		}
		<-rl.slots
		rl.confirm(idx)
	}
	if err := pub.Publish(out, done); err != nil {
		done(jspub.Ack{}, err)
	}
}

// confirm marks the delivery at index idx stored and acks the confirmed
// prefix of the window every relayAckEvery messages, or at once when
// caught up.
func (rl *relay) confirm(idx uint64) {
	rl.mu.Lock()
	rl.window[idx-rl.base].done = true
	for rl.head < len(rl.window) && rl.window[rl.head].done {
		rl.head++
	}
	var ack jetstream.Msg
	if rl.head >= relayAckEvery || (rl.head > 0 && rl.head == len(rl.window) && rl.caughtUp) {
		ack = rl.window[rl.head-1].msg
		clear(rl.window[:rl.head])
		rl.window = rl.window[rl.head:] // append reallocates, copying only what is left
		rl.base += uint64(rl.head)
		rl.head = 0
	}
	rl.mu.Unlock()
	if ack != nil {
		_ = ack.Ack()
	}
}
