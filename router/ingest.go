package router

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"grouprouter/internal/jspub"
	"grouprouter/kvbinding"
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

// held is what the router keeps of an ingress message to republish it.
type held struct {
	hdr  nats.Header
	data []byte
	out  *nats.Msg // prepared when first needed (a node skips most messages)
}

// read consumes the ingress stream in order from the checkpoint.
func (r *Router) read(ctx context.Context) error {
	start := r.eng.resume.start()
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if start > 1 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = start
	}
	var cons jetstream.Consumer
	for attempt := 1; ; attempt++ {
		var err error
		cons, err = r.js.OrderedConsumer(ctx, IngressStream, cfg)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if attempt&(attempt-1) == 0 {
			r.log.Warn("ingress consumer not created, retrying", "err", err, "attempt", attempt)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(250 * time.Millisecond):
		}
	}
	// Short heartbeats: when the stream leader's server dies, the ordered
	// consumer is recreated after two missed heartbeats (the default expiry
	// of 30 s made that a ~30 s stall, measured).
	it, err := cons.Messages(jetstream.PullMaxMessages(1024), jetstream.PullExpiry(5*time.Second), jetstream.PullHeartbeat(time.Second))
	if err != nil {
		return fmt.Errorf("grouping: ingress: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	r.readerUp.Store(true)
	defer r.readerUp.Store(false)
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			r.log.Warn("ingress read error", "err", err)
			continue
		}
		r.ingest(msg)
	}
}

// ingest takes one ingress message, in stream order.
func (r *Router) ingest(msg jetstream.Msg) {
	seq, _, ok := ackSeqs(msg.Reply())
	if !ok {
		meta, err := msg.Metadata()
		if err != nil {
			r.log.Warn("ingress message without metadata", "err", err)
			return
		}
		seq = meta.Sequence.Stream
	}
	hdr := msg.Headers()
	subject := msg.Subject()
	group, invalid := r.classify(hdr, subject)
	m := &msgRec{seq: seq, subject: subject, size: len(msg.Data()) + len(subject) + headerSize(hdr), invalid: invalid}
	if v := hdr[HeaderGroupSeq]; len(v) > 0 && v[0] == "-1" {
		m.close = true
	}
	m.payload = &held{hdr: hdr, data: msg.Data()}

	r.mu.Lock()
	r.reading = true
	for !r.eng.closing && r.eng.full() {
		r.cond.Wait()
	}
	r.reading = false
	if r.eng.closing {
		r.mu.Unlock()
		return
	}
	r.eng.ingest(group, m, time.Now())
	acts := r.eng.take()
	r.mu.Unlock()
	r.perform(acts)
}

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

// ackSeqs reads the stream sequence and the pending count from a
// JetStream delivery's reply subject (see kvbinding).
func ackSeqs(reply string) (seq, pending uint64, ok bool) { return kvbinding.AckSeqs(reply) }

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

// GroupOf returns the group id a message's headers carry under name (""
// for none) and, when the message cannot be grouped, why: the value is not
// a valid group id, or the header is there several times (in different
// letter cases, or repeated) with different values. Every node reads the
// same answer from the same headers: NATS headers are case-sensitive, so a
// differently cased name counts as the same header, and when its copies
// disagree the message is dead-lettered instead of guessed at.
func GroupOf(h nats.Header, name string) (group, invalid string) {
	var (
		value string
		found bool
	)
	for k, vs := range h {
		if len(k) != len(name) || !equalFold(k, name) {
			continue
		}
		for _, v := range vs {
			if !found {
				value, found = v, true
				continue
			}
			if v != value {
				return "", fmt.Sprintf("%s header is present more than once with different values", name)
			}
		}
	}
	if !found {
		return "", ""
	}
	if err := kvbinding.ValidateGroupID(value); err != nil {
		return "", fmt.Sprintf("invalid %s header: %v", name, err)
	}
	return value, ""
}

func equalFold(a, b string) bool {
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// prepare builds the message to republish: body and headers kept, the
// producer's JetStream control headers renamed, dedup id from the ingress
// sequence. The subject is filled in when the destination is known.
func prepare(seq uint64, hdr nats.Header, data []byte) *nats.Msg {
	out := &nats.Msg{Header: make(nats.Header, len(hdr)+3), Data: data}
	for k, v := range hdr {
		if len(k) > 5 && equalFold(k[:5], "Nats-") {
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

// outMsg returns m's message to republish, preparing it on first use.
func outMsg(m *msgRec) *nats.Msg {
	h := m.payload.(*held)
	if h.out == nil {
		h.out = prepare(m.seq, h.hdr, h.data)
		h.hdr, h.data = nil, nil
	}
	return h.out
}

// publish carries out an actPublish: onto a node's queue, or onto the
// dead-letter stream with a reason. The outcome goes back to the engine.
func (r *Router) publish(a action) {
	out := outMsg(a.m)
	if a.dlq {
		r.toDeadLetter(out, a.m.subject, a.m.seq, a.reason)
	} else {
		out.Subject = QueueSubject(a.node, a.m.subject)
		out.Header[jetstream.ExpectedStreamHeader] = []string{QueueStream}
	}
	ln, m, dlq, reason := a.ln, a.m, a.dlq, a.reason
	done := func(_ jspub.Ack, err error) {
		if err == nil && !dlq {
			r.routed.Add(1)
		}
		r.do(func(e *engine, now time.Time) { e.acked(ln, m, dlq, reason, err, now) })
	}
	if err := r.pub.Publish(out, done); err != nil {
		done(jspub.Ack{}, err)
	}
}

// toDeadLetter addresses out, the prepared copy of the ingress message at
// seq on subject, to the dead-letter stream with reason.
func (r *Router) toDeadLetter(out *nats.Msg, subject string, seq uint64, reason string) {
	out.Subject = DeadLetterSubjectPrefix + subject
	if !r.fits(subject) {
		out.Subject = DeadLetterTooLong
		out.Header[HeaderOrigSubject] = []string{subject}
	}
	out.Header[HeaderDeadReason] = []string{reason}
	out.Header[jetstream.ExpectedStreamHeader] = []string{DeadLetterStream}
	out.Header[jetstream.MsgIDHeader] = []string{"dlq:" + IngressStream + ":" + strconv.FormatUint(seq, 10)}
}
