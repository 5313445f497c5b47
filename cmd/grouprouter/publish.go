package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// publishTimeout bounds waiting for one PubAck.
const publishTimeout = 10 * time.Second

// publishOptions is what the publish subcommand was asked for.
type publishOptions struct {
	subject     string
	body        string
	group       string // "" sends no group header
	groupHeader string
	headers     nats.Header
	extra       headerFlags // --header
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
	return o
}

// publishHelp is the publish command's help.
const publishHelp = `Usage: grouprouter publish [flags] SUBJECT [BODY]

Publishes one message, as a producer does, and waits for JetStream's
PubAck: "stored" means the ingress stream holds it and a node will route
it. SUBJECT must be under the routers' --address (jms.> by default).

Flags:
`

// check reads SUBJECT and BODY and builds the headers.
func (o *publishOptions) check(in *invocation) error {
	if in.fs.NArg() < 1 || in.fs.NArg() > 2 {
		return in.usagef("want SUBJECT [BODY], got %d arguments", in.fs.NArg())
	}
	o.subject, o.body = in.fs.Arg(0), in.fs.Arg(1)
	if o.subject == "" || strings.ContainsAny(o.subject, " \t\r\n*>") {
		return in.usagef("invalid SUBJECT %q: no spaces or wildcards", clip(o.subject))
	}
	if !router.ValidHeaderName(o.groupHeader) {
		return fmt.Errorf("%w: group header %q is not a valid header name", router.ErrConfig, o.groupHeader)
	}
	if o.group != "" {
		if err := kvbinding.ValidateGroupID(o.group); err != nil {
			msg := strings.TrimPrefix(err.Error(), kvbinding.ErrInvalidGroupID.Error()+": ")
			return in.usagef("invalid --group %q: %s", clip(o.group), msg)
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

// run publishes the message and waits for its PubAck.
func (o *publishOptions) run(ctx context.Context, in *invocation) error {
	nc, js, stdout := in.nc, in.js, in.stdout
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	before := nc.LastError()
	m := &nats.Msg{Subject: o.subject, Header: o.headers, Data: []byte(o.body)}
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
			return fmt.Errorf("no stream stores %q at %s: is a grouprouter node running, and the subject under its --address?",
				o.subject, redactURLs(in.conn.URL))
		}
		return requestError(err, in.conn, nc, before, "publish")
	}
	group := displayGroup(o.group)
	fmt.Fprintf(stdout, "stored: stream %s seq %d, group %s\n", ack.Stream, ack.Sequence, group)
	return nil
}
