// Package jspub publishes to JetStream asynchronously with a completion
// callback per message: it pipelines publishes over one connection and
// reports each PubAck (or error, or timeout) without a goroutine per message.
package jspub

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// ErrTimeout is reported when no PubAck arrived within the timeout. The
// message may or may not be stored: publish it again with the same
// Nats-Msg-Id to be sure.
var ErrTimeout = errors.New("jspub: publish ack timed out")

// ErrNoResponders is reported when no stream listens on the subject
// (usually a stream leader election in progress).
var ErrNoResponders = errors.New("jspub: no stream responded")

// APIError is a JetStream error returned in a PubAck.
type APIError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

func (e *APIError) Error() string {
	return fmt.Sprintf("jetstream: %s (code %d, err_code %d)", e.Description, e.Code, e.ErrCode)
}

// Ack is a successful publish.
type Ack struct {
	Stream    string `json:"stream"`
	Sequence  uint64 `json:"seq"`
	Duplicate bool   `json:"duplicate,omitempty"`
}

// Callback receives the outcome of one publish. It runs on the publisher's
// reply goroutine (or its timeout sweeper) and must not block for long.
type Callback func(ack Ack, err error)

type pending struct {
	cb       Callback
	deadline time.Time
	// Fast-ingest batches (PublishBatch): the messages sent, and the
	// first failure reported before the batch's PubAck.
	batch  int
	failed error
}

// Publisher pipelines JetStream publishes. It is safe for concurrent use.
type Publisher struct {
	nc       *nats.Conn
	prefix   string
	uid      string // unique to this publisher: starts each batch id
	timeout  time.Duration
	sub      *nats.Subscription
	batchEnd func()
	run      int // callbacks since the last batch end (reply goroutine only)

	mu      sync.Mutex
	next    uint64
	pending map[uint64]pending

	stop chan struct{}
	done chan struct{}
}

// Option configures a Publisher.
type Option func(*Publisher)

// WithBatchEnd has fn called after a run of callbacks: on the reply
// goroutine after a callback when no further reply waits in the
// subscription, and after the callbacks of timed-out publishes (from the
// sweeper or Close). A caller whose callbacks only collect outcomes can
// process them there, as a batch. fn may run on two goroutines at once.
func WithBatchEnd(fn func()) Option { return func(p *Publisher) { p.batchEnd = fn } }

// New starts a publisher whose acks time out after timeout.
func New(nc *nats.Conn, timeout time.Duration, opts ...Option) (*Publisher, error) {
	p := &Publisher{
		nc:      nc,
		prefix:  nats.InboxPrefix, // "_INBOX."
		timeout: timeout,
		pending: make(map[uint64]pending),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	for _, o := range opts {
		o(p)
	}
	if custom := nc.Opts.InboxPrefix; custom != "" {
		// A custom prefix (nats.CustomInboxPrefix) has no trailing dot:
		// replies go to <prefix>.<id>..., as the connection's own inboxes.
		p.prefix = custom + "."
	}
	p.uid = nuid.Next()
	p.prefix += p.uid + "."
	// One token after the prefix: a publish's id; more: a batch's
	// message (PublishBatch).
	sub, err := nc.Subscribe(p.prefix+">", p.onReply)
	if err != nil {
		return nil, fmt.Errorf("jspub: subscribe: %w", err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	p.sub = sub
	go p.sweep()
	return p, nil
}

// Publish sends msg (whose Reply it overwrites) and calls cb once with the
// outcome. An error from Publish itself means cb will not be called.
func (p *Publisher) Publish(msg *nats.Msg, cb Callback) error {
	p.mu.Lock()
	p.next++
	id := p.next
	p.pending[id] = pending{cb: cb, deadline: time.Now().Add(p.timeout)}
	p.mu.Unlock()
	msg.Reply = p.prefix + strconv.FormatUint(id, 10)
	if err := p.nc.PublishMsg(msg); err != nil {
		p.mu.Lock()
		delete(p.pending, id)
		p.mu.Unlock()
		return err
	}
	return nil
}

// Fast-ingest batches (nats-server 2.14+, a stream with allow_batched):
// each message's reply subject names the batch, its sequence in the batch
// and its operation, <prefix><id>.<flow>.fail.<seq>.<op>.$FI. The server
// stores the messages as they come, in order; with gap mode "fail" it ends
// the batch at the first message it cannot store (or a missing one) and
// its PubAck counts the messages stored, duplicates included.
const (
	fastBatchStart  = "0"
	fastBatchAppend = "1"
	fastBatchCommit = "2"
)

// ErrBatchIncomplete is reported when a fast-ingest batch ended before its
// last message: a prefix of it may be stored. Publish its messages again,
// each with its Nats-Msg-Id, to be sure.
var ErrBatchIncomplete = errors.New("jspub: batch not stored whole")

// PublishBatch sends msgs (at least 2, their Reply overwritten) as one
// fast-ingest batch with gap mode "fail", and calls cb once: with the
// commit's PubAck (Sequence is the last message's, or 0 when every message
// was a duplicate) when all of them are stored, else with an error that
// wraps ErrBatchIncomplete (and the server's error, if it gave one) or is
// ErrTimeout. On an error a prefix of msgs may be stored; nothing after a
// message that was not. Flow-control acknowledgements are not waited for: a batch is small
// (the server sends one every min(500, len(msgs)) messages at first).
// An error from PublishBatch itself means cb will not be called; some of
// msgs may have been sent.
func (p *Publisher) PublishBatch(msgs []*nats.Msg, cb Callback) error {
	if len(msgs) < 2 {
		return errors.New("jspub: a batch needs at least 2 messages")
	}
	p.mu.Lock()
	p.next++
	id := p.next
	p.pending[id] = pending{cb: cb, deadline: time.Now().Add(p.timeout), batch: len(msgs)}
	p.mu.Unlock()
	base := p.prefix + p.uid + strconv.FormatUint(id, 10) + "." + strconv.Itoa(len(msgs)) + ".fail."
	last := len(msgs) - 1
	for i, m := range msgs {
		op := fastBatchAppend
		switch i {
		case 0:
			op = fastBatchStart
		case last:
			op = fastBatchCommit
		}
		m.Reply = base + strconv.Itoa(i+1) + "." + op + ".$FI"
		if err := p.nc.PublishMsg(m); err != nil {
			p.mu.Lock()
			delete(p.pending, id)
			p.mu.Unlock()
			return err
		}
	}
	return nil
}

// Pending returns the number of publishes awaiting an outcome.
func (p *Publisher) Pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

// Close stops the publisher; outstanding publishes are reported as ErrTimeout.
func (p *Publisher) Close() {
	select {
	case <-p.stop:
		return
	default:
	}
	close(p.stop)
	<-p.done
	_ = p.sub.Unsubscribe()
	p.mu.Lock()
	rest := p.pending
	p.pending = map[uint64]pending{}
	p.mu.Unlock()
	for _, pd := range rest {
		pd.cb(Ack{}, ErrTimeout)
	}
	if p.batchEnd != nil && len(rest) > 0 {
		p.batchEnd()
	}
}

func (p *Publisher) onReply(m *nats.Msg) {
	rest := m.Subject[len(p.prefix):]
	if i := strings.IndexByte(rest, '.'); i >= 0 {
		p.onBatchReply(rest[:i], m)
	} else if id, err := strconv.ParseUint(rest, 10, 64); err == nil {
		p.mu.Lock()
		pd, ok := p.pending[id]
		if ok {
			delete(p.pending, id)
		}
		p.mu.Unlock()
		if ok { // else timed out already
			pd.cb(ParseAck(m))
			p.run++
		}
	}
	if p.batchEnd != nil && p.run > 0 {
		// nats.go counts the message being handled as pending until its
		// callback returns: 1 means no other reply is waiting.
		if n, _, err := p.sub.Pending(); err != nil || n <= 1 || p.run >= maxRun {
			p.run = 0
			p.batchEnd()
		}
	}
}

// onBatchReply takes a reply to a fast-ingest batch's message: a flow
// acknowledgement (ignored), a gap or an error report (kept: the batch is
// not stored whole), or the PubAck that ends the batch.
func (p *Publisher) onBatchReply(token string, m *nats.Msg) {
	if !strings.HasPrefix(token, p.uid) {
		return
	}
	id, err := strconv.ParseUint(token[len(p.uid):], 10, 64)
	if err != nil {
		return
	}
	kind, ack, err := parseBatchReply(m)
	p.mu.Lock()
	pd, ok := p.pending[id]
	switch {
	case !ok:
	case kind == batchFlow:
		ok = false
	case kind == batchTrouble:
		if pd.failed == nil {
			pd.failed = err
			p.pending[id] = pd
		}
		ok = false
	default:
		delete(p.pending, id)
	}
	p.mu.Unlock()
	if !ok {
		return
	}
	switch {
	case err != nil:
		err = fmt.Errorf("%w: %w", ErrBatchIncomplete, err)
	case pd.failed != nil:
		err = fmt.Errorf("%w: %w", ErrBatchIncomplete, pd.failed)
	case ack.count != pd.batch:
		err = fmt.Errorf("%w: %d of %d messages stored", ErrBatchIncomplete, ack.count, pd.batch)
	}
	if err != nil {
		pd.cb(Ack{}, err)
	} else {
		pd.cb(ack.Ack, nil)
	}
	p.run++
}

// The kinds of reply to a batch's message.
const (
	batchEnd     = iota // the PubAck (or error) that ends the batch
	batchFlow           // a flow-control acknowledgement
	batchTrouble        // a gap or a message's error: the batch ends short
)

type batchAck struct {
	Ack
	count int
}

// parseBatchReply decodes a reply to a fast-ingest batch's message.
func parseBatchReply(m *nats.Msg) (int, batchAck, error) {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return batchEnd, batchAck{}, ErrNoResponders
	}
	var r struct {
		Type      string    `json:"type"`
		Stream    string    `json:"stream"`
		Sequence  uint64    `json:"seq"`
		LastSeq   uint64    `json:"last_seq"`
		Duplicate bool      `json:"duplicate"`
		Count     int       `json:"count"`
		Error     *APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return batchEnd, batchAck{}, fmt.Errorf("jspub: bad batch reply: %w", err)
	}
	switch r.Type {
	case "ack":
		return batchFlow, batchAck{}, nil
	case "gap":
		return batchTrouble, batchAck{}, fmt.Errorf("message %d of the batch came when %d was expected", r.Sequence, r.LastSeq)
	case "err":
		if r.Error == nil {
			return batchTrouble, batchAck{}, fmt.Errorf("message %d of the batch refused", r.Sequence)
		}
		return batchTrouble, batchAck{}, fmt.Errorf("message %d of the batch refused: %w", r.Sequence, r.Error)
	case "":
	default:
		return batchFlow, batchAck{}, nil // a later kind of report: the PubAck still ends the batch
	}
	if r.Error != nil {
		return batchEnd, batchAck{}, r.Error
	}
	if r.Stream == "" {
		return batchEnd, batchAck{}, fmt.Errorf("jspub: bad batch ack %q", m.Data)
	}
	return batchEnd, batchAck{Ack: Ack{Stream: r.Stream, Sequence: r.Sequence, Duplicate: r.Duplicate}, count: r.Count}, nil
}

// maxRun bounds a run of callbacks between two batch ends, so that a
// steady stream of replies is processed as it comes.
const maxRun = 256

// ParseAck decodes a JetStream publish reply.
func ParseAck(m *nats.Msg) (Ack, error) {
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return Ack{}, ErrNoResponders
	}
	if ack, ok := parseAckFast(m.Data); ok {
		return ack, nil
	}
	var r struct {
		Ack
		Error *APIError `json:"error,omitempty"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return Ack{}, fmt.Errorf("jspub: bad ack: %w", err)
	}
	if r.Error != nil {
		return Ack{}, r.Error
	}
	if r.Stream == "" || r.Sequence == 0 {
		return Ack{}, fmt.Errorf("jspub: bad ack %q", m.Data)
	}
	return r.Ack, nil
}

func (p *Publisher) sweep() {
	defer close(p.done)
	period := p.timeout / 4
	if period < 10*time.Millisecond {
		period = 10 * time.Millisecond
	}
	t := time.NewTicker(period)
	defer t.Stop()
	var expired []Callback
	for {
		select {
		case <-p.stop:
			return
		case now := <-t.C:
			p.mu.Lock()
			for id, pd := range p.pending {
				if now.After(pd.deadline) {
					delete(p.pending, id)
					expired = append(expired, pd.cb)
				}
			}
			p.mu.Unlock()
			for i, cb := range expired {
				cb(Ack{}, ErrTimeout)
				expired[i] = nil
			}
			if p.batchEnd != nil && len(expired) > 0 {
				p.batchEnd()
			}
			expired = expired[:0]
		}
	}
}

// parseAckFast decodes the common success reply,
// {"stream":"NAME","seq":N} optionally with "domain" and "duplicate":true,
// without reflection. It returns false for anything else (errors included),
// which the caller then decodes with encoding/json.
func parseAckFast(b []byte) (Ack, bool) {
	if bytes.Contains(b, []byte(`"error"`)) {
		return Ack{}, false
	}
	var a Ack
	i := bytes.Index(b, []byte(`"stream":"`))
	if i < 0 {
		return Ack{}, false
	}
	rest := b[i+len(`"stream":"`):]
	j := bytes.IndexByte(rest, '"')
	if j <= 0 {
		return Ack{}, false
	}
	for _, c := range rest[:j] {
		if c < 0x21 || c > 0x7e || c == '\\' { // stream names are printable ASCII
			return Ack{}, false
		}
	}
	a.Stream = string(rest[:j])
	i = bytes.Index(b, []byte(`"seq":`))
	if i < 0 {
		return Ack{}, false
	}
	digits := b[i+len(`"seq":`):]
	n := 0
	for n < len(digits) && digits[n] >= '0' && digits[n] <= '9' {
		a.Sequence = a.Sequence*10 + uint64(digits[n]-'0')
		n++
	}
	if n == 0 || n > 19 || a.Sequence == 0 {
		return Ack{}, false
	}
	a.Duplicate = isDuplicate(b)
	return a, true
}

// isDuplicate reports whether the reply b says "duplicate": true (the
// servers write a space after the colon; JSON allows any whitespace).
func isDuplicate(b []byte) bool {
	i := bytes.Index(b, []byte(`"duplicate":`))
	if i < 0 {
		return false
	}
	rest := bytes.TrimLeft(b[i+len(`"duplicate":`):], " \t\r\n")
	return bytes.HasPrefix(rest, []byte("true"))
}
