package router

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	dec := decoder{r.cfg.GroupHeader}
	for _, in := range batch {
		recs = append(recs, dec.decode(in))
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

// decoder decodes ingress messages for the engine. groupHeader names
// the header that carries a message's group id.
type decoder struct{ groupHeader string }

// decode returns the engine's record of in, with the group it is routed
// under (classify).
func (d decoder) decode(in ingressMsg) ingested {
	msg := in.msg
	hdr := msg.Header
	group, invalid := d.classify(hdr, msg.Subject)
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
	return ingested{group: group, m: m}
}

// classify returns the group a message is routed under and, when it
// cannot be grouped, why: its group id is unusable (GroupOf) or its subject
// is too long to republish. Such a message belongs to the ungrouped routing
// binding's node, which dead-letters it.
func (d decoder) classify(hdr nats.Header, subject string) (group, invalid string) {
	group, invalid = GroupOf(hdr, d.groupHeader)
	if invalid == "" && !fits(subject) {
		return "", fmt.Sprintf("subject of %d bytes is too long to republish (at most %d)", len(subject), maxSubject)
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

// maxSubject is the longest ingress subject a node can republish.
const maxSubject = maxControlLine - controlLineMargin - len(QueueSubjectPrefix) - kvbinding.MaxNodeIDLen - 1

// fits reports whether an ingress subject can be republished onto any
// node's queue and the dead-letter stream.
func fits(subject string) bool { return len(subject) <= maxSubject }

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
