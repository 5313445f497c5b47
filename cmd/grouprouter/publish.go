package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"grouprouter/kvbinding"
	"grouprouter/router"
)

// publishTimeout bounds waiting for one PubAck.
const publishTimeout = 10 * time.Second

// publishOptions is what the publish subcommand was asked for.
type publishOptions struct {
	conn        connSettings
	subject     string
	body        string
	group       string // "" sends no group header
	groupHeader string
	headers     nats.Header
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

func newPublishFlags(o *publishOptions, hf *headerFlags) (*flag.FlagSet, *connFlags) {
	fs := flag.NewFlagSet("publish", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	conn := addConnFlags(fs, natsClientUsage)
	fs.StringVar(&o.group, "group", "", "group `ID` (sent in --group-header); without it the message has no group")
	fs.StringVar(&o.groupHeader, "group-header", router.DefaultGroupHeader, "`HEADER` holding the group id")
	fs.Var(hf, "header", "extra header `NAME:VALUE` (repeatable)")
	return fs, conn
}

// printPublishUsage writes the publish subcommand's help.
func printPublishUsage(w io.Writer) {
	fs, _ := newPublishFlags(&publishOptions{}, &headerFlags{})
	fmt.Fprint(w, `Usage: grouprouter publish [flags] SUBJECT [BODY]

Publishes one message, as a producer does, and waits for JetStream's
PubAck: "stored" means the ingress stream holds it and a node will route
it. SUBJECT must be under the routers' --address (jms.> by default).

Flags:
`)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

func parsePublishArgs(args []string, env environment) (publishOptions, error) {
	var (
		o  publishOptions
		hf headerFlags
	)
	fs, conn := newPublishFlags(&o, &hf)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, &usageError{cmd: "publish", msg: err.Error()}
	}
	if fs.NArg() < 1 || fs.NArg() > 2 {
		return o, &usageError{cmd: "publish", msg: fmt.Sprintf("want SUBJECT [BODY], got %d arguments", fs.NArg())}
	}
	o.subject, o.body = fs.Arg(0), fs.Arg(1)
	if o.subject == "" || strings.ContainsAny(o.subject, " \t\r\n*>") {
		return o, &usageError{cmd: "publish", msg: fmt.Sprintf("invalid SUBJECT %q: no spaces or wildcards", clip(o.subject))}
	}
	if !router.ValidHeaderName(o.groupHeader) {
		return o, fmt.Errorf("%w: group header %q is not a valid header name", router.ErrConfig, o.groupHeader)
	}
	if o.group != "" {
		if err := kvbinding.ValidateGroupID(o.group); err != nil {
			msg := strings.TrimPrefix(err.Error(), kvbinding.ErrInvalidGroupID.Error()+": ")
			return o, &usageError{cmd: "publish", msg: fmt.Sprintf("invalid --group %q: %s", clip(o.group), msg)}
		}
	}
	o.headers = hf.h
	if o.headers == nil {
		o.headers = nats.Header{}
	}
	if o.group != "" {
		o.headers.Set(o.groupHeader, o.group)
	}
	var err error
	if o.conn, err = conn.resolve(env, defaultNATSURL); err != nil {
		return o, err
	}
	return o, nil
}

// publishMessage is the publish subcommand.
func publishMessage(ctx context.Context, args []string, env environment, stdout, stderr io.Writer) error {
	o, err := parsePublishArgs(args, env)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printPublishUsage(stdout)
		}
		return err
	}
	nc, js, err := connectClient(o.conn, "publish", warnTo(stderr))
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	before := nc.LastError()
	m := &nats.Msg{Subject: o.subject, Header: o.headers, Data: []byte(o.body)}
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) {
			return fmt.Errorf("no stream stores %q at %s: is a grouprouter node running, and the subject under its --address?",
				o.subject, redactURLs(o.conn.URL))
		}
		return requestError(err, o.conn, nc, before, "publish")
	}
	group := displayGroup(o.group)
	fmt.Fprintf(stdout, "stored: stream %s seq %d, group %s\n", ack.Stream, ack.Sequence, group)
	return nil
}
