package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/internal/jsonx"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// whereOptions is what the where subcommand was asked for.
type whereOptions struct {
	conn        connSettings
	asJSON      bool
	groupHeader string
	group       string // verbatim; "" with --ungrouped
	ungrouped   bool
}

func newWhereFlags(fs *flag.FlagSet) *whereOptions {
	o := &whereOptions{}
	fs.BoolVar(&o.asJSON, "json", false, "print a JSON object instead of text")
	fs.BoolVar(&o.ungrouped, "ungrouped", false, "show the messages without a group id (the routing binding shown as "+ungroupedLabel+"), instead of GROUP")
	fs.StringVar(&o.groupHeader, "group-header", router.DefaultGroupHeader, "`HEADER` holding the group id on queue messages")
	return o
}

// whereHelp is the where command's help.
func whereHelp() string {
	return `Usage: grouprouter where [flags] GROUP
       grouprouter where [flags] --ungrouped

Shows where group GROUP is: its record (node, state, since when, decided
and proposed by, previous node, a hand-over in progress, the reason), its
messages on each queue that may hold them (the node's, the previous
node's and those being drained; every queue when the group has no
record): waiting (not delivered yet), unacked (delivered, not
acknowledged: still on the queue with a stream sequence at most the
node's consumer's last delivered one) and the age of the oldest, and the
messages each router holds undecided (every router holds the same ones;
"held" is the most any holds). A group a consumer parked shows its
parked record: the node, the ingress seq and attempts, since when, how
many messages wait in the parked stream, and the handler's error.

GROUP is taken verbatim (quote it for the shell). A group that is nowhere
is shown as unbound, with nothing waiting. --ungrouped shows the messages
that carry no group id instead: their routing binding, "(ungrouped)" in
groups (where ungrouped is the group named "ungrouped").

Flags:
`
}

// check validates the flags and arguments.
func (o *whereOptions) check(in *invocation) error {
	switch {
	case o.ungrouped && in.fs.NArg() != 0:
		return &usageError{cmd: in.cmd, msg: fmt.Sprintf("want GROUP or --ungrouped, not both (got %q)", clip(in.fs.Arg(0)))}
	case !o.ungrouped && in.fs.NArg() != 1:
		return &usageError{cmd: in.cmd, msg: fmt.Sprintf("want GROUP, got %d arguments (--ungrouped for the messages without a group)", in.fs.NArg())}
	case !o.ungrouped:
		o.group = in.fs.Arg(0)
		if err := kvbinding.ValidateGroupID(o.group); err != nil {
			msg := strings.TrimPrefix(err.Error(), kvbinding.ErrInvalidGroupID.Error()+": ")
			return &usageError{cmd: in.cmd, msg: fmt.Sprintf("invalid GROUP %q: %s", clip(o.group), msg)}
		}
	}
	if !router.ValidHeaderName(o.groupHeader) {
		return fmt.Errorf("%w: group header %q is not a valid header name", router.ErrConfig, o.groupHeader)
	}
	return nil
}

// nodeQueue is a group's messages on one node's queue.
type nodeQueue struct {
	node string
	queueCount
}

// whereResult is everything where shows.
type whereResult struct {
	row      groupRow
	heldBack map[string]int // its messages on each node's held subject
	queues   []nodeQueue    // by node
	heldOn   []heldOn       // by node
	parked   *parkedJSON    // when a consumer parked it
}

// run shows where the group is.
func (o *whereOptions) run(ctx context.Context, in *invocation) error {
	nc, js := in.nc, in.js
	stdout, stderr := in.stdout, in.stderr
	// A timeout for the lookups; the queue scan takes as long as the
	// backlog needs (interrupt it with ^C).
	setupCtx, cancel := context.WithTimeout(ctx, nodesTimeout)
	defer cancel()
	if err := requireBucket(setupCtx, nc, js, in.conn, kvbinding.DefaultBucket, "bindings"); err != nil {
		return err
	}
	store, err := kvbinding.OpenStore(setupCtx, js, kvbinding.StoreConfig{})
	if err != nil {
		return err
	}
	defer store.Close()
	var res whereResult
	b, err := store.Get(setupCtx, o.group)
	switch {
	case err == nil:
		res.row.b = b
	case errors.Is(err, kvbinding.ErrNotFound):
		res.row.b = kvbinding.Binding{Group: o.group}
		if o.group == ungroupedLabel {
			fmt.Fprintf(stderr, "grouprouter where: no group named %q; for the messages without a group id: grouprouter where --ungrouped\n", ungroupedLabel)
		}
	default:
		return err
	}
	held, _, err := heldGroups(setupCtx, js)
	if err != nil {
		return err
	}
	res.heldOn = held[o.group]
	res.row.held = maxHeld(res.heldOn)
	if key, err := kvbinding.Key(o.group); err == nil && !o.ungrouped {
		back, err := heldBackCounts(setupCtx, js, router.HeldFilter("*", key))
		if err != nil {
			return err
		}
		res.heldBack = back[key]
		res.row.heldBack = sumHeldBack(res.heldBack)
	}

	// The queues that may hold the group's messages: its node's, the
	// previous node's, those being drained; all when it has no record.
	var nodes []string
	for _, n := range append([]string{b.Node, b.PrevNode}, b.Drain...) {
		if n != "" && !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	perNode := map[string]*queueCount{}
	for _, n := range nodes {
		perNode[n] = &queueCount{}
	}
	err = scanQueues(ctx, js, o.groupHeader, nodes, func(m queueMsg) {
		if m.group != o.group {
			return
		}
		q := perNode[m.node]
		if q == nil {
			q = &queueCount{}
			perNode[m.node] = q
		}
		q.add(m)
	})
	if err != nil {
		return err
	}
	for n, q := range perNode {
		res.queues = append(res.queues, nodeQueue{node: n, queueCount: *q})
		res.row.q.merge(*q)
	}
	slices.SortFunc(res.queues, func(a, b nodeQueue) int { return strings.Compare(a.node, b.node) })
	if !o.ungrouped {
		// Messages without a group are never parked as a group.
		switch pg, err := consumer.GetParked(setupCtx, js, o.group); {
		case err == nil:
			p := toParkedJSON(pg)
			res.parked = &p
		case !errors.Is(err, consumer.ErrNotParked):
			fmt.Fprintf(stderr, "grouprouter where: cannot tell whether the group is parked: %v\n", err)
		}
	}

	if o.asJSON {
		return writeWhereJSON(stdout, &res)
	}
	return writeWhereText(stdout, &res, time.Now())
}

func writeWhereJSON(w io.Writer, res *whereResult) error {
	buf := res.row.appendJSON(nil)
	buf = append(buf, `,"queues":[`...)
	for i, q := range res.queues {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"node":`...)
		buf = jsonx.AppendString(buf, q.node)
		buf = append(buf, `,"waiting":`...)
		buf = strconv.AppendInt(buf, int64(q.waiting), 10)
		buf = append(buf, `,"unacked":`...)
		buf = strconv.AppendInt(buf, int64(q.unacked), 10)
		if !q.oldest.IsZero() {
			buf = append(buf, `,"oldest":`...)
			buf = appendJSONTime(buf, q.oldest)
		}
		buf = append(buf, '}')
	}
	buf = append(buf, `],"held_back_on":[`...)
	for i, n := range sortedNodes(res.heldBack) {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"node":`...)
		buf = jsonx.AppendString(buf, n)
		buf = append(buf, `,"count":`...)
		buf = strconv.AppendInt(buf, int64(res.heldBack[n]), 10)
		buf = append(buf, '}')
	}
	buf = append(buf, `],"held_on":[`...)
	for i, h := range res.heldOn {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"node":`...)
		buf = jsonx.AppendString(buf, h.node)
		buf = append(buf, `,"count":`...)
		buf = strconv.AppendInt(buf, int64(h.Count), 10)
		buf = append(buf, `,"oldest_seq":`...)
		buf = strconv.AppendUint(buf, h.OldestSeq, 10)
		buf = append(buf, `,"since":`...)
		buf = appendJSONTime(buf, h.Since)
		buf = append(buf, '}')
	}
	buf = append(buf, ']')
	if res.parked != nil {
		p, err := json.Marshal(res.parked)
		if err != nil {
			return err
		}
		buf = append(buf, `,"parked":`...)
		buf = append(buf, p...)
	}
	buf = append(buf, '}')
	var out bytes.Buffer
	if err := json.Indent(&out, buf, "", "  "); err != nil {
		return fmt.Errorf("where --json: %w", err) // a bug: the encoding above is wrong
	}
	out.WriteByte('\n')
	_, err := out.WriteTo(w)
	return err
}

func writeWhereText(w io.Writer, res *whereResult, now time.Time) error {
	r, b := &res.row, &res.row.b
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	line := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	line("group", displayGroup(b.Group))
	line("state", r.state())
	if b.Stored() {
		line("node", r.nodeColumn())
		line("since", fmt.Sprintf("%s (%s ago)", formatTime(b.DecidedAt), age(now, b.DecidedAt)))
		fromSeq := "from seq " + strconv.FormatUint(b.FromSeq, 10)
		if b.ThroughSeq > 0 {
			fromSeq = "through seq " + strconv.FormatUint(b.ThroughSeq, 10)
		}
		line("decided by", orDash(b.DecidedBy)+", "+fromSeq)
		line("why", r.why())
		line("revision", strconv.FormatUint(b.Revision, 10))
		if b.Phase().Current() {
			// What the group's queued messages carry in Grouping-Epoch.
			line("epoch", strconv.FormatUint(b.OwnerEpoch(), 10))
		}
	}
	line("waiting", strconv.Itoa(r.q.waiting))
	line("unacked", strconv.Itoa(r.q.unacked))
	oldest := "-"
	if !r.q.oldest.IsZero() {
		oldest = fmt.Sprintf("%s ago (%s)", age(now, r.q.oldest), formatTime(r.q.oldest))
	}
	line("oldest", oldest)
	for _, q := range res.queues {
		line("queue "+q.node, fmt.Sprintf("%d waiting, %d unacked, oldest %s", q.waiting, q.unacked, age(now, q.oldest)))
	}
	for _, n := range sortedNodes(res.heldBack) {
		line("held back on "+n, fmt.Sprintf("%d: past its share of %s's queue window, they go onto the queue as its consumer acknowledges the earlier ones", res.heldBack[n], n))
	}
	line("held", strconv.Itoa(r.held))
	for _, h := range res.heldOn {
		line("held on "+h.node, fmt.Sprintf("%d from seq %d, since %s (%s ago)", h.Count, h.OldestSeq, formatTime(h.Since), age(now, h.Since)))
	}
	if p := res.parked; p != nil {
		st := p.State
		if p.Mode != "" {
			st += " (" + p.Mode + ")"
		}
		line("parked", fmt.Sprintf("%s by node %s at ingress seq %d after %d attempt(s), since %s (%s ago); %d message(s) parked, head %s",
			st, p.Node, p.FirstSeq, p.Attempts, formatTime(p.Since), age(now, p.Since), p.Messages, seqOrDash(p.Head)))
		line("parked why", flatLine(p.Reason))
	}
	return tw.Flush()
}

// sortedNodes returns m's node ids, sorted.
func sortedNodes(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
