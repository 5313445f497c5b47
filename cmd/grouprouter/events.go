package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// eventKinds are the kinds --kind accepts, in the README's order.
var eventKinds = []string{
	proposals.EventBind, proposals.EventReject, proposals.EventTimeout, proposals.EventDeadLetter,
	proposals.EventHandlerTakeover, proposals.EventMove, proposals.EventHandoff, proposals.EventExpire,
	proposals.EventClose, proposals.EventUnbind, proposals.EventProgress, proposals.EventIngressGap,
	proposals.EventPark, proposals.EventRelease, proposals.EventSkip, proposals.EventLimit,
}

// eventsOptions is what the events subcommand was asked for.
type eventsOptions struct {
	conn    connSettings
	follow  bool
	group   string
	groupOn bool // --group was given (an empty GROUP is the ungrouped binding)
	kind    string
	since   time.Duration // 0: from the start of the stream
	asJSON  bool
}

func newEventsFlags(fs *flag.FlagSet) *eventsOptions {
	o := &eventsOptions{}
	fs.BoolVar(&o.follow, "follow", false, "keep printing new events until interrupted, instead of stopping at the end of the stream")
	fs.Func("group", "only the events of group `GROUP` (taken verbatim)", func(s string) error {
		o.group, o.groupOn = s, true
		return nil
	})
	fs.StringVar(&o.kind, "kind", "", "only events of `KIND`: "+strings.Join(eventKinds, ", "))
	fs.DurationVar(&o.since, "since", 0, "start with the events of the last `DURATION` (like 10m) instead of the oldest kept")
	fs.BoolVar(&o.asJSON, "json", false, "print each event as stored, one JSON object per line")
	return o
}

// eventsHelp is the events command's help.
func eventsHelp() string {
	return fmt.Sprintf(`Usage: grouprouter events [flags]

Prints the events kept in stream %s (grouping.events.<kind>), oldest
first, one line per event: time, kind, group, node(s) (previous -> new for a
move), then sequence, count, attempt, publisher and reason. Without --follow
it stops at the last event stored when it started. An event may be stored
twice (never in practice, but subscribers should not assume it): its "id", a
UUID version 7, is unique.

Flags:
`, router.EventsStream)
}

// check validates the flags and arguments.
func (o *eventsOptions) check(in *invocation) error {
	if o.kind != "" && !slices.Contains(eventKinds, o.kind) {
		return &usageError{cmd: in.cmd, msg: fmt.Sprintf("unknown kind %q (want one of %s)", o.kind, strings.Join(eventKinds, ", "))}
	}
	if o.since < 0 {
		return &usageError{cmd: in.cmd, msg: fmt.Sprintf("--since must be > 0, got %v", o.since)}
	}
	return nil
}

// run prints the events asked for.
func (o *eventsOptions) run(ctx context.Context, in *invocation) error {
	nc, js := in.nc, in.js
	stdout := in.stdout

	setupCtx, cancel := context.WithTimeout(ctx, nodesTimeout)
	defer cancel()
	before := nc.LastError()
	stream, err := js.Stream(setupCtx, router.EventsStream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("no events yet: is a grouprouter node running? (no stream %q at %s)", router.EventsStream, redactURLs(in.conn.URL))
	case err != nil:
		return requestError(err, in.conn, nc, before, "stream "+router.EventsStream)
	}
	last := stream.CachedInfo().State.LastSeq
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if o.kind != "" {
		cfg.FilterSubjects = []string{proposals.SubjectEventsPrefix + o.kind}
	}
	if o.since > 0 {
		start := time.Now().Add(-o.since)
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
	}
	cons, err := js.OrderedConsumer(setupCtx, router.EventsStream, cfg)
	if err != nil {
		return fmt.Errorf("read stream %s: %w", router.EventsStream, err)
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	if !o.asJSON {
		fmt.Fprintln(out, eventsHeader)
	}
	if !o.follow && (last == 0 || cons.CachedInfo().NumPending == 0) {
		return nil
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1024), jetstream.PullHeartbeat(time.Second), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		return fmt.Errorf("read stream %s: %w", router.EventsStream, err)
	}
	defer it.Stop()
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	var line []byte
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil // interrupted (--follow ends so)
			}
			continue // a missed heartbeat: the ordered consumer resets itself
		}
		meta, err := msg.Metadata()
		if err != nil {
			continue
		}
		var e proposals.Event
		if json.Unmarshal(msg.Data(), &e) == nil && (!o.groupOn || e.Group == o.group) {
			if o.asJSON {
				line = append(append(line[:0], msg.Data()...), '\n')
			} else {
				line = appendEventLine(line[:0], e)
			}
			if _, err := out.Write(line); err != nil {
				return err
			}
		}
		done := !o.follow && (meta.NumPending == 0 || meta.Sequence.Stream >= last)
		// Flush when no more is buffered for now, so that a follower sees
		// each event as it comes, and a long listing is not held back.
		if done || meta.NumPending == 0 {
			if err := out.Flush(); err != nil {
				return err
			}
		}
		if done {
			return nil
		}
	}
}

// Column widths of the events table; longer values overflow (a stream is
// printed as it is read, so widths cannot be measured first).
const (
	eventsTimeWidth  = len("2006-01-02T15:04:05.000Z")
	eventsKindWidth  = len("deadletter")
	eventsGroupWidth = 20
	eventsNodesWidth = 14
)

var eventsHeader = fmt.Sprintf("%-*s  %-*s  %-*s  %-*s  %s", eventsTimeWidth, "TIME", eventsKindWidth, "KIND",
	eventsGroupWidth, "GROUP", eventsNodesWidth, "NODE", "DETAILS")

// appendEventLine appends the table line of e, newline included.
func appendEventLine(buf []byte, e proposals.Event) []byte {
	at := "-"
	if !e.At.IsZero() {
		at = e.At.UTC().Format(timeLayout)
	}
	group := displayGroup(e.Group)
	if e.Kind == proposals.EventHandlerTakeover || e.Kind == proposals.EventIngressGap {
		group = "-" // not about a group
	}
	if e.Kind == proposals.EventProgress && e.Groups > 1 {
		group = "(" + strconv.Itoa(e.Groups) + " groups)" // one event for a batch
	}
	nodes := orDash(e.Node)
	if e.PrevNode != "" {
		nodes = orDash(e.PrevNode) + "->" + nodes
	}
	buf = appendPadded(buf, at, eventsTimeWidth)
	buf = appendPadded(buf, orDash(e.Kind), eventsKindWidth)
	buf = appendPadded(buf, group, eventsGroupWidth)
	buf = appendPadded(buf, nodes, eventsNodesWidth)
	sep := ""
	field := func(name, value string) {
		buf = append(buf, sep...)
		buf = append(buf, name...)
		buf = append(buf, '=')
		buf = append(buf, value...)
		sep = " "
	}
	if e.FromSeq != 0 {
		field("seq", strconv.FormatUint(e.FromSeq, 10))
	}
	if e.Step != "" {
		field("step", e.Step)
	}
	if e.Count != 0 {
		field("count", strconv.Itoa(e.Count))
	}
	if e.Total != 0 {
		field("total", strconv.Itoa(e.Total))
	}
	if e.Groups != 0 {
		field("groups", strconv.Itoa(e.Groups))
	}
	if e.Attempt != 0 {
		field("attempt", strconv.Itoa(e.Attempt))
	}
	if e.By != "" {
		field("by", orDash(e.By))
	}
	if e.Reason != "" {
		field("reason", strconv.Quote(e.Reason))
	}
	if sep == "" {
		buf = append(buf, '-')
	}
	return append(buf, '\n')
}

// appendPadded appends s and spaces up to width, then the column gap.
func appendPadded(buf []byte, s string, width int) []byte {
	buf = append(buf, s...)
	for n := len([]rune(s)); n < width; n++ {
		buf = append(buf, ' ')
	}
	return append(buf, "  "...)
}
