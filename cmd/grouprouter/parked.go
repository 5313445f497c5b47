package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"grouprouter/consumer"
	"grouprouter/kvbinding"
	"grouprouter/router"
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

func newParkedFlags(cmd string, asJSON *bool, node *string) (*flag.FlagSet, *connFlags) {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	conn := addConnFlags(fs, natsClientUsage)
	fs.BoolVar(asJSON, "json", false, "print JSON instead of text")
	if node != nil {
		fs.StringVar(node, "node", "", "`NODE` whose consumer replays the group (default: the node the group is bound to, else the one that parked it)")
	}
	return fs, conn
}

var parkedHelp = map[string]string{
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
}

func printParkedUsage(w io.Writer, cmd string) {
	var asJSON bool
	var node string
	np := &node
	if cmd == "parked" {
		np = nil
	}
	fs, _ := newParkedFlags(cmd, &asJSON, np)
	fmt.Fprint(w, parkedHelp[cmd]+"\nGROUP is taken verbatim (quote it for the shell).\n\nFlags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// listParked is the parked subcommand.
func listParked(ctx context.Context, args []string, env environment, stdout, stderr io.Writer) error {
	var asJSON bool
	fs, conn := newParkedFlags("parked", &asJSON, nil)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printParkedUsage(stdout, "parked")
			return err
		}
		return &usageError{cmd: "parked", msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return &usageError{cmd: "parked", msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	s, err := conn.resolve(env, defaultNATSURL)
	if err != nil {
		return err
	}
	nc, js, err := connectClient(s, "parked", warnTo(stderr))
	if err != nil {
		return err
	}
	defer nc.Close()
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

// replayParked is the retry, skip and release subcommands.
func replayParked(ctx context.Context, cmd string, args []string, env environment, stdout, stderr io.Writer) error {
	var (
		asJSON bool
		node   string
	)
	fs, conn := newParkedFlags(cmd, &asJSON, &node)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printParkedUsage(stdout, cmd)
			return err
		}
		return &usageError{cmd: cmd, msg: err.Error()}
	}
	if fs.NArg() != 1 {
		return &usageError{cmd: cmd, msg: fmt.Sprintf("want GROUP, got %d arguments", fs.NArg())}
	}
	group := fs.Arg(0)
	if err := kvbinding.ValidateGroupID(group); err != nil {
		return &usageError{cmd: cmd, msg: fmt.Sprintf("invalid GROUP %q: %v", clip(group), err)}
	}
	if node != "" {
		if err := kvbinding.ValidateNodeID(node); err != nil {
			return fmt.Errorf("%w: node: %v", router.ErrConfig, err)
		}
	}
	s, err := conn.resolve(env, defaultNATSURL)
	if err != nil {
		return err
	}
	nc, js, err := connectClient(s, cmd, warnTo(stderr))
	if err != nil {
		return err
	}
	defer nc.Close()
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
	fmt.Fprintf(stdout, "%s %s: node %s replays %d parked message(s) from ingress seq %s", cmd, displayGroup(group), pg.Record.Node, pg.Messages, seqOrDash(pg.Head))
	if cmd == string(consumer.ReplaySkip) {
		fmt.Fprintf(stdout, ", dropping %d", pg.Record.SkipSeq)
	}
	fmt.Fprintln(stdout)
	return nil
}
