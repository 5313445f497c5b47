package main

import (
	"bytes"
	"os"
	"testing"
)

func TestProgressLine(t *testing.T) {
	for _, tt := range []struct {
		terminal bool
		want     string
	}{
		{false, "a\nb\nc\n"},
		{true, "\r\x1b[Ka\r\x1b[Kb\r\x1b[Kc\n"},
	} {
		var buf bytes.Buffer
		p := &progressLine{w: &buf, terminal: tt.terminal}
		p.show("a")
		p.show("a") // unchanged: not shown again
		p.show("b")
		p.finish("c")
		p.finish("") // nothing left open
		if buf.String() != tt.want {
			t.Errorf("terminal %v: wrote %q, want %q", tt.terminal, buf.String(), tt.want)
		}
	}
}

func TestIsTerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	env := environment{getenv: func(string) string { return "" }}
	if isTerminal(w, env) || isTerminal(&bytes.Buffer{}, env) {
		t.Error("a pipe or a buffer taken for a terminal")
	}
	if tty, err := os.OpenFile("/dev/tty", os.O_WRONLY, 0); err == nil {
		defer tty.Close()
		if !isTerminal(tty, env) {
			t.Error("/dev/tty not taken for a terminal")
		}
		if isTerminal(tty, environment{getenv: func(string) string { return "dumb" }}) {
			t.Error("TERM=dumb taken for a terminal")
		}
	}
}
