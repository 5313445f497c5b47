package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/grouprouter/grouprouter/internal/retry"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

const (
	// defaultMoveTimeout is the default --timeout of move and unbind.
	defaultMoveTimeout = 10 * time.Second
	// movePollInterval is how often --wait reads the group's record.
	movePollInterval = 100 * time.Millisecond
)

// Operations of moveGroup.
const (
	opMove   = "move"
	opUnbind = "unbind"
)

// moveOptions is what the move and unbind subcommands need, parsed and
// checked.
type moveOptions struct {
	op      string // opMove or opUnbind
	conn    connSettings
	timeout msDuration
	asJSON  bool
	wait    bool
	group   string // verbatim
	node    string // the target; "" for unbind
}

func newMoveFlags(op string, fs *flag.FlagSet) *moveOptions {
	o := &moveOptions{op: op, timeout: msDuration(defaultMoveTimeout)}
	fs.Var(&o.timeout, "timeout", "how long to wait for the LOCAL handler's answer, and with --wait for the hand-over: a `DURATION` like 10s, or milliseconds like 10000")
	fs.BoolVar(&o.asJSON, "json", false, "print the record as a JSON object (as 'bindings --json' prints one) instead of a table")
	done := "the group is bound to NODE and its new node has taken it over"
	if op == opUnbind {
		done = "the group is released"
	}
	fs.BoolVar(&o.wait, "wait", false, "wait until "+done+" (at most --timeout), then print the final record")
	return o
}

// moveHelp is the help of move (op opMove) or unbind (op opUnbind).
func moveHelp(op string) string {
	what := `Usage: grouprouter move [flags] GROUP NODE

Moves group GROUP to node NODE. The active LOCAL handler writes a "moving"
record; the node the group is bound to then stops routing it and hands it
over to NODE with its waiting messages, in order: NODE moves them to its
own queue before it routes anything else of the group. NODE must be alive
and, when some node's queue has a consumer, have one too.
`
	if op == opUnbind {
		what = `Usage: grouprouter unbind [flags] GROUP

Ends the binding of group GROUP. The active LOCAL handler writes a
"moving" record without a target; the node the group is bound to then
stops routing it, routes what it has of it, in order, and releases it.
The group's next message gets a new binding, as a new group's does (the
old node keeps it when it is eligible).
`
	}
	return what + `
GROUP is taken verbatim: any UTF-8 text, spaces and dots included (quote it
for the shell; put -- before a GROUP that starts with '-'). Flags go before
the arguments.

The command prints the record written; 'grouprouter bindings' shows when
the hand-over is done. With --wait it waits for that and prints the final
record instead; meanwhile it shows how far the hand-over is: the step
(moving, drain, catchup, settled) and, in a long step, the messages moved
off the old queues and routed from the ingress so far (from the new
node's progress events). On a terminal that is one line rewritten in
place, otherwise a line per change; with --json it goes to stderr, and
only when that is a terminal.

Exit codes: 0 done; 1 refused (the group is not bound, the node is not
eligible, the group is being moved already) or failed (no LOCAL handler
answering, timeout); 2 bad arguments.

Flags:
`
}

// check reads GROUP (and NODE) and checks the flags.
func (o *moveOptions) check(in *invocation) error {
	want := []string{"GROUP", "NODE"}
	if o.op == opUnbind {
		want = want[:1]
	}
	pos := in.args()
	if len(pos) != len(want) {
		msg := fmt.Sprintf("want %s, got %d argument%s", strings.Join(want, " "), len(pos), plural(len(pos)))
		for _, a := range pos {
			if len(a) > 1 && strings.HasPrefix(a, "-") && in.fs.Lookup(strings.TrimLeft(strings.SplitN(a, "=", 2)[0], "-")) != nil {
				msg = fmt.Sprintf("flag %s must come before %s", a, strings.Join(want, " "))
				break
			}
		}
		return in.usagef("%s", msg)
	}
	o.group = pos[0]
	if err := kvbinding.ValidateGroupID(o.group); err != nil {
		msg := strings.TrimPrefix(err.Error(), kvbinding.ErrInvalidGroupID.Error()+": ")
		return in.usagef("invalid GROUP %q: %s", clip(o.group), msg)
	}
	if o.op == opMove {
		o.node = pos[1]
		if err := kvbinding.ValidateNodeID(o.node); err != nil {
			return in.usagef("invalid NODE: %v", err)
		}
	}
	if o.timeout <= 0 {
		return fmt.Errorf("%w: --timeout must be > 0, got %v", router.ErrConfig, time.Duration(o.timeout))
	}
	return nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// run asks the LOCAL handler for the move or unbind, and with --wait
// follows it.
func (o *moveOptions) run(ctx context.Context, in *invocation) error {
	nc, js, stdout, stderr, env := in.nc, in.js, in.stdout, in.stderr, in.env
	o.conn = in.conn // for the messages
	timeout := time.Duration(o.timeout)
	var events <-chan proposals.Event
	if o.wait {
		// Before the request: a hand-over's progress events may come
		// before its reply.
		var unsubscribe func()
		events, unsubscribe = followProgress(nc)
		defer unsubscribe()
	}
	before := nc.LastError()
	b, err := proposals.Move(ctx, nc, o.group, o.node, timeout)
	if err != nil {
		if v := retry.Violation(nc, before); v != nil {
			return fmt.Errorf("%s: %w", o.what(), permissionError(v, o.conn, redactURLs(o.conn.URL)))
		}
		return o.moveError(err)
	}
	if !o.wait {
		return o.print(stdout, &b, false)
	}

	// OpenStore would create a missing bucket; waiting must not.
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := requireBucket(wctx, nc, js, o.conn, kvbinding.DefaultBucket, "bindings"); err != nil {
		return fmt.Errorf("%s: %w", o.what(), err)
	}
	store, err := kvbinding.OpenStore(wctx, js, kvbinding.StoreConfig{})
	if err != nil {
		return fmt.Errorf("%s: %w", o.what(), err)
	}
	// Progress goes to stdout before the final record, rewritten in place
	// on a terminal; with --json (stdout is for the record) to stderr,
	// and only when that is a terminal.
	line := &progressLine{w: stdout, terminal: isTerminal(stdout, env)}
	if o.asJSON {
		line = &progressLine{w: stderr, terminal: isTerminal(stderr, env)}
		if !line.terminal {
			line.w = io.Discard
		}
	}
	w := &moveWatch{o: *o, written: b, start: time.Now(), line: line}
	final, err := o.waitDone(ctx, wctx, store, b, events, w)
	w.line.finish("")
	if err != nil {
		return err
	}
	return o.print(stdout, final, true)
}

// what names the operation for messages: move "order-42".
func (o moveOptions) what() string { return fmt.Sprintf("%s %q", o.op, o.group) }

// moveError turns an error of proposals.Move into the command's message.
func (o moveOptions) moveError(err error) error {
	for _, sentinel := range []error{proposals.ErrUnknownGroup, proposals.ErrIneligibleNode, proposals.ErrMoveInProgress, proposals.ErrHandlerFailed} {
		if !errors.Is(err, sentinel) {
			continue
		}
		// The handler's message is `<op> "<group>": <reason>`.
		msg := strings.TrimPrefix(err.Error(), sentinel.Error()+": ")
		if !strings.HasPrefix(msg, o.what()+": ") {
			msg = o.what() + ": " + msg
		}
		if sentinel == proposals.ErrHandlerFailed {
			msg += " (the LOCAL handler failed)"
		}
		return errors.New(msg)
	}
	switch {
	case errors.Is(err, proposals.ErrNoHandler):
		return fmt.Errorf("%s: no LOCAL grouping handler is answering at %s: is a LOCAL node running?", o.what(), redactURLs(o.conn.URL))
	case errors.Is(err, proposals.ErrDecisionTimeout):
		return fmt.Errorf("%s: the LOCAL handler did not answer within %v (whether the %s was done is unknown: see 'grouprouter bindings')",
			o.what(), time.Duration(o.timeout), o.op)
	}
	return fmt.Errorf("%s: %w", o.what(), err)
}

// waitDone polls the group's record until the operation is done, wctx
// ends or the record shows it was overtaken. written is the record the
// handler wrote. It returns the final record, nil when the group has no
// record left (unbind).
func (o moveOptions) waitDone(ctx, wctx context.Context, store *kvbinding.Store, written kvbinding.Binding,
	events <-chan proposals.Event, w *moveWatch) (*kvbinding.Binding, error) {
	t := time.NewTicker(movePollInterval)
	defer t.Stop()
	cur := written
	for {
		done, err := o.doneBy(cur, written)
		if done || err != nil {
			w.drainEvents(events)
			if done {
				w.settled(cur)
			}
			if !cur.Stored() {
				return nil, err
			}
			return &cur, err
		}
		w.record(cur)
		select {
		case e := <-events:
			w.event(e)
			continue
		case <-t.C:
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%s: interrupted while waiting; it goes on: see 'grouprouter bindings'", o.what())
			}
			return nil, fmt.Errorf("%s: not done after %v: %s; see 'grouprouter bindings'", o.what(), time.Duration(o.timeout), describeRecord(cur))
		}
		b, err := store.Get(wctx, o.group)
		switch {
		case err == nil:
			if b.Revision < written.Revision {
				continue // a stale read (from a replica behind): not yet ours
			}
			cur = b
		case errors.Is(err, kvbinding.ErrNotFound):
			cur = kvbinding.Binding{}
		case wctx.Err() != nil:
			// reported at the top of the next round
		default:
			return nil, fmt.Errorf("%s: reading the group's record: %w", o.what(), err)
		}
	}
}

// doneBy reports whether cur, the group's record now (the zero Binding
// when it has none), shows the operation done, or an error when it shows
// that something else overtook it.
func (o moveOptions) doneBy(cur, written kvbinding.Binding) (bool, error) {
	var rec *kvbinding.Binding
	if cur.Stored() {
		rec = &cur
	}
	if proposals.MoveDone(rec, o.node) {
		return true, nil
	}
	switch {
	case o.op == opUnbind:
		return false, nil
	case rec == nil:
		return false, fmt.Errorf("%s: the group's record is gone (expired or deleted)", o.what())
	case cur.Node == o.node && cur.Phase().Current():
		return false, nil // on its way
	}
	return false, fmt.Errorf("%s: overtaken: %s", o.what(), describeRecord(cur))
}

// describeRecord says in words where a group's record stands.
func describeRecord(b kvbinding.Binding) string { return b.Describe() }

// print writes the record (nil: the group has none) as JSON or as a table
// with a note; final says whether it is the outcome of --wait.
func (o moveOptions) print(w io.Writer, b *kvbinding.Binding, final bool) error {
	if o.asJSON {
		if b == nil {
			_, err := fmt.Fprintln(w, "null")
			return err
		}
		return writeBindingJSON(w, *b)
	}
	if b != nil {
		if err := writeBindingsTable(w, []kvbinding.Binding{*b}); err != nil {
			return err
		}
		if _, err := fmt.Fprintln(w); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintln(w, o.note(b, final))
	return err
}

// note explains the record printed.
func (o moveOptions) note(b *kvbinding.Binding, final bool) string {
	g := fmt.Sprintf("%q", o.group)
	if b == nil {
		return fmt.Sprintf("Group %s has no binding: the unbind is done; its next message gets a new one.", g)
	}
	phase := b.Phase()
	switch {
	case phase == kvbinding.PhaseMoving && b.Node != "":
		return fmt.Sprintf("Group %s is moving from %s to %s: %s hands it over with its waiting messages, in order.\n"+
			"'grouprouter bindings' shows when it is done: the group is then bound to %s.", g, b.PrevNode, b.Node, b.PrevNode, b.Node)
	case phase == kvbinding.PhaseMoving:
		return fmt.Sprintf("Group %s is being unbound: %s routes what it has of it, in order, and then releases it.\n"+
			"'grouprouter bindings' shows when it is done: the group is then released.", g, b.PrevNode)
	case o.op == opMove && phase.Bound() && b.Node == o.node && !final:
		return fmt.Sprintf("Group %s is bound to %s already: nothing to move.", g, b.Node)
	case o.op == opMove && phase.Bound() && b.Node == o.node:
		return fmt.Sprintf("Group %s is bound to %s: the move is done.", g, b.Node)
	case o.op == opUnbind && phase == kvbinding.PhaseReleased:
		return fmt.Sprintf("Group %s is released: the unbind is done; its next message gets a new binding.", g)
	case o.op == opUnbind && final:
		return fmt.Sprintf("Group %s was released: the unbind is done; a new message has bound it again since.", g)
	}
	return fmt.Sprintf("Group %s: %s.", g, describeRecord(*b))
}

// writeBindingJSON writes one record as 'bindings --json' writes each.
func writeBindingJSON(w io.Writer, b kvbinding.Binding) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(bindingJSON{Binding: b, Revision: b.Revision})
}
