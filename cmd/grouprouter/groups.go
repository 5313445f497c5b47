package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// groupStates are the values --state accepts besides the record states.
const (
	stateCurrent = "current" // the default: bound or moving, or anything with messages
	stateAll     = "all"
)

// groupsTableBlock is how many rows the table aligns at a time: a listing
// is printed as the bucket is read, not held whole in memory.
const groupsTableBlock = 4096

// groupsOptions is what the groups subcommand was asked for.
type groupsOptions struct {
	conn        connSettings
	node        string
	state       string
	asJSON      bool
	groupHeader string
}

func newGroupsFlags(fs *flag.FlagSet) *groupsOptions {
	o := &groupsOptions{}
	fs.StringVar(&o.node, "node", "", "only the groups of node `ID`: bound to it, moving off it, or with messages on its queue (only its queue is read)")
	fs.StringVar(&o.state, "state", stateCurrent, "only groups in `STATE`: bound, moving, released, dead-lettered, unbound, current (bound or moving, or with messages waiting, unacked or held) or all")
	fs.BoolVar(&o.asJSON, "json", false, "print a JSON array, one object per line, instead of a table")
	fs.StringVar(&o.groupHeader, "group-header", router.DefaultGroupHeader, "`HEADER` holding the group id on queue messages")
	return o
}

// groupsHelp is the groups command's help.
func groupsHelp() string {
	return `Usage: grouprouter groups [flags]

Lists the groups: where each is bound, since when and why, and how many of
its messages are on queues or held by the routers, in the order of their
last change (oldest first; pipe through sort for another order).

  NODE        the bound node; old->new while a move is in progress
  STATE       bound, moving, released, dead-lettered, or unbound (no record,
              but messages held or on a queue)
  SINCE       when the record was written (decided_at)
  WAITING     messages of the group on node queues, not yet delivered
  UNACKED     delivered to a consumer, not acknowledged yet: still on the
              queue with a stream sequence at most the node's consumer's
              last delivered one (acked messages leave the work queue)
  OLDEST      age of the oldest of those messages on a queue
  HELD        messages held undecided by the routers (every router holds
              the same ones; each lists at most 100 groups)
  DECIDED-BY  the handler (name/node) or node that wrote the record
  WHY         who proposed it, the previous node, a hand-over in progress,
              the reason

The queues are read message by message (the server allows no other
consumer on a work queue): a long backlog takes a while. The table is
aligned per 4096 rows.

Flags:
`
}

// check validates the flags and arguments.
func (o *groupsOptions) check(in *invocation) error {
	if o.node != "" {
		if err := kvbinding.ValidateNodeID(o.node); err != nil {
			return &usageError{cmd: in.cmd, msg: "invalid --node: " + err.Error()}
		}
	}
	switch o.state {
	case stateCurrent, stateAll, stateUnbound, string(kvbinding.StateBound), string(kvbinding.StateMoving),
		string(kvbinding.StateReleased), string(kvbinding.StateDeadLettered):
	default:
		return &usageError{cmd: in.cmd, msg: fmt.Sprintf("unknown --state %q (want bound, moving, released, dead-lettered, unbound, current or all)", o.state)}
	}
	if !router.ValidHeaderName(o.groupHeader) {
		return fmt.Errorf("%w: group header %q is not a valid header name", router.ErrConfig, o.groupHeader)
	}
	return nil
}

// run lists the groups asked for.
func (o *groupsOptions) run(ctx context.Context, in *invocation) error {
	nc, js := in.nc, in.js
	stdout := in.stdout
	setupCtx, cancel := context.WithTimeout(ctx, nodesTimeout)
	defer cancel()
	if err := requireBucket(setupCtx, nc, js, in.conn, kvbinding.DefaultBucket, "bindings"); err != nil {
		return err
	}
	held, _, err := heldGroups(setupCtx, js)
	if err != nil {
		return err
	}
	heldFilter := router.HeldFilter("*", "*.*")
	var nodes []string
	if o.node != "" {
		nodes = []string{o.node}
		heldFilter = router.HeldFilter(o.node, "*.*")
	}
	heldBack, err := heldBackCounts(setupCtx, js, heldFilter)
	if err != nil {
		return err
	}
	backOf := func(g string) int {
		key, err := kvbinding.Key(g)
		if err != nil {
			return 0
		}
		return sumHeldBack(heldBack[key])
	}
	queued := map[string]*queueCount{}
	err = scanQueues(ctx, js, o.groupHeader, nodes, func(m queueMsg) {
		q := queued[m.group]
		if q == nil {
			q = &queueCount{}
			queued[m.group] = q
		}
		q.add(m)
	})
	if err != nil {
		return err
	}

	w := newGroupsWriter(stdout, o.asJSON)
	now := time.Now()
	show := func(row *groupRow) error {
		if !o.keep(row) {
			return nil
		}
		return w.row(row, now)
	}
	err = kvbinding.ScanBindings(ctx, js, kvbinding.DefaultBucket, func(b kvbinding.Binding) error {
		row := groupRow{b: b, heldBack: backOf(b.Group)}
		if q := queued[b.Group]; q != nil {
			row.q = *q
			delete(queued, b.Group)
		}
		if on, ok := held[b.Group]; ok {
			row.held = maxHeld(on)
			delete(held, b.Group)
		}
		return show(&row)
	})
	if err != nil {
		return err
	}
	// Groups without a record (held undecided, or left on a queue), by id.
	var rest []string
	for g := range queued {
		rest = append(rest, g)
	}
	for g := range held {
		if queued[g] == nil && o.node == "" {
			rest = append(rest, g)
		}
	}
	slices.Sort(rest)
	for _, g := range rest {
		row := groupRow{b: kvbinding.Binding{Group: g}, held: maxHeld(held[g])}
		if q := queued[g]; q != nil {
			row.q = *q
		}
		if err := show(&row); err != nil {
			return err
		}
	}
	return w.close()
}

// keep applies --node and --state to a row.
func (o *groupsOptions) keep(r *groupRow) bool {
	busy := r.q.waiting > 0 || r.q.unacked > 0 || r.held > 0 || r.heldBack > 0
	switch o.state {
	case stateAll:
	case stateCurrent:
		if !r.b.Phase().Current() && !busy {
			return false
		}
	default:
		if r.state() != o.state {
			return false
		}
	}
	// --node: bound to the node, moving off it, or with messages on its
	// queue (the only queue read then).
	return o.node == "" || r.b.Node == o.node || (r.b.Phase() == kvbinding.PhaseMoving && r.b.PrevNode == o.node) ||
		r.q.waiting+r.q.unacked > 0
}

// groupsWriter prints rows as they come: a JSON array with one object per
// line, or a table aligned per groupsTableBlock rows.
type groupsWriter struct {
	out    *bufio.Writer
	tw     *tabwriter.Writer
	asJSON bool
	rows   int
	buf    []byte
}

func newGroupsWriter(w io.Writer, asJSON bool) *groupsWriter {
	gw := &groupsWriter{out: bufio.NewWriterSize(w, 64<<10), asJSON: asJSON}
	if !asJSON {
		gw.tw = tabwriter.NewWriter(gw.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(gw.tw, "GROUP\tNODE\tSTATE\tSINCE\tWAITING\tUNACKED\tOLDEST\tHELD\tHELD-BACK\tDECIDED-BY\tWHY")
	}
	return gw
}

func (w *groupsWriter) row(r *groupRow, now time.Time) error {
	w.rows++
	if w.asJSON {
		w.buf = w.buf[:0]
		if w.rows == 1 {
			w.buf = append(w.buf, "[\n  "...)
		} else {
			w.buf = append(w.buf, ",\n  "...)
		}
		w.buf = append(r.appendJSON(w.buf), '}')
		_, err := w.out.Write(w.buf)
		return err
	}
	_, err := fmt.Fprintf(w.tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%d\t%d\t%s\t%s\n",
		displayGroup(r.b.Group), r.nodeColumn(), r.state(), formatTime(r.b.DecidedAt),
		r.q.waiting, r.q.unacked, age(now, r.q.oldest), r.held, r.heldBack, orDash(r.b.DecidedBy), r.why())
	if err == nil && w.rows%groupsTableBlock == 0 {
		err = w.tw.Flush()
	}
	return err
}

func (w *groupsWriter) close() error {
	if w.asJSON {
		if w.rows == 0 {
			w.out.WriteString("[]\n")
		} else {
			w.out.WriteString("\n]\n")
		}
	} else if err := w.tw.Flush(); err != nil {
		return err
	}
	return w.out.Flush()
}
