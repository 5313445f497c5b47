package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/jspub"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/wire"
)

// maxControlLine is nats-server's default limit on a protocol line: a
// publish's subject and reply subject must fit in it with the verb and the
// sizes, or the server closes the connection.
const maxControlLine = 4096

// controlLineMargin is what a publish line holds besides its subject: the
// verb, the reply subject (a publisher inbox, under 64 bytes) and sizes.
const controlLineMargin = 160

// DeadLetterTooLong is the dead-letter subject of messages whose subject is
// too long to republish (the original subject is in HeaderOrigSubject).
const DeadLetterTooLong = DeadLetterSubjectPrefix + "subject-too-long"

// held is an ingress message the router keeps to republish it: the
// message as received, whose headers are rewritten in place when it is
// first published (a node skips most messages: they are never touched).
type held struct {
	msg      *nats.Msg
	prepared bool
}

// read consumes the ingress stream in order from the checkpoint.
func (r *Router) read(ctx context.Context) error {
	rd := newIngressReader(r.js, IngressStream, r.cfg.JSDomain, r.log)
	rd.onCreated = func() { r.rs.up.Store(true) }
	rd.onReset = func(cause int) { r.rs.resets[cause].Add(1) }
	start, next := r.eng.readFrom()
	rd.onGap, rd.gapsFrom = r.rs.loss.note, next
	defer r.rs.loss.close()
	defer r.rs.up.Store(false)
	var recs []ingested
	return rd.run(ctx, start, func(batch []ingressMsg) {
		recs = r.ingest(batch, recs[:0])
		clear(recs)
	})
}

// ingested is an ingress message decoded for the engine.
type ingested struct {
	group string
	m     *msgRec
}

// ingest takes a batch of ingress messages, in stream order: it decodes
// them outside the router's lock, then hands them to the engine under one
// lock, waiting (lock released) while the node is full. recs is scratch
// space, returned for reuse.
func (r *Router) ingest(batch []ingressMsg, recs []ingested) []ingested {
	for _, in := range batch {
		msg := in.msg
		hdr := msg.Header
		group, invalid := r.classify(hdr, msg.Subject)
		hsize := headerSize(hdr)
		if hsize >= detachHeadersFrom && hsize > len(msg.Data)/2 {
			// The body shares its buffer with the headers as received,
			// which are also held decoded: a long group id would be held
			// twice, for as long as the message waits. The body alone is
			// kept (a copy, smaller than what it frees).
			msg.Data = slices.Clone(msg.Data)
		}
		m := &msgRec{seq: in.seq, subject: msg.Subject, size: len(msg.Data) + len(msg.Subject) + hsize, invalid: invalid}
		if v := hdr[HeaderGroupSeq]; len(v) > 0 && v[0] == "-1" {
			m.close = true
		}
		m.payload = &held{msg: msg}
		recs = append(recs, ingested{group: group, m: m})
	}
	now := time.Now()
	r.mu.Lock()
	for _, in := range recs {
		if r.eng.full() && !r.eng.stopping() {
			// Publish what this batch asked for before waiting: the
			// room waited for comes from their acks too.
			if acts := r.eng.take(); len(acts) > 0 {
				r.mu.Unlock()
				r.perform(acts)
				r.mu.Lock()
			}
			r.room.waiting = true
			waitFrom := time.Now()
			r.rs.fullSince.Store(waitFrom.UnixNano())
			for !r.eng.stopping() && r.eng.full() {
				r.room.cond.Wait()
			}
			r.room.waiting = false
			now = time.Now()
			r.rs.fullNanos.Add(int64(now.Sub(waitFrom)))
			r.rs.fullSince.Store(0)
		}
		if r.eng.stopping() {
			break
		}
		r.eng.step(inMsg{group: in.group, m: in.m}, now)
	}
	acts := r.eng.take()
	r.mu.Unlock()
	r.perform(acts)
	return recs
}

// detachHeadersFrom is the size of headers (headerSize) from which a held
// message keeps its body apart from the buffer it was received in, when
// the headers are also at least half the body's size (a long group id).
const detachHeadersFrom = 512

// classify returns the group a message is routed under and, when it
// cannot be grouped, why: its group id is unusable (GroupOf) or its subject
// is too long to republish. Such a message belongs to the ungrouped routing
// binding's node, which dead-letters it.
func (r *Router) classify(hdr nats.Header, subject string) (group, invalid string) {
	group, invalid = GroupOf(hdr, r.cfg.GroupHeader)
	if invalid == "" && !r.fits(subject) {
		return "", fmt.Sprintf("subject of %d bytes is too long to republish (at most %d)", len(subject), r.maxSubject())
	}
	return group, invalid
}

// headerSize is what a message's headers take on the wire, about.
func headerSize(h nats.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// maxSubject is the longest ingress subject the node can republish.
func (r *Router) maxSubject() int {
	return maxControlLine - controlLineMargin - len(QueueSubjectPrefix) - kvbinding.MaxNodeIDLen - 1
}

// fits reports whether an ingress subject can be republished onto any
// node's queue and the dead-letter stream.
func (r *Router) fits(subject string) bool { return len(subject) <= r.maxSubject() }

// GroupOf is wire.GroupOf.
func GroupOf(h nats.Header, name string) (group, invalid string) { return wire.GroupOf(h, name) }

// prepare builds the message to republish: body and headers kept, the
// producer's JetStream control headers renamed, dedup id from the ingress
// sequence. The subject is filled in when the destination is known.
func prepare(seq uint64, hdr nats.Header, data []byte) *nats.Msg {
	out := &nats.Msg{Header: make(nats.Header, len(hdr)+3), Data: data}
	for k, v := range hdr {
		if len(k) > 5 && strings.EqualFold(k[:5], "Nats-") {
			out.Header[HeaderOrigPrefix+k] = v
			continue
		}
		out.Header[k] = v
	}
	s := strconv.FormatUint(seq, 10)
	out.Header[jetstream.MsgIDHeader] = []string{IngressStream + ":" + s}
	out.Header[HeaderIngressSeq] = []string{s}
	return out
}

// outMsg returns the message of payload, the ingress message at seq, to
// republish, preparing it on first use: the
// received message itself, its headers rewritten as prepare does.
func outMsg(seq uint64, payload any) *nats.Msg {
	h := payload.(*held)
	if !h.prepared {
		prepareInPlace(seq, h.msg)
		h.prepared = true
	}
	return h.msg
}

// prepareInPlace turns msg, received from the ingress at seq, into the
// message prepare builds: the producer's JetStream control headers renamed,
// the dedup id and the ingress sequence added, the reply cleared.
func prepareInPlace(seq uint64, msg *nats.Msg) {
	if msg.Header == nil {
		msg.Header = make(nats.Header, 3)
	}
	for k, v := range msg.Header {
		if len(k) > 5 && strings.EqualFold(k[:5], "Nats-") {
			delete(msg.Header, k)
			msg.Header[HeaderOrigPrefix+k] = v
		}
	}
	id := IngressStream + ":" + strconv.FormatUint(seq, 10)
	vals := []string{id, id[len(IngressStream)+1:]}
	msg.Header[jetstream.MsgIDHeader] = vals[0:1:1]
	msg.Header[HeaderIngressSeq] = vals[1:2:2]
	msg.Reply, msg.Sub = "", nil
}

// publish carries out an actPublish: onto a node's queue, or onto the
// dead-letter stream with a reason. The outcome goes back to the engine.
func (r *Router) publish(a action) {
	// A message without its payload is spilled (the engine lets a body go
	// only from a message waiting for a decision): read it again first.
	if a.msg.payload == nil {
		r.fetchSpilled(a)
		return
	}
	out := outMsg(a.msg.seq, a.msg.payload)
	if a.dlq {
		out = r.toDeadLetter(out, a.msg.subject, a.msg.seq, a.reason, a.msg.stripped)
	} else {
		out.Subject = QueueSubject(a.node, a.msg.subject)
		if a.held {
			out.Subject = HeldSubject(a.node, a.group, a.msg.subject)
		}
		out.Header[jetstream.ExpectedStreamHeader] = r.out.expect
		out.Header[HeaderEpoch] = a.epoch
	}
	o := a.outcome()
	id := out.Header[jetstream.MsgIDHeader][0]
	lateCheck := !a.dlq && !a.held && a.group != ""
	done := func(ack jspub.Ack, err error) {
		o.err = refusal(err)
		o.seq = ack.Sequence
		if err == nil && !o.dlq {
			r.qcheck.stored(ack.Sequence, id)
		}
		if err == nil && ack.Duplicate && lateCheck && ack.Stream == QueueStream {
			r.laneDuplicate(o, out, a.epoch)
			return
		}
		r.out.outcomes.add(o)
	}
	if err := r.out.pub.Publish(out, done); err != nil {
		r.publishFailed(a, refusal(err))
	}
}

// outcome is the outcome of a publish the engine asked for (action.outcome
// makes it). Like the action, it carries copies and ids, not pointers into
// the engine: the shell makes it and fills it in without Router.mu, and
// the engine, under the lock, finds the lane by group and the message by
// its ingress sequence (engine.outcome).
type outcome struct {
	group string // the lane's (action.group)
	// ingress: the message's ingress sequence; a batch's first message's.
	ingress uint64
	batch   int // an atomic batch of that many of the lane's first messages
	dlq     bool
	reason  string
	err     error
	seq     uint64 // the PubAck's stream sequence (a batch's last)
	// stripped: the dead-letter copy went without its body (the servers
	// refused the whole one, or the ingress no longer held it: the shell
	// marked its copy, action.msg.stripped); the engine marks the message
	// so.
	stripped bool
	// payload: the message the shell published (action.msg.payload): for
	// a spilled one, read again, which the engine keeps on the message
	// for a retry.
	payload any
}

// outcome returns the outcome of a's publish (actPublish, actBatch), its
// result yet to fill in: the ids the engine finds the lane and the
// message(s) by, and the shell's marks on its copy of the message.
func (a *action) outcome() outcome {
	if a.kind == actBatch {
		return outcome{group: a.group, ingress: a.batch[0].seq, batch: len(a.batch)}
	}
	return outcome{group: a.group, ingress: a.msg.seq, dlq: a.dlq, reason: a.reason, stripped: a.msg.stripped, payload: a.msg.payload}
}

// ackBatch hands the engine the outcomes collected since the last batch,
// under one lock (the publisher calls it after a run of callbacks).
func (r *Router) ackBatch() {
	batch := r.out.outcomes.take()
	if len(batch) == 0 {
		return
	}
	r.outcomes(batch)
	r.out.outcomes.recycle(batch)
}

// queueOut is what publishes onto the queue: the pipelined publisher, the
// kind of a group's batches, the header every publish shares, the
// outcomes waiting for the engine and the count of messages routed.
type queueOut struct {
	pub *jspub.Publisher // opened by setup
	// fast: a group's batches are fast-ingest ones, not atomic
	// (queueBatch).
	fast bool
	// expect is the Nats-Expected-Stream value of every queue publish,
	// shared by them (nats.go only reads a header).
	expect []string
	// outcomes: publish outcomes waiting to be handed to the engine
	// (ackBatch).
	outcomes outcomeQueue
	routed   atomic.Uint64
}

// outcomeQueue collects the publishes' outcomes from the publisher's
// callbacks until ackBatch hands them to the engine, reusing one spare
// slice between batches.
type outcomeQueue struct {
	mu    sync.Mutex
	q     []outcome
	spare []outcome
}

func (oq *outcomeQueue) add(o outcome) {
	oq.mu.Lock()
	oq.q = append(oq.q, o)
	oq.mu.Unlock()
}

// take returns what was collected; recycle gives its slice back.
func (oq *outcomeQueue) take() []outcome {
	oq.mu.Lock()
	defer oq.mu.Unlock()
	batch := oq.q
	oq.q, oq.spare = oq.spare[:0], nil
	return batch
}

func (oq *outcomeQueue) recycle(batch []outcome) {
	clear(batch)
	oq.mu.Lock()
	if oq.spare == nil {
		oq.spare = batch[:0]
	}
	oq.mu.Unlock()
}

// outcomes counts what batch routed, warns of its failures, and hands it
// to the engine (inOutcomes).
func (r *Router) outcomes(batch []outcome) {
	stopping := r.life.stopping.Load()
	for _, o := range batch {
		switch {
		case o.batch > 0 && o.err == nil:
			r.out.routed.Add(uint64(o.batch))
		case o.batch > 0 && !stopping:
			r.warn.publish.Warn(o.group, "batch", o.batch, "err", o.err)
		case o.batch > 0:
		case o.err == nil && !o.dlq:
			r.out.routed.Add(1)
		case o.err != nil && !stopping && !errors.Is(o.err, errRefused):
			r.warn.publish.Warn(o.group, "ingress_seq", o.ingress, "dead_letter", o.dlq, "err", o.err)
		}
	}
	r.step(inOutcomes{batch: batch})
}

// refusal marks err as errRefused when retrying the publish cannot fix it.
func refusal(err error) error {
	var api *jspub.APIError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nats.ErrMaxPayload),
		errors.As(err, &api) && (api.ErrCode == jsErrMessageTooLarge || api.ErrCode == jsErrHeadersTooLarge):
		return fmt.Errorf("%w: %w", errRefused, err)
	}
	return err
}

// JetStream's error codes for a message a stream will never store.
const (
	jsErrMessageTooLarge = 10054 // message size exceeds maximum allowed
	jsErrHeadersTooLarge = 10097 // header size exceeds maximum allowed of 64k
)

// toDeadLetter addresses out, the prepared copy of the ingress message at
// seq on subject, to the dead-letter stream with reason. A stripped copy
// (the servers refused the whole one) keeps only the group id, the
// router's headers and the body's size: the original stays in the
// ingress at seq for its max age.
func (r *Router) toDeadLetter(out *nats.Msg, subject string, seq uint64, reason string, stripped bool) *nats.Msg {
	if stripped {
		h := nats.Header{}
		for _, k := range []string{jetstream.MsgIDHeader, HeaderIngressSeq} {
			h[k] = out.Header[k]
		}
		if g, invalid := GroupOf(out.Header, r.cfg.GroupHeader); g != "" && invalid == "" {
			h.Set(r.cfg.GroupHeader, g)
		}
		h.Set(HeaderBodyDropped, strconv.Itoa(len(out.Data)))
		out = &nats.Msg{Header: h}
	}
	out.Subject = DeadLetterSubjectPrefix + subject
	if !r.fits(subject) {
		out.Subject = DeadLetterTooLong
		out.Header[HeaderOrigSubject] = []string{subject}
	}
	out.Header[HeaderDeadReason] = []string{reason}
	out.Header[jetstream.ExpectedStreamHeader] = []string{DeadLetterStream}
	out.Header[jetstream.MsgIDHeader] = []string{"dlq:" + IngressStream + ":" + strconv.FormatUint(seq, 10)}
	return out
}

// maxFetches bounds the reads of spilled messages in flight.
const maxFetches = 64

// maxLateChecks bounds the lane duplicates looked at at once
// (laneDuplicate): after a restart that routes again from the checkpoint,
// each group that moved here once has its duplicates checked.
const maxLateChecks = 64

// spillFrom is the held bytes from which a node spills messages waiting
// for a decision (Config.MaxSpilledBytes): half of its held bytes, the
// other half left to the groups it routes. 0: never.
func spillFrom(c Config) int64 {
	if c.MaxSpilledBytes <= 0 {
		return 0
	}
	return max(c.MaxHeldBytes/2, 1)
}

// fetchSpilled reads a spilled message again from the ingress, then
// publishes it (on the action's payload, which the outcome hands to the
// engine: a retry publishes it as it is). It
// never blocks its caller (which may be the publisher's ack handler): at
// most maxFetches reads are in flight, the others wait in their
// goroutines (no more than the publishes in flight). A
// message the ingress no longer holds (expired or removed before it was
// routed) goes to the dead-letter stream without its body, with the
// reason.
func (r *Router) fetchSpilled(a action) {
	started := r.side.run(r.side.spilled, func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		msg, err := r.ingressMsg(ctx, a.msg.seq)
		switch {
		case err == nil:
			a.msg.payload = &held{msg: msg}
			r.publish(a)
		case errors.Is(err, jetstream.ErrMsgNotFound):
			// The dead letter names the group (the lane's), the rest is gone.
			hdr := nats.Header{}
			if a.group != "" {
				hdr.Set(r.cfg.GroupHeader, a.group)
			}
			a.msg.payload = &held{msg: &nats.Msg{Subject: a.msg.subject, Header: hdr}}
			if a.dlq {
				a.msg.stripped = true
				a.reason += "; the ingress no longer holds it (expired or removed before it was routed): stored without its body"
				r.publish(a)
				return
			}
			r.publishFailed(a, fmt.Errorf("%w: the ingress no longer holds message %d (expired or removed before it was routed)", errRefused, a.msg.seq))
		default:
			r.publishFailed(a, err) // retried after a pause, as any failed publish
		}
	})
	if !started {
		r.publishFailed(a, context.Canceled) // the node stops
	}
}

// laneDuplicate takes the outcome of a lane's publish that the queue
// stream took for a duplicate of the copy at o.seq. The copy is usually
// this node's own (an earlier attempt whose PubAck was lost, a restart
// routing again from its checkpoint). It can also be the group's previous
// owner's: a publish held by a partitioned link or a frozen server that
// landed on the old queue after the drain looked there, when this node
// read the ingress behind the old owner and so routes the message by its
// lane, not by its catch-up. That copy would be processed behind what the
// lane routes next, so it is moved here first (takeLateCopy, as the
// catch-up does); the lane has this one publish in flight, and its next
// waits for the outcome. Until the copy is moved the publish counts as
// failed and is retried (same Nats-Msg-Id: a duplicate again, checked
// again). Only a group whose record names a previous node is checked, at
// most maxLateChecks at once. Fast-ingest batches (R1) report no
// duplicates: see docs/protocol.md, "Remaining windows".
func (r *Router) laneDuplicate(o outcome, sent *nats.Msg, epoch []string) {
	if route, ok := r.cache.Lookup(o.group); ok && (route.PrevNode == "" || route.PrevNode == r.cfg.Node) {
		// No other node held the group before this binding: every copy
		// of its messages is this node's own (a node routing again from
		// its checkpoint after a restart meets many, and checks none).
		r.out.outcomes.add(o)
		return
	}
	started := r.side.run(r.side.late, func(ctx context.Context) {
		if err := r.takeLaneLateCopy(ctx, o.group, sent, o.seq, epoch); err != nil {
			o.err = fmt.Errorf("ingress message %d: the queue holds a copy this node has not moved onto its own queue yet: %w", o.ingress, err)
		}
		r.outcomes([]outcome{o})
	})
	if !started {
		o.err = context.Canceled // the node stops
		r.outcomes([]outcome{o})
	}
}

// takeLaneLateCopy moves the copy at seq of sent, a lane's publish of
// group's message under epoch, onto this node's queue if it is another
// node's (takeLateCopy). A record that no longer names this node under
// that epoch leaves it: the lane stops routing the group, and the group's
// next owner drains this node's queue.
func (r *Router) takeLaneLateCopy(ctx context.Context, group string, sent *nats.Msg, seq uint64, epoch []string) error {
	route, ok := r.cache.Lookup(group)
	if !ok || route.Node != r.cfg.Node || len(epoch) != 1 || strconv.FormatUint(route.Epoch, 10) != epoch[0] {
		return nil
	}
	stream, err := r.side.stream(ctx, QueueStream)
	if err != nil {
		return err
	}
	return r.ho.takeLateCopy(ctx, jsStore{stream}, group, route, sent, seq)
}

// publishFailed hands the engine a publish that failed before it was sent.
func (r *Router) publishFailed(a action, err error) {
	o := a.outcome()
	o.err = err
	r.outcomes([]outcome{o})
}

// ingressMsg reads the ingress message at seq (STREAM.MSG.GET: the
// stream allows no direct get), as the reader would have delivered it.
func (r *Router) ingressMsg(ctx context.Context, seq uint64) (*nats.Msg, error) {
	st, err := r.side.stream(ctx, IngressStream)
	if err != nil {
		return nil, err
	}
	raw, err := st.GetMsg(ctx, seq)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, nil
}

// readerStats is what the ingress reader reports, for the metrics and
// readiness (metrics.go, status.go).
type readerStats struct {
	up atomic.Bool // the ingress reader's iterator is open
	// fullNanos is how long the reader has waited for room (held bounds
	// reached: back-pressure); resets counts its consumer re-creations by
	// cause (resetCauses).
	fullNanos atomic.Int64
	fullSince atomic.Int64 // unix nanos the current wait began; 0: not waiting
	resets    [len(resetCauses)]atomic.Uint64
	loss      ingressLoss // ingress messages gone before the reader saw them (loss.go)
	// ingress caches the ingress stream's last sequence (metrics.go).
	ingress ingressInfo
}
