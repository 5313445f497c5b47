package router

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/grouprouter/grouprouter/internal/jspub"
	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// publisher is the publishing shell, a room of its own: it carries out
// the engine's publishes (a message onto a node's queue, its held subject
// or the dead-letter stream; a group's batch), reads a spilled message
// again first, and hands their outcomes back through step, a run of
// PubAcks at a time. It reaches the servers through out and its side
// reads, the rest of its node only through the functions below;
// Router.newPublisher wires it, setup opens its sender. The simulation
// runs it on stand-ins of both (sim_shell_test.go).
type publisher struct {
	node        string
	groupHeader string
	out         sender // opened by setup
	// fast: a group's batches are fast-ingest ones, not atomic
	// (Router.queueBatch).
	fast bool
	// expect is the Nats-Expected-Stream value of every queue publish,
	// shared by them (nats.go only reads a header).
	expect []string
	// pending: publish outcomes waiting to be handed to the engine
	// (ackBatch).
	pending outcomeQueue
	routed  atomic.Uint64 // messages stored on a queue
	warn    *logagg.Warner
	// stopping is set when the engine is told to stop: publish outcomes
	// then fail without a warning.
	stopping *atomic.Bool

	// The side reads (sidereads.go): spilled runs a read of a spilled
	// message's body, late one of the stored copy a lane publish was
	// taken for a duplicate of, each in a goroutine of its own, bounded
	// per kind (maxFetches, maxLateChecks); false once the node stops.
	// store returns a stream's stored messages.
	spilled, late func(read func(ctx context.Context)) bool
	store         func(ctx context.Context, stream string) (msgStore, error)

	// The engine's door, and the rest of the node.
	step         func(input)
	stored       func(seq uint64, id string)                  // the store check of the queue
	lookup       func(group string) (kvbinding.Binding, bool) // the binding cache
	takeLateCopy func(ctx context.Context, s msgStore, group string, route kvbinding.Binding, sent *nats.Msg, seq uint64) error
}

// newPublisher wires the node's publishing shell (its publisher is opened
// by setup).
func (r *Router) newPublisher() *publisher {
	return &publisher{
		node: r.cfg.Node, groupHeader: r.cfg.GroupHeader,
		expect: []string{QueueStream}, warn: r.warn.publish, stopping: &r.life.stopping,
		spilled: func(read func(context.Context)) bool { return r.side.run(r.side.spilled, read) },
		late:    func(read func(context.Context)) bool { return r.side.run(r.side.late, read) },
		store:   r.side.store,
		step:    r.step,
		stored:  func(seq uint64, id string) { r.qcheck.stored(seq, id) },
		lookup:  func(group string) (kvbinding.Binding, bool) { return r.cache.Lookup(group) },
		takeLateCopy: func(ctx context.Context, s msgStore, group string, route kvbinding.Binding, sent *nats.Msg, seq uint64) error {
			return r.ho.takeLateCopy(ctx, s, group, route, sent, seq)
		},
	}
}

// publish carries out an actPublish: onto a node's queue, or onto the
// dead-letter stream with a reason. The outcome goes back to the engine.
func (p *publisher) publish(a action) {
	// A message without its payload is spilled (the engine lets a body go
	// only from a message waiting for a decision): read it again first.
	if a.msg.payload == nil {
		p.fetchSpilled(a)
		return
	}
	out := outMsg(a.msg.seq, a.msg.payload)
	if a.dlq {
		out = p.toDeadLetter(out, a.msg.subject, a.msg.seq, a.reason, a.msg.stripped)
	} else {
		out.Subject = QueueSubject(a.node, a.msg.subject)
		if a.held {
			out.Subject = HeldSubject(a.node, a.group, a.msg.subject)
		}
		out.Header[jetstream.ExpectedStreamHeader] = p.expect
		out.Header[HeaderEpoch] = a.epoch
	}
	o := a.outcome()
	id := out.Header[jetstream.MsgIDHeader][0]
	lateCheck := !a.dlq && !a.held && a.group != ""
	done := func(ack jspub.Ack, err error) {
		o.err = refusal(err)
		o.seq = ack.Sequence
		if err == nil && !o.dlq {
			p.stored(ack.Sequence, id)
		}
		if err == nil && ack.Duplicate && lateCheck && ack.Stream == QueueStream {
			p.laneDuplicate(o, out, a.epoch)
			return
		}
		p.pending.add(o)
	}
	if err := p.out.Publish(out, done); err != nil {
		p.publishFailed(a, refusal(err))
	}
}

// sender is what the publisher sends with: JetStream's pipelined publisher
// (a callback per PubAck, then the batch end, ackBatch), and the
// connection for the messages of an atomic batch before its commit, which
// ask for no reply.
type sender interface {
	Publish(m *nats.Msg, cb jspub.Callback) error
	PublishBatch(ms []*nats.Msg, cb jspub.Callback) error
	PublishMsg(m *nats.Msg) error
}

// jsSender is sender on a connection and its pipelined publisher.
type jsSender struct {
	*jspub.Publisher
	nc *nats.Conn
}

func (s jsSender) PublishMsg(m *nats.Msg) error { return s.nc.PublishMsg(m) }

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
func (p *publisher) ackBatch() {
	batch := p.pending.take()
	if len(batch) == 0 {
		return
	}
	p.outcomes(batch)
	p.pending.recycle(batch)
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
func (p *publisher) outcomes(batch []outcome) {
	stopping := p.stopping.Load()
	for _, o := range batch {
		switch {
		case o.batch > 0 && o.err == nil:
			p.routed.Add(uint64(o.batch))
		case o.batch > 0 && !stopping:
			p.warn.Warn(o.group, "batch", o.batch, "err", o.err)
		case o.batch > 0:
		case o.err == nil && !o.dlq:
			p.routed.Add(1)
		case o.err != nil && !stopping && !errors.Is(o.err, errRefused):
			p.warn.Warn(o.group, "ingress_seq", o.ingress, "dead_letter", o.dlq, "err", o.err)
		}
	}
	p.step(inOutcomes{batch: batch})
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

// toDeadLetter returns the dead-letter copy, with reason, of out, the
// prepared copy of the ingress message at seq on subject. out itself is
// left as it is: the engine may route the message after all (its
// dead-letter record refused), and its queue copy keeps its own id. A
// stripped copy (the servers refused the whole one) keeps only the group
// id, the router's headers and the body's size: the original stays in
// the ingress at seq for its max age.
func (p *publisher) toDeadLetter(out *nats.Msg, subject string, seq uint64, reason string, stripped bool) *nats.Msg {
	if !stripped {
		h := make(nats.Header, len(out.Header)+4)
		maps.Copy(h, out.Header)
		out = &nats.Msg{Header: h, Data: out.Data}
	} else {
		h := nats.Header{}
		for _, k := range []string{jetstream.MsgIDHeader, HeaderIngressSeq} {
			h[k] = out.Header[k]
		}
		if g, invalid := GroupOf(out.Header, p.groupHeader); g != "" && invalid == "" {
			h.Set(p.groupHeader, g)
		}
		h.Set(HeaderBodyDropped, strconv.Itoa(len(out.Data)))
		out = &nats.Msg{Header: h}
	}
	out.Subject = DeadLetterSubjectPrefix + subject
	if !fits(subject) {
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
func (p *publisher) fetchSpilled(a action) {
	started := p.spilled(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		msg, err := p.ingressMsg(ctx, a.msg.seq)
		switch {
		case err == nil:
			a.msg.payload = &held{msg: msg}
			p.publish(a)
		case errors.Is(err, jetstream.ErrMsgNotFound):
			// The dead letter names the group (the lane's), the rest is gone.
			hdr := nats.Header{}
			if a.group != "" {
				hdr.Set(p.groupHeader, a.group)
			}
			a.msg.payload = &held{msg: &nats.Msg{Subject: a.msg.subject, Header: hdr}}
			if a.dlq {
				a.msg.stripped = true
				a.reason += "; the ingress no longer holds it (expired or removed before it was routed): stored without its body"
				p.publish(a)
				return
			}
			p.publishFailed(a, fmt.Errorf("%w: the ingress no longer holds message %d (expired or removed before it was routed)", errRefused, a.msg.seq))
		default:
			p.publishFailed(a, err) // retried after a pause, as any failed publish
		}
	})
	if !started {
		p.publishFailed(a, context.Canceled) // the node stops
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
func (p *publisher) laneDuplicate(o outcome, sent *nats.Msg, epoch []string) {
	if route, ok := p.lookup(o.group); ok && (route.PrevNode == "" || route.PrevNode == p.node) {
		// No other node held the group before this binding: every copy
		// of its messages is this node's own (a node routing again from
		// its checkpoint after a restart meets many, and checks none).
		p.pending.add(o)
		return
	}
	started := p.late(func(ctx context.Context) {
		if err := p.takeLaneLateCopy(ctx, o.group, sent, o.seq, epoch); err != nil {
			o.err = fmt.Errorf("ingress message %d: the queue holds a copy this node has not moved onto its own queue yet: %w", o.ingress, err)
		}
		p.outcomes([]outcome{o})
	})
	if !started {
		o.err = context.Canceled // the node stops
		p.outcomes([]outcome{o})
	}
}

// takeLaneLateCopy moves the copy at seq of sent, a lane's publish of
// group's message under epoch, onto this node's queue if it is another
// node's (takeLateCopy). A record that no longer names this node under
// that epoch leaves it: the lane stops routing the group, and the group's
// next owner drains this node's queue.
func (p *publisher) takeLaneLateCopy(ctx context.Context, group string, sent *nats.Msg, seq uint64, epoch []string) error {
	route, ok := p.lookup(group)
	if !ok || route.Node != p.node || len(epoch) != 1 || strconv.FormatUint(route.Epoch, 10) != epoch[0] {
		return nil
	}
	queue, err := p.store(ctx, QueueStream)
	if err != nil {
		return err
	}
	return p.takeLateCopy(ctx, queue, group, route, sent, seq)
}

// publishFailed hands the engine a publish that failed before it was sent.
func (p *publisher) publishFailed(a action, err error) {
	o := a.outcome()
	o.err = err
	p.outcomes([]outcome{o})
}

// ingressMsg reads the ingress message at seq (STREAM.MSG.GET: the
// stream allows no direct get), as the reader would have delivered it.
func (p *publisher) ingressMsg(ctx context.Context, seq uint64) (*nats.Msg, error) {
	st, err := p.store(ctx, IngressStream)
	if err != nil {
		return nil, err
	}
	raw, err := st.get(ctx, seq)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, nil
}

// publishBatch carries out an actBatch: the lane's first messages onto the
// node's queue as one atomic batch. Only the commit asks for a reply; the
// outcome of the whole batch goes back to the engine. A message's batch
// headers are removed once it is sent (the commit's are a copy's): should
// the batch fail, it is sent again alone.
func (p *publisher) publishBatch(a action) {
	if p.fast {
		p.publishFastBatch(a)
		return
	}
	id := nuid.Next()
	o := a.outcome()
	last := len(a.batch) - 1
	for i, m := range a.batch[:last] {
		out := p.queueMsg(m, a)
		out.Header[headerBatchID] = []string{id}
		out.Header[headerBatchSeq] = []string{strconv.Itoa(i + 1)}
		out.Reply = "" // only the commit is answered
		err := p.out.PublishMsg(out)
		delete(out.Header, headerBatchID)
		delete(out.Header, headerBatchSeq)
		if err != nil {
			// The batch has no commit: the servers drop it after their
			// batch timeout; the engine sends its messages alone.
			p.batchNotSent(o, err)
			return
		}
	}
	// The commit goes as a copy with headers of its own: its outcome may
	// come back before Publish returns, and the engine may then send the
	// message again alone from another goroutine, so the message is not
	// touched once the commit is sent.
	out := p.queueMsg(a.batch[last], a)
	h := make(nats.Header, len(out.Header)+3)
	for k, v := range out.Header {
		h[k] = v
	}
	h[headerBatchID] = []string{id}
	h[headerBatchSeq] = []string{strconv.Itoa(last + 1)}
	h[headerBatchCommit] = []string{"1"}
	commit := &nats.Msg{Subject: out.Subject, Header: h, Data: out.Data}
	err := p.out.Publish(commit, p.batchDone(o, h[jetstream.MsgIDHeader][0]))
	if err != nil {
		p.batchNotSent(o, err)
	}
}

// batchDone returns the callback of a batch's PubAck: the outcome goes to
// the engine with the publisher's next batch end (ackBatch), and a stored
// batch's last message, msgID, is the queue tail this node knows of
// (Sequence 0, a fast-ingest batch of duplicates only, changes nothing).
func (p *publisher) batchDone(o outcome, msgID string) jspub.Callback {
	return func(ack jspub.Ack, err error) {
		o.err = refusal(err)
		o.seq = ack.Sequence
		if err == nil {
			p.stored(ack.Sequence, msgID)
		}
		p.pending.add(o)
	}
}

// batchNotSent hands the engine a batch that could not be sent whole.
func (p *publisher) batchNotSent(o outcome, err error) {
	o.err = err
	p.outcomes([]outcome{o})
}

// publishFastBatch carries out an actBatch on a stream of one replica: the
// lane's first messages as one fast-ingest batch (jspub.PublishBatch), one
// PubAck for all of them. A batch that ends short may have stored a prefix
// of its messages, never one after a gap: the engine sends them again one
// at a time, and each stored one is dropped then as a duplicate of its
// Nats-Msg-Id (the queue stream's duplicate window), so the group's order
// and its exactly-once hold.
func (p *publisher) publishFastBatch(a action) {
	o := a.outcome()
	msgs := make([]*nats.Msg, len(a.batch))
	for i, m := range a.batch {
		msgs[i] = p.queueMsg(m, a)
	}
	if err := p.out.PublishBatch(msgs, p.batchDone(o, msgs[len(msgs)-1].Header[jetstream.MsgIDHeader][0])); err != nil {
		p.batchNotSent(o, err)
	}
}

// queueMsg returns m's message addressed to a's node's queue.
func (p *publisher) queueMsg(m pubMsg, a action) *nats.Msg {
	out := outMsg(m.seq, m.payload)
	out.Subject = QueueSubject(a.node, m.subject)
	if a.held {
		out.Subject = HeldSubject(a.node, a.group, m.subject)
	}
	out.Header[jetstream.ExpectedStreamHeader] = p.expect
	out.Header[HeaderEpoch] = a.epoch
	return out
}
