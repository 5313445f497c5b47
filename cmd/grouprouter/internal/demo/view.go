package demo

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/grouprouter/grouprouter/proposals"
)

// frame is what the live view shows at one moment.
type frame struct {
	elapsed time.Duration
	phase   string
	nodes   []nodeRow

	published, processed int
	pubRate, procRate    float64
	moves                int // move events
	handoffs             int // handoff events
	timeouts             int
	unsettled            map[string]int             // hand-overs in progress by step
	progress             map[string]proposals.Event // each node's latest progress event
	fresh                []proposals.Event          // events since the last frame
}

// nodeRow is one node's line.
type nodeRow struct {
	id, typ, role, server, state string
	groups                       int
	held                         int // -1: unknown
	queue                        int // messages waiting on its queue; -1: unknown
	procRate                     float64
}

// view draws frames: on a terminal a screen redrawn in place (plain ANSI
// escape codes: cursor up, erase line, erase below), otherwise a status
// line a second and a line per event worth reading. Not safe for
// concurrent use.
type view struct {
	w        io.Writer
	terminal bool
	title    string
	duration time.Duration
	alt      bool     // the alternate screen is on (terminal)
	last     []string // the last frame drawn (terminal)
	recent   []string // the latest event lines (terminal)
	lastLine time.Duration
	phase    string // last phase printed (plain)
}

const recentEvents = 6

func (v *view) draw(f frame) {
	if v.terminal {
		v.drawScreen(f)
		return
	}
	v.drawLines(f)
}

// drawScreen redraws the terminal view: on the terminal's alternate
// screen (as less and top use it), from its top left corner, each line
// erased to its end and the rest of the screen below the frame erased.
func (v *view) drawScreen(f frame) {
	for _, e := range f.fresh {
		if s, ok := eventLine(f.elapsed, e); ok {
			v.recent = append(v.recent, s)
		}
	}
	if len(v.recent) > recentEvents {
		v.recent = v.recent[len(v.recent)-recentEvents:]
	}
	lines := v.screen(f)
	var b strings.Builder
	if !v.alt {
		b.WriteString("\x1b[?1049h\x1b[?25l") // the alternate screen, no cursor
		v.alt = true
	}
	b.WriteString("\x1b[H")
	for _, l := range lines {
		b.WriteString(l)
		b.WriteString("\x1b[K\n")
	}
	b.WriteString("\x1b[J")
	fmt.Fprint(v.w, b.String())
	v.last = lines
}

// screen is the terminal view's text, at most screenWidth columns a line.
func (v *view) screen(f frame) []string {
	var out []string
	line := func(format string, args ...any) {
		out = append(out, clip(fmt.Sprintf(format, args...), screenWidth))
	}
	line("%s   %5.1fs of %v", v.title, f.elapsed.Seconds(), v.duration)
	for _, l := range wrap("now: "+f.phase, screenWidth, "     ") {
		out = append(out, l)
	}
	line("")
	line("%-4s  %-6s  %-7s  %-6s  %-8s  %6s  %5s  %5s  %11s", "NODE", "TYPE", "HANDLER", "SERVER", "STATE", "GROUPS", "HELD", "QUEUE", "PROCESSED/S")
	for _, n := range f.nodes {
		line("%-4s  %-6s  %-7s  %-6s  %-8s  %6d  %5s  %5s  %11.0f", n.id, n.typ, orDash(n.role), n.server, n.state, n.groups,
			known(n.held), known(n.queue), n.procRate)
	}
	line("")
	line("published %7d (%4.0f/s)   processed %7d (%4.0f/s)   not yet %d",
		f.published, f.pubRate, f.processed, f.procRate, max(f.published-f.processed, 0))
	line("moves     %7d            hand-overs in progress %s", f.moves, unsettledText(f.unsettled))
	for _, id := range sortedKeys(f.progress) {
		if e := f.progress[id]; e.Reason == "" && time.Since(e.At) < 3*time.Second {
			line("progress  %s", progressText(e))
		}
	}
	line("")
	line("latest events (moves, hand-overs, timeouts, ...):")
	for _, s := range v.recent {
		line("  %s", s)
	}
	return out
}

// screenWidth bounds the terminal view's lines: a longer line would wrap
// and push the frame past the screen's height.
const screenWidth = 80

// clip cuts s to width runes.
func clip(s string, width int) string {
	r := []rune(s)
	if len(r) <= width {
		return s
	}
	return string(r[:width-1]) + "…"
}

// wrap splits s into lines of at most width runes at spaces, the lines
// after the first indented.
func wrap(s string, width int, indent string) []string {
	var out []string
	cur := ""
	for _, w := range strings.Fields(s) {
		switch {
		case cur == "":
			cur = w
		case len([]rune(cur))+1+len([]rune(w)) <= width:
			cur += " " + w
		default:
			out = append(out, clip(cur, width))
			cur = indent + w
		}
	}
	return append(out, clip(cur, width))
}

// drawLines prints the plain view: a phase when it changes, events worth
// reading, and a status line every second.
func (v *view) drawLines(f frame) {
	if f.phase != v.phase {
		v.phase = f.phase
		fmt.Fprintf(v.w, "%5.1fs  now: %s\n", f.elapsed.Seconds(), f.phase)
	}
	for _, s := range aggregate(f.elapsed, f.fresh) {
		fmt.Fprintf(v.w, "%s\n", s)
	}
	if f.elapsed-v.lastLine < time.Second-refresh/4 && v.lastLine > 0 {
		return
	}
	v.lastLine = f.elapsed
	var groups []string
	for _, n := range f.nodes {
		s := fmt.Sprintf("%s %d", n.id, n.groups)
		if n.state != "up" {
			s += " (" + n.state + ")"
		}
		groups = append(groups, s)
	}
	held := 0
	for _, n := range f.nodes {
		held += max(n.held, 0)
	}
	fmt.Fprintf(v.w, "%5.1fs  published %d (%.0f/s), processed %d (%.0f/s); groups %s; held %d; moves %d; hand-overs in progress %s\n",
		f.elapsed.Seconds(), f.published, f.pubRate, f.processed, f.procRate, strings.Join(groups, ", "), held, f.moves, unsettledText(f.unsettled))
}

// finish leaves the terminal as it was found (the normal screen, the
// cursor shown) and prints the last frame there, for the record.
func (v *view) finish() {
	if !v.alt {
		return
	}
	v.alt = false
	fmt.Fprint(v.w, "\x1b[?25h\x1b[?1049l")
	for _, l := range v.last {
		fmt.Fprintln(v.w, l)
	}
}

// eventLine is one event as the terminal view lists it, and whether it is
// worth listing (a progress event is listed when its step ends).
func eventLine(at time.Duration, e proposals.Event) (string, bool) {
	t := fmt.Sprintf("%5.1fs", at.Seconds())
	switch e.Kind {
	case proposals.EventMove:
		return fmt.Sprintf("%s  move      %-8s %s -> %s  %s", t, e.Group, e.PrevNode, e.Node, e.Reason), true
	case proposals.EventHandoff:
		return fmt.Sprintf("%s  handoff   %-8s %s -> %s  taken over (%d message%s moved, caught up)", t, e.Group, e.PrevNode, e.Node, e.Count, plural(e.Count)), true
	case proposals.EventProgress:
		if e.Reason == "" {
			return "", false
		}
		return fmt.Sprintf("%s  progress  %s", t, progressText(e)), true
	case proposals.EventTimeout:
		return fmt.Sprintf("%s  timeout   %-8s no decision yet (attempt %d): %s", t, e.Group, e.Attempt, e.Reason), true
	case proposals.EventHandlerTakeover:
		return fmt.Sprintf("%s  handler   %s became the active LOCAL handler", t, e.By), true
	}
	return fmt.Sprintf("%s  %-9s %-8s %s", t, e.Kind, e.Group, e.Reason), true
}

// aggregate sums up a frame's events for the plain view: moves and
// hand-overs by nodes and reason, progress events and others one a line.
func aggregate(at time.Duration, events []proposals.Event) []string {
	type key struct{ kind, from, to, reason string }
	counts := map[key]int{}
	var keys []key
	var out []string
	t := fmt.Sprintf("%5.1fs", at.Seconds())
	for _, e := range events {
		switch e.Kind {
		case proposals.EventMove, proposals.EventHandoff:
			k := key{e.Kind, e.PrevNode, e.Node, e.Reason}
			if counts[k] == 0 {
				keys = append(keys, k)
			}
			counts[k]++
		case proposals.EventProgress:
			out = append(out, fmt.Sprintf("%s  progress: %s", t, progressText(e)))
		default:
			if s, ok := eventLine(at, e); ok {
				out = append(out, s)
			}
		}
	}
	var sums []string
	for _, k := range keys {
		what := "moving"
		if k.kind == proposals.EventHandoff {
			what = "taken over"
		}
		s := fmt.Sprintf("%s  %d group%s %s %s -> %s", t, counts[k], plural(counts[k]), what, k.from, k.to)
		if k.reason != "" {
			s += " (" + k.reason + ")"
		}
		sums = append(sums, s)
	}
	return append(sums, out...)
}

// progressText says how far a node's takeover step is.
func progressText(e proposals.Event) string {
	what := "moved off the old queues"
	if e.Step == "catchup" {
		what = "routed from the ingress"
	}
	groups := e.Group
	if e.Groups != 1 || groups == "" {
		groups = fmt.Sprintf("%d groups", e.Groups)
	}
	s := fmt.Sprintf("%s %s of %s: %d", e.Node, e.Step, groups, e.Count)
	if e.Total > 0 {
		s += fmt.Sprintf(" of %d", e.Total)
	}
	s += " messages " + what
	if e.Reason != "" {
		s += ", " + e.Reason
	}
	return s
}

// unsettledText: "0", or "12 (drain 10, catchup 2)".
func unsettledText(m map[string]int) string {
	total := 0
	var parts []string
	for _, step := range []string{"moving", "drain", "catchup"} {
		if n := m[step]; n > 0 {
			total += n
			parts = append(parts, fmt.Sprintf("%s %d", step, n))
		}
	}
	if total == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(parts, ", "))
}

func known(n int) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
