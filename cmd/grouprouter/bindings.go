package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// ungroupedLabel shows the routing binding of messages without a group id.
const ungroupedLabel = "(ungrouped)"

// bindingsHelp is the bindings command's help.
const bindingsHelp = `Usage: grouprouter bindings [flags]

Lists the current group bindings (group -> node; state bound, or moving to
another node) sorted by group, as a table or as JSON. With --all it also
lists the ended records (released, dead-lettered), kept for a while after
the binding ended. 'grouprouter groups' adds what waits on the queues.

Flags:
`

// bindingsFlags are the bindings command's flags.
type bindingsFlags struct {
	asJSON, all bool
}

func newBindingsFlags(fs *flag.FlagSet) *bindingsFlags {
	f := &bindingsFlags{}
	fs.BoolVar(&f.asJSON, "json", false, "print a JSON array of the bindings instead of a table")
	fs.BoolVar(&f.all, "all", false, "also list ended records (released, dead-lettered)")
	return f
}

func (f *bindingsFlags) check(*invocation) error { return nil }

// run lists the bindings.
func (f *bindingsFlags) run(ctx context.Context, in *invocation) error {
	nc, js, s := in.nc, in.js, in.conn
	if err := requireBucket(ctx, nc, js, s, kvbinding.DefaultBucket, "bindings"); err != nil {
		return err
	}
	before := nc.LastError()
	var list []kvbinding.Binding
	err := kvbinding.ScanBindings(ctx, js, kvbinding.DefaultBucket, func(b kvbinding.Binding) error {
		if f.all || b.Phase().Current() {
			list = append(list, b)
		}
		return nil
	})
	if err != nil {
		return requestError(err, s, nc, before, "list the bindings")
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Group < list[j].Group })
	if f.asJSON {
		return writeBindingsJSON(in.stdout, list)
	}
	return writeBindingsTable(in.stdout, list)
}

// bindingJSON is a binding as --json prints it: the stored value plus its
// KV revision.
type bindingJSON struct {
	kvbinding.Binding
	Revision uint64 `json:"revision"`
}

// writeBindingsJSON writes list as one indented JSON array, an element at
// a time: the whole array encoded at once took as much memory again as the
// list (over a gigabyte for a million bindings).
func writeBindingsJSON(w io.Writer, list []kvbinding.Binding) error {
	if len(list) == 0 {
		_, err := io.WriteString(w, "[]\n")
		return err
	}
	bw := bufio.NewWriter(w)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("  ", "  ")
	enc.SetEscapeHTML(false)
	bw.WriteString("[\n")
	for i, b := range list {
		buf.Reset()
		if err := enc.Encode(bindingJSON{Binding: b, Revision: b.Revision}); err != nil {
			return err
		}
		bw.WriteString("  ")
		bw.Write(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
		if i < len(list)-1 {
			bw.WriteString(",")
		}
		bw.WriteString("\n")
	}
	bw.WriteString("]\n")
	return bw.Flush()
}

func writeBindingsTable(w io.Writer, list []kvbinding.Binding) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tNODE\tFROM-SEQ\tSTATE\tDECIDED-AT\tDECIDED-BY")
	for _, b := range list {
		fromSeq := "-"
		if b.FromSeq > 0 {
			fromSeq = strconv.FormatUint(b.FromSeq, 10)
		}
		decidedAt := "-"
		if !b.DecidedAt.IsZero() {
			decidedAt = b.DecidedAt.UTC().Format("2006-01-02T15:04:05.000Z07:00")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n",
			displayGroup(b.Group), orDash(b.Node), fromSeq, orDash(string(b.State)), decidedAt, orDash(b.DecidedBy))
	}
	return tw.Flush()
}

// displayGroup renders a group id for the table: "" is the ungrouped
// binding, and an id that could be misread (spaces, non-printable
// characters, or looking like a label or a quoted id) is quoted.
func displayGroup(g string) string {
	switch {
	case g == "":
		return ungroupedLabel
	case g == ungroupedLabel, strings.HasPrefix(g, `"`), needsQuoting(g):
		return fmt.Sprintf("%q", g)
	}
	return g
}

// orDash renders an empty or unsafe free-text column.
func orDash(s string) string {
	switch {
	case s == "":
		return "-"
	case needsQuoting(s):
		return fmt.Sprintf("%q", s)
	}
	return s
}

func needsQuoting(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}
	for _, r := range s {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return true
		}
	}
	return false
}
