package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/grouprouter/grouprouter/internal/jsack"
)

// The ingress reader follows the ingress stream in order from a start
// sequence, as nats.go's ordered consumer does (an ephemeral, unacked,
// in-memory consumer, recreated after the last message delivered whenever
// the delivery has a gap or goes silent), without that consumer's costs
// per message: the iterator arms and stops a timer, wraps the message and
// splits its reply subject for every message, and hands messages over one
// at a time. Here the pull requests overlap (readerWindow messages are
// requested at any time, in pulls of readerBatch, so the server never waits
// for the next request), the deliveries arrive on a channel subscription,
// and whatever has arrived is handed over as one batch: the router decodes
// it outside its lock and takes the lock once per batch. Measured with
// BenchmarkNodeSkip and `grouprouter bench` (docs/performance.md).

// Reader tuning.
const (
	readerBatch   = 1024            // messages per pull request
	readerWindow  = 2 * readerBatch // messages requested and not delivered, at most
	readerMaxHand = 256             // messages per batch handed over
	readerExpiry  = 5 * time.Second // a pull request's life
	// readerHeartbeat is the idle heartbeat asked of the server while a
	// request waits: two missed ones (with messages requested) mean the
	// consumer or its server is gone, and the reader recreates it. (The
	// default expiry of 30 s made a dead stream leader a ~30 s stall.)
	readerHeartbeat = time.Second
)

// ingressMsg is one ingress message delivered in order.
type ingressMsg struct {
	seq uint64 // stream sequence
	msg *nats.Msg
}

// ingressReader reads a stream in order. It is used by one goroutine.
type ingressReader struct {
	js        jetstream.JetStream
	nc        *nats.Conn
	log       *slog.Logger
	stream    string
	apiPrefix string // "$JS.API." or "$JS.<domain>.API."

	msgs  chan *nats.Msg
	sub   *nats.Subscription
	inbox string // the subscription's stem: pulls of consumer generation g reply to inbox + g

	consumer  string // the current consumer's name ("" before the first)
	pullSubj  string // its pull request subject
	gen       uint64 // generation of the current consumer (one per creation)
	reply     string // its pulls' reply subject: inbox + gen
	next      uint64 // next stream sequence to deliver
	cseq      uint64 // last consumer sequence delivered
	requested int    // messages requested, neither delivered nor expired
	heard     time.Time
	reconns   uint64
	pullBody  []byte
	cleanup   sync.WaitGroup  // deletions of replaced consumers
	onCreated func()          // called after each consumer creation
	onReset   func(cause int) // called when a consumer is replaced: an index of resetCauses
	// onGap is called with the sequences a delivery skipped (gone from
	// the stream: expired, removed, lost), at or after gapsFrom; gapsFrom
	// 0 means from the first delivery (no checkpoint: what came before
	// was never this reader's to miss).
	onGap    func(from, to uint64)
	gapsFrom uint64
	rewound  uint64 // the position a stream behind it was last reported at
}

// Why the reader replaces its consumer (the metric's reason label).
const (
	resetGap       = iota // a delivery out of sequence (one was lost)
	resetStatus           // the server said the consumer is gone (409, 400, 503)
	resetHeartbeat        // no message nor heartbeat for two heartbeats
	resetReconnect        // the connection reconnected
)

// resetCauses names the causes, by index.
var resetCauses = [...]string{resetGap: "gap", resetStatus: "status", resetHeartbeat: "heartbeat", resetReconnect: "reconnect"}

// newIngressReader returns a reader of stream on js's connection, through
// the JetStream API under domain ("" for none).
func newIngressReader(js jetstream.JetStream, stream, domain string, log *slog.Logger) *ingressReader {
	prefix := "$JS.API."
	if domain != "" {
		prefix = "$JS." + domain + ".API."
	}
	body, _ := json.Marshal(struct {
		Batch     int           `json:"batch"`
		Expires   time.Duration `json:"expires"`
		Heartbeat time.Duration `json:"idle_heartbeat"`
	}{readerBatch, readerExpiry, readerHeartbeat})
	return &ingressReader{js: js, nc: js.Conn(), log: log, stream: stream, apiPrefix: prefix, pullBody: body}
}

// run reads from sequence start until ctx ends, handing the messages over
// in order, in batches, to deliver (which must not keep the slice). It
// returns nil when ctx ends, or an error when it cannot subscribe.
func (rd *ingressReader) run(ctx context.Context, start uint64, deliver func([]ingressMsg)) error {
	rd.next = max(start, 1)
	// Room for everything requested and the status messages beside it: a
	// full channel drops a delivery (a gap, which recreates the consumer).
	rd.msgs = make(chan *nats.Msg, readerWindow+readerMaxHand)
	// Each consumer's pulls reply to a subject of their own, so that the
	// status messages of a replaced consumer's requests (the 409s sent
	// when it is deleted) are told apart and dropped; its deliveries name
	// it in their reply subjects.
	rd.inbox = rd.nc.NewInbox() + "."
	sub, err := rd.nc.ChanSubscribe(rd.inbox+"*", rd.msgs)
	if err != nil {
		return fmt.Errorf("grouping: ingress: subscribe: %w", err)
	}
	rd.sub = sub
	defer func() {
		_ = sub.Unsubscribe()
		rd.deleteConsumer()
		rd.cleanup.Wait()
	}()
	if !rd.reset(ctx, -1, "start") {
		return nil
	}
	tick := time.NewTicker(readerHeartbeat / 4)
	defer tick.Stop()
	batch := make([]ingressMsg, 0, readerMaxHand)
	for {
		rd.pull()
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if !rd.check(ctx) {
				return nil
			}
			continue
		case m := <-rd.msgs:
			batch = rd.take(ctx, m, batch)
		}
	more:
		for len(batch) < readerMaxHand {
			select {
			case m := <-rd.msgs:
				batch = rd.take(ctx, m, batch)
			default:
				break more
			}
		}
		if len(batch) > 0 {
			deliver(batch)
			clear(batch)
			batch = batch[:0]
			// Time spent handing over (the router may hold the reader
			// while it is full) is not silence of the server.
			rd.heard = time.Now()
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// take adds m to batch if it is the next message of the current consumer;
// it handles status messages and recreates the consumer after a gap.
func (rd *ingressReader) take(ctx context.Context, m *nats.Msg, batch []ingressMsg) []ingressMsg {
	d, ok := jsack.Parse(m.Reply)
	if !ok {
		// A status message comes on its request's reply subject (a
		// delivery comes on the message's own subject, and names its
		// consumer in its reply subject).
		if m.Subject == rd.reply {
			rd.status(ctx, m)
		}
		return batch
	}
	if d.Consumer != rd.consumer {
		return batch // from a consumer replaced since
	}
	rd.heard = time.Now()
	if rd.requested > 0 {
		rd.requested--
	}
	if d.ConsumerSeq != rd.cseq+1 {
		rd.reset(ctx, resetGap, fmt.Sprintf("delivery gap: consumer sequence %d after %d", d.ConsumerSeq, rd.cseq))
		return batch
	}
	rd.cseq = d.ConsumerSeq
	if d.StreamSeq < rd.next {
		return batch // already delivered (cannot happen on a fresh consumer; cheap to check)
	}
	if rd.gapsFrom == 0 {
		rd.gapsFrom = d.StreamSeq
	}
	if lo, hi, ok := missedRange(rd.next, rd.gapsFrom, d.StreamSeq); ok && rd.onGap != nil {
		rd.onGap(lo, hi)
	}
	rd.next = d.StreamSeq + 1
	return append(batch, ingressMsg{seq: d.StreamSeq, msg: m})
}

// status handles a message that is not a delivery: a heartbeat, an
// expired request, or a sign that the consumer is gone.
func (rd *ingressReader) status(ctx context.Context, m *nats.Msg) {
	code := m.Header.Get("Status")
	switch code {
	case "100": // idle heartbeat
		rd.heard = time.Now()
	case "408": // a pull request expired: what it still asked for is not coming
		rd.heard = time.Now()
		if n, err := strconv.Atoi(m.Header.Get("Nats-Pending-Messages")); err == nil {
			rd.requested = max(rd.requested-n, 0)
		} else {
			rd.requested = 0
		}
	case "404":
		rd.heard = time.Now()
	case "":
		// Not a status message: no reply subject of a delivery (cannot
		// come from the consumer); ignore it.
	default: // 409 (consumer deleted, leader change, server shutdown, ...), 400, 503
		rd.reset(ctx, resetStatus, "status "+code+" "+m.Header.Get("Description"))
	}
}

// pull tops the requests up to readerWindow.
func (rd *ingressReader) pull() {
	for rd.consumer != "" && rd.requested+readerBatch <= readerWindow {
		if err := rd.nc.PublishRequest(rd.pullSubj, rd.reply, rd.pullBody); err != nil {
			return // the connection is down: check recreates the consumer once it is back
		}
		rd.requested += readerBatch
	}
}

// check recreates the consumer when the connection reconnected or nothing
// came for two heartbeats while messages were requested. It returns false
// when ctx ended.
func (rd *ingressReader) check(ctx context.Context) bool {
	if len(rd.msgs) > 0 {
		return true
	}
	if n := rd.nc.Stats().Reconnects; n != rd.reconns {
		rd.reconns = n
		return rd.reset(ctx, resetReconnect, "reconnected")
	}
	if rd.requested > 0 && time.Since(rd.heard) > 2*readerHeartbeat+readerHeartbeat/2 {
		return rd.reset(ctx, resetHeartbeat, "no heartbeat")
	}
	return true
}

// reset replaces the consumer by a new one starting after the last message
// delivered, retrying until ctx ends (then it returns false). cause is an
// index of resetCauses (-1 for the first creation), why the detail.
func (rd *ingressReader) reset(ctx context.Context, cause int, why string) bool {
	if rd.consumer != "" {
		rd.log.Info("ingress consumer recreated", "reason", why, "next", rd.next)
	}
	if cause >= 0 && rd.onReset != nil {
		rd.onReset(cause)
	}
	rd.deleteConsumer()
	rd.requested, rd.cseq = 0, 0
	rd.reconns = rd.nc.Stats().Reconnects
	cfg := jetstream.ConsumerConfig{
		Name:              nuid.Next(),
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: 5 * time.Minute,
		Replicas:          1,
		MemoryStorage:     true,
	}
	if rd.next > 1 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = rd.next
	}
	for attempt := 1; ; attempt++ {
		// A creation sent while the stream elects a leader may go
		// unanswered, or create a consumer on a server that is going
		// away ("consumer is offline"): a short first wait, and a fresh
		// consumer (placed anew) for every attempt.
		cctx, cancel := context.WithTimeout(ctx, min(time.Duration(attempt)*time.Second, 5*time.Second))
		_, err := rd.js.CreateConsumer(cctx, rd.stream, cfg)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return false
		}
		rd.consumer = cfg.Name // it may exist: delete it
		rd.deleteConsumer()
		cfg.Name = nuid.Next()
		if attempt&(attempt-1) == 0 {
			rd.log.Warn("ingress consumer not created, retrying", "err", err, "attempt", attempt)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(min(time.Duration(attempt)*100*time.Millisecond, time.Second)):
		}
	}
	rd.checkRewind(ctx)
	rd.consumer = cfg.Name
	rd.pullSubj = rd.apiPrefix + "CONSUMER.MSG.NEXT." + rd.stream + "." + cfg.Name
	rd.gen++
	rd.reply = rd.inbox + strconv.FormatUint(rd.gen, 10)
	rd.heard = time.Now()
	if rd.onCreated != nil {
		rd.onCreated()
	}
	return true
}

// checkRewind reports, as a gap, the sequences between the stream's last
// one and the next to read when the stream went back below what was read
// (its servers lost acknowledged messages and their sequence numbers): a
// consumer starting past the stream's end waits for the stream to get
// there, so the messages stored at those sequences again are never read.
func (rd *ingressReader) checkRewind(ctx context.Context) {
	if rd.onGap == nil || rd.next <= 1 || rd.next == rd.rewound {
		return // (reported once per position, not at every re-creation)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := rd.js.Stream(ctx, rd.stream)
	if err != nil {
		rd.log.Debug("ingress stream info not read after a consumer creation", "err", err)
		return
	}
	last := s.CachedInfo().State.LastSeq
	if lo, hi, ok := missedRange(last+1, 0, rd.next); ok {
		rd.log.Error("the ingress stream's last sequence is behind what this node has read: the servers lost acknowledged messages; "+
			"the messages stored at the sequences up to this node's position will not be read by it (a restart re-reads from the queue's duplicate window)",
			"stream_last", last, "next", rd.next)
		rd.rewound = rd.next
		rd.onGap(lo, hi)
	}
}

// deleteConsumer deletes the current consumer in the background (it would
// go by itself after its inactivity threshold).
func (rd *ingressReader) deleteConsumer() {
	name := rd.consumer
	rd.consumer = ""
	if name == "" {
		return
	}
	rd.cleanup.Add(1)
	go func() {
		defer rd.cleanup.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := rd.js.DeleteConsumer(ctx, rd.stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			rd.log.Debug("replaced ingress consumer not deleted", "consumer", name, "err", err)
		}
	}()
}
