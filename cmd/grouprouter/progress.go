package main

import (
	"fmt"
	"io"
	"os"
)

// isTerminal reports whether w is a terminal (a character device) that
// understands the cursor controls of a progress line; TERM=dumb says it
// does not.
func isTerminal(w io.Writer, env environment) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	if env.getenv != nil && env.getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressLine shows how far a long operation is: on a terminal one line
// rewritten in place, elsewhere (a pipe, a file, a test) one line per
// change. Not safe for concurrent use.
type progressLine struct {
	w        io.Writer
	terminal bool
	last     string
	open     bool // a line is shown without its newline (terminal)
}

// show displays s unless it is what is shown already.
func (p *progressLine) show(s string) {
	if s == p.last {
		return
	}
	p.last = s
	if p.terminal {
		fmt.Fprintf(p.w, "\r\x1b[K%s", s)
		p.open = true
		return
	}
	fmt.Fprintln(p.w, s)
}

// finish shows s as the last line ("" keeps the last one shown) and ends
// it, so that what is written next starts on a line of its own.
func (p *progressLine) finish(s string) {
	if s != "" {
		p.show(s)
	}
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
}
