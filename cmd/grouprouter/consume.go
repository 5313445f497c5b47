package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

const (
	// consumeBatch is the most messages one pull asks for.
	consumeBatch = 256
	// pinIDHeader is the header the server sets on messages delivered to
	// the pinned client of a priority group.
	pinIDHeader = "Nats-Pin-Id"
)

// consumeOptions is what the consume subcommand needs, parsed and checked.
type consumeOptions struct {
	node        string
	count       int
	asJSON      bool
	noAck       bool
	groupHeader string
}

func newConsumeFlags(fs *flag.FlagSet) *consumeOptions {
	o := &consumeOptions{}
	fs.StringVar(&o.node, "node", "", "consume the queue of node `ID` (default: the host name, sanitized, as for run)")
	fs.IntVar(&o.count, "count", 0, "stop after `N` messages (0 = until interrupted)")
	fs.BoolVar(&o.asJSON, "json", false, "print one JSON object per message instead of a line of text")
	fs.BoolVar(&o.noAck, "no-ack", false, "do not acknowledge the messages: they stay on the queue (handed back when consume stops) and a group's later messages wait behind them")
	fs.StringVar(&o.groupHeader, "group-header", router.DefaultGroupHeader, "`HEADER` holding the group id")
	return o
}

// consumeHelp is the consume command's help.
func consumeHelp() string {
	return fmt.Sprintf(`Usage: grouprouter consume [flags]

Consumes a node's queue as an application does, with package consumer:
pulls from the durable consumer %s<node> of stream %s (with
priority group %q when the node's queue mode is pinned), prints each
message, one at a time and each group in ingress order (also when
JetStream redelivers), and acknowledges it; it unpins when it stops. A
group parked by a consumer (grouprouter parked) has its messages parked,
not printed. Started before the node's router, it says so once and waits
for the consumer the router creates. To run a program per message, see
grouprouter work.

Each message is one line:
  <ingress-seq> <group-id, or - without one> <subject> <body>
with the subject the producer published on, and a body or group id that
is empty, not valid UTF-8, or holds control characters Go-quoted. --json
prints one object per line instead:
  {"subject", "queue_subject", "group", "ingress_seq", "headers", "body"}
with "body_base64" in place of "body" when the body is not valid UTF-8.

Flags:
`, router.QueueConsumerPrefix, router.QueueStream, router.PriorityGroup)
}

// check defaults --node to the host name and validates the flags.
func (o *consumeOptions) check(in *invocation) error {
	if !in.isSet("node") {
		o.node = sanitizeNodeID(in.env.hostname())
	}
	if err := kvbinding.ValidateNodeID(o.node); err != nil {
		return fmt.Errorf("%w: node: %v", router.ErrConfig, err)
	}
	if o.count < 0 {
		return fmt.Errorf("%w: --count must be >= 0, got %d", router.ErrConfig, o.count)
	}
	if !router.ValidHeaderName(o.groupHeader) {
		return fmt.Errorf("%w: group header %q is not a valid header name", router.ErrConfig, o.groupHeader)
	}
	return nil
}

// dial names the connection after the node; it reconnects for as long as
// consume runs.
func (o *consumeOptions) dial() (string, []nats.Option) {
	return "consume-" + o.node, []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(reconnectWait)}
}

// run prints the node's queue.
func (o *consumeOptions) run(ctx context.Context, in *invocation) error {
	nc, js, stderr := in.nc, in.js, in.stderr
	name := router.QueueConsumer(o.node)
	before := nc.LastError()
	cons, err := js.Consumer(ctx, router.QueueStream, name)
	switch {
	case ctx.Err() != nil:
		return nil // interrupted while looking up
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound):
		// Started before the node's router (together, in a compose file
		// or a unit): wait for the consumer it creates.
		fmt.Fprintf(stderr, "grouprouter consume: node %s has no queue consumer yet: waiting for its router to create it (consumer %s on stream %s at %s)\n",
			o.node, name, router.QueueStream, redactURLs(in.conn.URL))
		if cons, err = consumer.WaitQueue(ctx, js, o.node); ctx.Err() != nil {
			return nil // interrupted while waiting
		}
		if err != nil {
			return requestError(err, in.conn, nc, before, "queue consumer "+name)
		}
	case err != nil:
		return requestError(err, in.conn, nc, before, "queue consumer "+name)
	}
	if info := cons.CachedInfo(); len(info.Config.PriorityGroups) > 0 {
		if !slices.Contains(info.Config.PriorityGroups, router.PriorityGroup) {
			return fmt.Errorf("queue consumer %s has priority groups %v, not %q", name, info.Config.PriorityGroups, router.PriorityGroup)
		}
		for _, g := range info.PriorityGroups {
			if g.Group == router.PriorityGroup && g.PinnedClientID != "" {
				fmt.Fprintf(stderr, "grouprouter consume: node %s's queue is pinned to another consumer; "+
					"waiting as its standby (the pin lapses %v after that consumer's last pull)\n", o.node, info.Config.PinnedTTL)
			}
		}
	}

	return consumeQueue(ctx, js, *o, in.stdout, stderr)
}

// errNotNow is a consume handler's answer for a message it does not
// print: past --count, or not acknowledged (--no-ack). Package consumer
// keeps it unacknowledged (tried again after consumeRetry) and hands it
// back when consume stops.
var errNotNow = errors.New("not acknowledged by grouprouter consume")

// consumeRetry is when a message consume did not acknowledge is printed
// again, should consume still run.
const consumeRetry = time.Minute

// consumeQueue prints the node's messages through package consumer, one
// at a time (in queue order, each group in ingress order), until
// opts.count are printed or ctx ends.
func consumeQueue(ctx context.Context, js jetstream.JetStream, o consumeOptions, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p := &printer{opts: o, stdout: stdout, queuePrefix: router.QueueSubjectPrefix + o.node + "."}
	if o.asJSON {
		p.enc = json.NewEncoder(stdout)
		p.enc.SetEscapeHTML(false)
	}
	var (
		mu     sync.Mutex
		seen   int
		failed error
	)
	h := func(_ context.Context, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if failed != nil || (o.count > 0 && seen >= o.count) {
			return errNotNow
		}
		if err := p.print(m); err != nil {
			failed = err
			cancel()
			return err
		}
		seen++
		if o.count > 0 && seen >= o.count {
			cancel()
		}
		if o.noAck {
			return errNotNow
		}
		return nil
	}
	batch := consumeBatch
	if o.count > 0 {
		batch = min(batch, o.count) // pull no more than is left, mostly
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	err := consumer.Consume(ctx, js, o.node, h, consumer.WithConcurrency(1), consumer.WithPullBatch(batch),
		consumer.WithMaxAttempts(math.MaxInt32), consumer.WithBackoff(consumeRetry, consumeRetry),
		consumer.WithGroupHeader(o.groupHeader), consumer.WithLogger(log))
	mu.Lock()
	defer mu.Unlock()
	if failed != nil {
		return failed
	}
	if errors.Is(err, consumer.ErrNoQueue) {
		return fmt.Errorf("node %s's queue consumer %s was deleted", o.node, router.QueueConsumer(o.node))
	}
	return err
}

// printer prints the messages consume gets.
type printer struct {
	opts        consumeOptions
	stdout      io.Writer
	queuePrefix string // of the queue subjects
	enc         *json.Encoder
}

// consumedJSON is a message as --json prints it.
type consumedJSON struct {
	// Subject is the subject the producer published on.
	Subject string `json:"subject"`
	// QueueSubject is the subject on the node's queue.
	QueueSubject string `json:"queue_subject"`
	// Group is the group id, null without the header.
	Group *string `json:"group"`
	// IngressSeq is the message's ingress stream sequence, null if unknown.
	IngressSeq *uint64     `json:"ingress_seq"`
	Headers    nats.Header `json:"headers"`
	// Body if it is valid UTF-8, else BodyBase64.
	Body       *string `json:"body,omitempty"`
	BodyBase64 string  `json:"body_base64,omitempty"`
}

func (c *printer) print(msg *consumer.Message) error {
	hdr := nats.Header{}
	for k, v := range msg.Header {
		if k != pinIDHeader { // a delivery detail, not part of the message
			hdr[k] = v
		}
	}
	subject := msg.Subject
	group, _ := router.GroupOf(hdr, c.opts.groupHeader) // as the router reads it
	hasGroup := group != ""
	seqText := hdr.Get(router.HeaderIngressSeq)
	seq, seqErr := strconv.ParseUint(seqText, 10, 64)
	data := msg.Data

	if c.enc != nil {
		out := consumedJSON{Subject: subject, QueueSubject: c.queuePrefix + subject, Headers: hdr}
		if hasGroup {
			out.Group = &group
		}
		if seqErr == nil {
			out.IngressSeq = &seq
		}
		if utf8.Valid(data) {
			body := string(data)
			out.Body = &body
		} else {
			out.BodyBase64 = base64.StdEncoding.EncodeToString(data)
		}
		return c.enc.Encode(out)
	}

	seqField := "-"
	if seqErr == nil {
		seqField = strconv.FormatUint(seq, 10)
	}
	groupField := "-"
	if hasGroup {
		groupField = quoteField(group, false)
	}
	_, err := fmt.Fprintf(c.stdout, "%s %s %s %s\n", seqField, groupField, quoteField(subject, false), quoteField(string(data), true))
	return err
}

// quoteField returns s as is, or Go-quoted if it could be misread: if it
// is empty, "-", starts with a quote, is not valid UTF-8, or holds control
// characters or (unless it is the last field of the line) spaces, or (as
// the last field) begins or ends with one.
func quoteField(s string, last bool) string {
	if s == "" || s == "-" || strings.HasPrefix(s, `"`) || !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	if last && strings.TrimSpace(s) != s {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if r == ' ' && last {
			continue
		}
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}
