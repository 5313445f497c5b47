package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// parkedJSON is a parked group as parked --json and where --json print it.
type parkedJSON struct {
	Group string `json:"group"`
	// Node is the node whose consumer parked it (or is asked to replay it).
	Node string `json:"node"`
	// FirstSeq is the ingress seq of the message it parked at; Head the
	// first one still parked (0: none).
	FirstSeq uint64 `json:"first_seq"`
	Head     uint64 `json:"head"`
	Messages uint64 `json:"messages"`
	// State is "parked" or "replay" (retry, skip or release asked).
	State    string    `json:"state"`
	Mode     string    `json:"mode,omitempty"`
	Reason   string    `json:"reason"`
	Attempts int       `json:"attempts"`
	Since    time.Time `json:"since"`
}

func toParkedJSON(pg consumer.ParkedGroup) parkedJSON {
	st := "parked"
	if pg.Record.State == consumer.StateReplay {
		st = "replay"
	}
	return parkedJSON{Group: pg.Group, Node: pg.Record.Node, FirstSeq: pg.Record.IngressSeq, Head: pg.Head, Messages: pg.Messages,
		State: st, Mode: string(pg.Record.Mode), Reason: pg.Record.Reason, Attempts: pg.Record.Attempts, Since: pg.Record.At}
}

// parkedOptions are the parked command's flags.
type parkedOptions struct {
	asJSON bool
}

func newParkedFlags(fs *flag.FlagSet) *parkedOptions {
	o := &parkedOptions{}
	fs.BoolVar(&o.asJSON, "json", false, "print JSON instead of text")
	return o
}

// replayOptions are what retry, skip and release were asked for.
type replayOptions struct {
	cmd    string // retry, skip or release
	asJSON bool
	node   string
	group  string
}

func newReplayFlags(cmd string, fs *flag.FlagSet) *replayOptions {
	o := &replayOptions{cmd: cmd}
	fs.BoolVar(&o.asJSON, "json", false, "print JSON instead of text")
	fs.StringVar(&o.node, "node", "", "`NODE` whose consumer replays the group (default: the node the group is bound to, else the one that parked it)")
	return o
}

// parkedHelp is the help of parked, retry, skip and release.
func parkedHelp(cmd string) string {
	return map[string]string{
		"parked": `Usage: grouprouter parked [flags]

Lists the groups a consumer (package consumer, grouprouter work or
consume) parked: a message of the group failed its attempts, and it and
every later message of the group wait in stream ` + consumer.ParkedStream + `.
NODE is the node that parked it, FIRST the ingress seq it parked at, HEAD
the first still parked, COUNT the parked messages, STATE "parked" or
"replay" (a retry, skip or release runs).
`,
		"retry": `Usage: grouprouter retry [flags] GROUP

Replays parked group GROUP: its consumer handles the parked messages in
ingress order, each once, before any later message of the group, then the
group runs again. A message that fails its attempts again parks the group
again at it.
`,
		"skip": `Usage: grouprouter skip [flags] GROUP

Drops the first parked message of GROUP unhandled (an event "skip" and a
warning give its ingress seq), then replays the rest as retry does.
`,
		"release": `Usage: grouprouter release [flags] GROUP

Replays the parked messages of GROUP as retry does, and releases the
group whatever happens: a message that fails its attempts again is dropped
(an event "skip" with its ingress seq) instead of parking the group.
`,
	}[cmd] + "\nGROUP is taken verbatim (quote it for the shell).\n\nFlags:\n"
}

func (o *parkedOptions) check(*invocation) error { return nil }

// run lists the parked groups.
func (o *parkedOptions) run(ctx context.Context, in *invocation) error {
	nc, js, s, stdout, asJSON := in.nc, in.js, in.conn, in.stdout, o.asJSON
	ctx, cancel := context.WithTimeout(ctx, nodesTimeout)
	defer cancel()
	before := nc.LastError()
	groups, err := consumer.ListParked(ctx, js)
	if err != nil {
		return requestError(err, s, nc, before, "list the parked groups")
	}
	rows := make([]parkedJSON, 0, len(groups))
	for _, g := range groups {
		rows = append(rows, toParkedJSON(g))
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"parked": rows})
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tNODE\tFIRST\tHEAD\tCOUNT\tSTATE\tATTEMPTS\tSINCE\tREASON")
	for _, r := range rows {
		st := r.State
		if r.Mode != "" {
			st += " (" + r.Mode + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%d\t%s\t%s\n", displayGroup(r.Group), r.Node, r.FirstSeq, seqOrDash(r.Head), r.Messages,
			st, r.Attempts, r.Since.UTC().Format(timeLayout), clip(flatLine(r.Reason)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rows) == 0 {
		fmt.Fprintln(stdout, "(no parked group)")
	}
	return nil
}

func seqOrDash(n uint64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatUint(n, 10)
}

func flatLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// check reads GROUP and checks --node.
func (o *replayOptions) check(in *invocation) error {
	if in.fs.NArg() != 1 {
		return in.usagef("want GROUP, got %d arguments", in.fs.NArg())
	}
	o.group = in.fs.Arg(0)
	if err := kvbinding.ValidateGroupID(o.group); err != nil {
		return in.usagef("invalid GROUP %q: %v", clip(o.group), err)
	}
	if o.node != "" {
		if err := kvbinding.ValidateNodeID(o.node); err != nil {
			return fmt.Errorf("%w: node: %v", router.ErrConfig, err)
		}
	}
	return nil
}

// run asks for the replay.
func (o *replayOptions) run(ctx context.Context, in *invocation) error {
	nc, js, s, stdout, stderr := in.nc, in.js, in.conn, in.stdout, in.stderr
	cmd, group, node, asJSON := o.cmd, o.group, o.node, o.asJSON
	ctx, cancel := context.WithTimeout(ctx, nodesTimeout)
	defer cancel()
	before := nc.LastError()
	if node == "" {
		// The group's consumer is its bound node's, when it is bound.
		store, err := kvbinding.OpenStore(ctx, js, kvbinding.StoreConfig{})
		if err == nil {
			if b, err := store.Get(ctx, group); err == nil && b.Node != "" {
				node = b.Node
			}
			store.Close()
		}
	}
	pg, err := consumer.Replay(ctx, js, group, consumer.ReplayMode(cmd), node)
	switch {
	case errors.Is(err, consumer.ErrNotParked), errors.Is(err, consumer.ErrReplaying), errors.Is(err, consumer.ErrNothingToSkip):
		return err
	case err != nil:
		return requestError(err, s, nc, before, cmd+" "+clip(group))
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if cmd == string(consumer.ReplaySkip) {
		log.Warn("grouprouter skip: the head parked message is dropped unhandled", "group", group, "ingress_seq", pg.Record.SkipSeq)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(toParkedJSON(pg))
	}
	fmt.Fprintln(stdout, replayLine(cmd, group, pg))
	return nil
}

// replayLine says what retry, skip or release (cmd) asked of group, as
// Replay returned it: pg.Messages counts the group's parked messages as
// the replay was asked, those the replay drops unhandled (ingress seq up
// to Record.SkipSeq) included.
func replayLine(cmd, group string, pg consumer.ParkedGroup) string {
	head := fmt.Sprintf("%s %s: node %s", cmd, displayGroup(group), pg.Record.Node)
	skip, first := pg.Record.SkipSeq, pg.Record.IngressSeq
	switch {
	case cmd == string(consumer.ReplaySkip) && skip == first:
		// The usual skip: the first parked message, and only it.
		return fmt.Sprintf("%s drops the parked message at ingress seq %d unhandled, then replays the %d after it", head, skip, max(pg.Messages, 1)-1)
	case cmd == string(consumer.ReplaySkip):
		// A skip asked again before the replay ran drops every message
		// up to the new head.
		return fmt.Sprintf("%s drops the parked messages up to ingress seq %d unhandled (with an earlier skip not yet done), then replays the rest: %d parked in all",
			head, skip, pg.Messages)
	case skip != 0 && skip >= first:
		return fmt.Sprintf("%s drops the parked messages up to ingress seq %d unhandled (a skip not yet done), then replays the rest from ingress seq %s: %d parked in all",
			head, skip, seqOrDash(pg.Head), pg.Messages)
	}
	return fmt.Sprintf("%s replays %d parked message(s) from ingress seq %s", head, pg.Messages, seqOrDash(pg.Head))
}
