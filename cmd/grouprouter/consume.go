package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"grouprouter/kvbinding"
	"grouprouter/router"
)

const (
	// consumeBatch is the most messages one pull asks for.
	consumeBatch = 256
	// consumePoll is how long one pull waits for messages before the next.
	consumePoll = 5 * time.Second
	// consumeOpTimeout bounds an ack and the clean-up at the end.
	consumeOpTimeout = 5 * time.Second
	// pinIDHeader is the header the server sets on messages delivered to
	// the pinned client of a priority group.
	pinIDHeader = "Nats-Pin-Id"
)

// consumeOptions is what the consume subcommand needs, parsed and checked.
type consumeOptions struct {
	conn        connSettings
	node        string
	count       int
	asJSON      bool
	noAck       bool
	groupHeader string
}

func newConsumeFlags(o *consumeOptions) (*flag.FlagSet, *connFlags) {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported as one line by the caller
	fs.Usage = func() {}
	conn := addConnFlags(fs, natsClientUsage)
	fs.StringVar(&o.node, "node", "", "consume the queue of node `ID` (default: the host name, sanitized, as for run)")
	fs.IntVar(&o.count, "count", 0, "stop after `N` messages (0 = until interrupted)")
	fs.BoolVar(&o.asJSON, "json", false, "print one JSON object per message instead of a line of text")
	fs.BoolVar(&o.noAck, "no-ack", false, "do not acknowledge the messages: they stay on the queue and are delivered again after the consumer's ack wait")
	fs.StringVar(&o.groupHeader, "group-header", router.DefaultGroupHeader, "`HEADER` holding the group id")
	return fs, conn
}

// printConsumeUsage writes the consume subcommand's help.
func printConsumeUsage(w io.Writer) {
	fs, _ := newConsumeFlags(&consumeOptions{})
	fmt.Fprintf(w, `Usage: grouprouter consume [flags]

Consumes a node's queue as an application does: pulls from the durable
consumer %s<node> of stream %s (with priority group %q when the
node's queue mode is pinned), prints each message and acknowledges it.
The node's router must have run once, to create the consumer.

Each message is one line:
  <ingress-seq> <group-id, or - without one> <subject> <body>
with the subject the producer published on, and a body or group id that
is empty, not valid UTF-8, or holds control characters Go-quoted. --json
prints one object per line instead:
  {"subject", "queue_subject", "group", "ingress_seq", "headers", "body"}
with "body_base64" in place of "body" when the body is not valid UTF-8.

Flags:
`, router.QueueConsumerPrefix, router.QueueStream, router.PriorityGroup)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// parseConsumeArgs parses the consume subcommand's arguments. It returns
// flag.ErrHelp for -h, a *usageError for command-line mistakes and errors
// wrapping router.ErrConfig for invalid values.
func parseConsumeArgs(args []string, env environment) (consumeOptions, error) {
	var o consumeOptions
	fs, conn := newConsumeFlags(&o)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return consumeOptions{}, err
		}
		return consumeOptions{}, &usageError{cmd: "consume", msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return consumeOptions{}, &usageError{cmd: "consume", msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	set := make(map[string]bool)
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if !set["node"] {
		o.node = sanitizeNodeID(env.hostname())
	}
	if err := kvbinding.ValidateNodeID(o.node); err != nil {
		return consumeOptions{}, fmt.Errorf("%w: node: %v", router.ErrConfig, err)
	}
	if o.count < 0 {
		return consumeOptions{}, fmt.Errorf("%w: --count must be >= 0, got %d", router.ErrConfig, o.count)
	}
	if !router.ValidHeaderName(o.groupHeader) {
		return consumeOptions{}, fmt.Errorf("%w: group header %q is not a valid header name", router.ErrConfig, o.groupHeader)
	}
	var err error
	if o.conn, err = conn.resolve(env, defaultNATSURL); err != nil {
		return consumeOptions{}, err
	}
	return o, nil
}

// consume is the consume subcommand.
func consume(ctx context.Context, args []string, env environment, stdout, stderr io.Writer) error {
	o, err := parseConsumeArgs(args, env)
	if errors.Is(err, flag.ErrHelp) {
		printConsumeUsage(stdout)
		return err
	}
	if err != nil {
		return err
	}
	nc, js, err := connectClient(o.conn, "consume-"+o.node, warnTo(stderr),
		nats.MaxReconnects(-1), nats.ReconnectWait(reconnectWait))
	if err != nil {
		return err
	}
	defer nc.Close()

	name := router.QueueConsumer(o.node)
	before := nc.LastError()
	cons, err := js.Consumer(ctx, router.QueueStream, name)
	if err != nil {
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound):
			return fmt.Errorf("node %s has no queue consumer yet: is its router running? (no consumer %s on stream %s at %s)",
				o.node, name, router.QueueStream, redactURLs(o.conn.URL))
		case ctx.Err() != nil:
			return nil // interrupted while looking up
		}
		return requestError(err, o.conn, nc, before, "queue consumer "+name)
	}
	group := ""
	if info := cons.CachedInfo(); len(info.Config.PriorityGroups) > 0 {
		if !slices.Contains(info.Config.PriorityGroups, router.PriorityGroup) {
			return fmt.Errorf("queue consumer %s has priority groups %v, not %q", name, info.Config.PriorityGroups, router.PriorityGroup)
		}
		group = router.PriorityGroup
		for _, g := range info.PriorityGroups {
			if g.Group == group && g.PinnedClientID != "" {
				fmt.Fprintf(stderr, "grouprouter consume: node %s's queue is pinned to another consumer; "+
					"waiting as its standby (the pin lapses %v after that consumer's last pull)\n", o.node, info.Config.PinnedTTL)
			}
		}
	}

	c := &queueReader{opts: o, nc: nc, cons: cons, group: group, stdout: stdout, queuePrefix: router.QueueSubjectPrefix + o.node + "."}
	err = c.read(ctx)
	if group != "" && c.pinID != "" {
		c.unpin(ctx, js, stderr)
	}
	return err
}

// queueReader pulls from a node's queue consumer and prints the messages.
type queueReader struct {
	opts        consumeOptions
	nc          *nats.Conn
	cons        jetstream.Consumer
	group       string // priority group to pull with, or ""
	stdout      io.Writer
	queuePrefix string // stripped from queue subjects to show the ingress subject
	enc         *json.Encoder
	seen        int
	pinID       string // the pin this client was last given
}

// read pulls and prints until opts.count messages are done or ctx ends.
// Messages pulled but not printed when ctx ends are handed back (nak).
func (c *queueReader) read(ctx context.Context) error {
	if c.opts.asJSON {
		c.enc = json.NewEncoder(c.stdout)
		c.enc.SetEscapeHTML(false)
	}
	for ctx.Err() == nil && (c.opts.count == 0 || c.seen < c.opts.count) {
		batch := consumeBatch
		if c.opts.count > 0 {
			// Never pull more than is left, so nothing is held unprinted.
			batch = min(batch, c.opts.count-c.seen)
		}
		pollCtx, cancel := context.WithTimeout(ctx, consumePoll)
		fetchOpts := []jetstream.FetchOpt{jetstream.FetchContext(pollCtx)}
		if c.group != "" {
			fetchOpts = append(fetchOpts, jetstream.FetchPriorityGroup(c.group))
		}
		msgs, err := c.cons.Fetch(batch, fetchOpts...)
		if err != nil {
			cancel()
			if c.transient(err) {
				c.pause(ctx)
				continue
			}
			return fmt.Errorf("pull from %s: %w", router.QueueConsumer(c.opts.node), err)
		}
		var failed error
		for msg := range msgs.Messages() {
			if failed != nil || ctx.Err() != nil {
				_ = msg.Nak() // not printed: let it be delivered again at once
				continue
			}
			if failed = c.handle(ctx, msg); failed != nil {
				cancel() // end the pull; what it still brings is handed back
			}
		}
		cancel()
		if failed != nil {
			return failed
		}
		switch err := msgs.Error(); {
		case err == nil, ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded):
		case errors.Is(err, jetstream.ErrPinIDMismatch):
			c.pinID = "" // the pin moved on: the next pull asks anew
		case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
			return fmt.Errorf("node %s's queue consumer %s was deleted", c.opts.node, router.QueueConsumer(c.opts.node))
		case c.transient(err):
			c.pause(ctx)
		default:
			return fmt.Errorf("pull from %s: %w", router.QueueConsumer(c.opts.node), err)
		}
	}
	return nil
}

// transient reports whether a pull failed only because the connection is
// reconnecting or the stream is between leaders; the pull is then retried.
func (c *queueReader) transient(err error) bool {
	return c.nc.Status() != nats.CONNECTED || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, nats.ErrTimeout)
}

// pause waits a moment before the next pull, or until ctx ends.
func (c *queueReader) pause(ctx context.Context) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// handle prints msg and acknowledges it.
func (c *queueReader) handle(ctx context.Context, msg jetstream.Msg) error {
	if id := msg.Headers().Get(pinIDHeader); id != "" {
		c.pinID = id
	}
	if err := c.print(msg); err != nil {
		_ = msg.Nak()
		return err
	}
	c.seen++
	if c.opts.noAck {
		return nil
	}
	// Printed, so acknowledged even if ctx ended meanwhile.
	ackCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), consumeOpTimeout)
	defer cancel()
	if err := msg.DoubleAck(ackCtx); err != nil {
		return fmt.Errorf("ack of ingress message %s: %w", orDash(msg.Headers().Get(router.HeaderIngressSeq)), err)
	}
	return nil
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

func (c *queueReader) print(msg jetstream.Msg) error {
	hdr := nats.Header{}
	for k, v := range msg.Headers() {
		if k != pinIDHeader { // a delivery detail, not part of the message
			hdr[k] = v
		}
	}
	subject := strings.TrimPrefix(msg.Subject(), c.queuePrefix)
	group, _ := router.GroupOf(hdr, c.opts.groupHeader) // as the router reads it
	hasGroup := group != ""
	seqText := hdr.Get(router.HeaderIngressSeq)
	seq, seqErr := strconv.ParseUint(seqText, 10, 64)
	data := msg.Data()

	if c.enc != nil {
		out := consumedJSON{Subject: subject, QueueSubject: msg.Subject(), Headers: hdr}
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

// unpin releases this client's pin on the queue's priority group, so that
// a standby (or the next consume) gets the messages at once rather than
// after the pinned TTL. It leaves another client's pin alone.
func (c *queueReader) unpin(ctx context.Context, js jetstream.JetStream, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), consumeOpTimeout)
	defer cancel()
	info, err := c.cons.Info(ctx)
	if err != nil {
		return
	}
	for _, g := range info.PriorityGroups {
		if g.Group != c.group || g.PinnedClientID != c.pinID {
			continue
		}
		s, err := js.Stream(ctx, router.QueueStream)
		if err == nil {
			err = s.UnpinConsumer(ctx, info.Name, c.group)
		}
		if err != nil {
			fmt.Fprintf(stderr, "grouprouter consume: could not unpin: %v; another consumer of node %s gets its messages after %v\n",
				err, c.opts.node, info.Config.PinnedTTL)
		}
	}
}
