package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// publishTimeout bounds waiting for one PubAck.
const publishTimeout = 10 * time.Second

// publishWindow is how many messages publish --count or --stdin has on
// the way at most, their PubAcks not yet back.
const publishWindow = 256

// indexPlaceholder in BODY or --group becomes the message's number (1 to
// N) with --count, the line's number with --stdin.
const indexPlaceholder = "{{i}}"

// publishOptions is what the publish subcommand was asked for.
type publishOptions struct {
	subject     string
	body        string
	group       string // "" sends no group header
	groupHeader string
	headers     nats.Header
	extra       headerFlags // --header
	count       int
	stdin       bool
	in          io.Reader // stdin, with --stdin
	// numbered: --count or --stdin was given: indexPlaceholder is
	// replaced (otherwise BODY and --group are sent as they are).
	numbered bool
}

// headerFlags collects repeated --header NAME:VALUE flags.
type headerFlags struct{ h nats.Header }

func (f *headerFlags) String() string { return "" }

func (f *headerFlags) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	name = strings.TrimSpace(name)
	if !ok || !router.ValidHeaderName(name) {
		return fmt.Errorf("want NAME:VALUE, got %q", v)
	}
	if f.h == nil {
		f.h = nats.Header{}
	}
	f.h.Add(name, strings.TrimSpace(value))
	return nil
}

func newPublishFlags(fs *flag.FlagSet) *publishOptions {
	o := &publishOptions{}
	fs.StringVar(&o.group, "group", "", "group `ID` (sent in --group-header); without it the message has no group")
	fs.StringVar(&o.groupHeader, "group-header", router.DefaultGroupHeader, "`HEADER` holding the group id")
	fs.Var(&o.extra, "header", "extra header `NAME:VALUE` (repeatable)")
	fs.IntVar(&o.count, "count", 1, "publish `N` messages, in order, awaiting every PubAck; "+indexPlaceholder+" in BODY or --group becomes the message's number, 1 to N")
	fs.BoolVar(&o.stdin, "stdin", false, "publish each line of stdin as a message (no BODY), in order, awaiting every PubAck; "+
		"the line ends are not sent, an empty line is an empty message; "+indexPlaceholder+" in --group becomes the line's number")
	return o
}

// publishHelp is the publish command's help.
const publishHelp = `Usage: grouprouter publish [flags] SUBJECT [BODY]
       grouprouter publish [flags] --count N SUBJECT [BODY]
       grouprouter publish [flags] --stdin SUBJECT < FILE

Publishes one message, as a producer does, and waits for JetStream's
PubAck: "stored" means the ingress stream holds it and a node will route
it. SUBJECT must be under the routers' --address (jms.> by default).

--count N publishes N messages, --stdin one per line of stdin: without
waiting for each PubAck before the next publish (at most 256 on the
way), in order, and waits for every PubAck. {{i}} in BODY (--count) or
--group becomes the message's number, from 1:
  grouprouter publish --count 3 --group 'order-{{i}}' jms.orders 'item {{i}}'
A failed publish stops it: the error says how many were stored before;
later ones on the way may be stored too.

Flags:
`

// check reads SUBJECT and BODY and builds the headers.
func (o *publishOptions) check(in *invocation) error {
	switch {
	case o.stdin && in.fs.NArg() != 1:
		return in.usagef("want SUBJECT with --stdin (the bodies are its lines), got %d arguments", in.fs.NArg())
	case in.fs.NArg() < 1 || in.fs.NArg() > 2:
		return in.usagef("want SUBJECT [BODY], got %d arguments", in.fs.NArg())
	case o.count < 1:
		return in.usagef("--count must be >= 1, got %d", o.count)
	case o.stdin && in.isSet("count"):
		return in.usagef("--count or --stdin, not both")
	case o.stdin && in.env.stdin == nil:
		return in.usagef("--stdin: no standard input")
	}
	if o.stdin {
		o.in = in.env.stdin
	}
	o.numbered = o.stdin || in.isSet("count")
	o.subject, o.body = in.fs.Arg(0), in.fs.Arg(1)
	if o.subject == "" || strings.ContainsAny(o.subject, " \t\r\n*>") {
		return in.usagef("invalid SUBJECT %q: no spaces or wildcards", clip(o.subject))
	}
	if !router.ValidHeaderName(o.groupHeader) {
		return fmt.Errorf("%w: group header %q is not a valid header name", router.ErrConfig, o.groupHeader)
	}
	if o.group != "" {
		// A numbered group is checked with the longest number it gets
		// (--stdin: 12 digits).
		n := o.count
		if o.stdin {
			n = 999_999_999_999
		}
		g := o.groupOf(n)
		if err := kvbinding.ValidateGroupID(g); err != nil {
			msg := strings.TrimPrefix(err.Error(), kvbinding.ErrInvalidGroupID.Error()+": ")
			return in.usagef("invalid --group %q: %s", clip(g), msg)
		}
	}
	o.headers = o.extra.h
	if o.headers == nil {
		o.headers = nats.Header{}
	}
	if o.group != "" {
		o.headers.Set(o.groupHeader, o.group)
	}
	return nil
}

// many reports whether publish sends a series (--count above 1, --stdin).
func (o *publishOptions) many() bool { return o.stdin || o.count > 1 }

// groupOf is the group of message n (from 1): --group with its
// placeholder replaced.
func (o *publishOptions) groupOf(n int) string { return o.numberedText(o.group, n) }

// numberedText is s for message n: indexPlaceholder replaced by n with
// --count or --stdin.
func (o *publishOptions) numberedText(s string, n int) string {
	if !o.numbered {
		return s
	}
	return strings.ReplaceAll(s, indexPlaceholder, strconv.Itoa(n))
}

// message returns message n (from 1) with body.
func (o *publishOptions) message(n int, body []byte) *nats.Msg {
	h := o.headers
	if g := o.groupOf(n); g != o.group {
		h = nats.Header{}
		for k, v := range o.headers {
			h[k] = v
		}
		h.Set(o.groupHeader, g)
	}
	return &nats.Msg{Subject: o.subject, Header: h, Data: body}
}

// run publishes the message and waits for its PubAck.
func (o *publishOptions) run(ctx context.Context, in *invocation) error {
	if o.many() {
		return o.runMany(ctx, in)
	}
	nc, js, stdout := in.nc, in.js, in.stdout
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	before := nc.LastError()
	ack, err := js.PublishMsg(ctx, o.message(1, []byte(o.numberedText(o.body, 1))))
	if err != nil {
		return o.publishError(err, in, before)
	}
	group := displayGroup(o.groupOf(1))
	fmt.Fprintf(stdout, "stored: stream %s seq %d, group %s\n", ack.Stream, ack.Sequence, group)
	return nil
}

// publishError explains a failed publish.
func (o *publishOptions) publishError(err error, in *invocation, before error) error {
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
		return fmt.Errorf("no stream stores %q at %s: is a grouprouter node running, and the subject under its --address?",
			o.subject, redactURLs(in.conn.URL))
	}
	return requestError(err, in.conn, in.nc, before, "publish")
}

// publishBody is one message of a series: its number and body.
type publishBody struct {
	n    int
	body []byte
}

// bodies sends the series' messages on a channel, then closes it; an
// error reading stdin comes last, in *readErr.
func (o *publishOptions) bodies(ctx context.Context, maxPayload int64, readErr *error) <-chan publishBody {
	ch := make(chan publishBody)
	send := func(b publishBody) bool {
		select {
		case ch <- b:
			return true
		case <-ctx.Done():
			return false
		}
	}
	go func() {
		defer close(ch)
		if !o.stdin {
			for n := 1; n <= o.count; n++ {
				if !send(publishBody{n, []byte(o.numberedText(o.body, n))}) {
					return
				}
			}
			return
		}
		sc := bufio.NewScanner(o.in)
		sc.Buffer(make([]byte, 0, 64*1024), int(max(maxPayload, 64*1024))+2) // the line, \r\n
		n := 0
		for sc.Scan() {
			n++
			if !send(publishBody{n, bytes.Clone(bytes.TrimSuffix(sc.Bytes(), []byte("\r")))}) {
				return
			}
		}
		if err := sc.Err(); err != nil {
			if errors.Is(err, bufio.ErrTooLong) {
				err = fmt.Errorf("line %d is longer than the server's max payload (%d bytes)", n+1, maxPayload)
			}
			*readErr = fmt.Errorf("reading stdin: %w", err)
		}
	}()
	return ch
}

// runMany publishes --count messages or --stdin's lines: asynchronously,
// in order, at most publishWindow on the way, and waits for every
// PubAck. It stops at the first failure.
func (o *publishOptions) runMany(ctx context.Context, in *invocation) error {
	nc, js := in.nc, in.js
	before := nc.LastError()
	type onTheWay struct {
		n   int
		ack jetstream.PubAckFuture
	}
	var (
		queue                 []onTheWay
		stored                int
		firstSeq, lastSeq     uint64
		firstGroup, lastGroup string
		stream                string
	)
	// failed says which message failed and what was stored before it.
	failed := func(n int, err error) error {
		err = o.publishError(err, in, before)
		return fmt.Errorf("message %d not stored: %w (%d stored before it%s; any after it on the way may be stored too)",
			n, err, stored, seqRange(", seq ", firstSeq, lastSeq))
	}
	awaitOne := func() error {
		p := queue[0]
		queue = queue[1:]
		t := time.NewTimer(publishTimeout)
		defer t.Stop()
		select {
		case ack := <-p.ack.Ok():
			stored++
			if firstSeq == 0 {
				firstSeq, firstGroup, stream = ack.Sequence, o.groupOf(p.n), ack.Stream
			}
			lastSeq, lastGroup = ack.Sequence, o.groupOf(p.n)
			return nil
		case err := <-p.ack.Err():
			return failed(p.n, err)
		case <-t.C:
			return failed(p.n, fmt.Errorf("no PubAck within %v", publishTimeout))
		}
	}
	var readErr error
	bctx, stop := context.WithCancel(ctx)
	defer stop()
	var err error
	for b := range o.bodies(bctx, nc.MaxPayload(), &readErr) {
		for len(queue) >= publishWindow && err == nil {
			err = awaitOne()
		}
		if err != nil {
			break
		}
		f, perr := js.PublishMsgAsync(o.message(b.n, b.body), jetstream.WithRetryAttempts(0)) // a retry would pass later messages
		if perr != nil {
			err = failed(b.n, perr)
			break
		}
		queue = append(queue, onTheWay{b.n, f})
	}
	stop()
	for len(queue) > 0 && err == nil {
		err = awaitOne()
	}
	if err != nil {
		return err
	}
	if readErr != nil {
		return fmt.Errorf("%w (%d stored%s)", readErr, stored, seqRange(", seq ", firstSeq, lastSeq))
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %d stored%s", stored, seqRange(", seq ", firstSeq, lastSeq))
	}
	if stored == 0 {
		fmt.Fprintln(in.stdout, "stored: 0 messages (stdin had no line)")
		return nil
	}
	groups := "group " + displayGroup(firstGroup)
	if firstGroup != lastGroup {
		groups = "groups " + displayGroup(firstGroup) + " to " + displayGroup(lastGroup)
	}
	fmt.Fprintf(in.stdout, "stored: %d messages, stream %s%s, %s\n", stored, stream, seqRange(" seq ", firstSeq, lastSeq), groups)
	return nil
}

// seqRange renders the stream sequences first to last ("" for none).
func seqRange(prefix string, first, last uint64) string {
	switch {
	case first == 0:
		return ""
	case first == last:
		return prefix + strconv.FormatUint(first, 10)
	}
	return prefix + strconv.FormatUint(first, 10) + " to " + strconv.FormatUint(last, 10)
}
