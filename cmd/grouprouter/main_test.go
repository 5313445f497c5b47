package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestMain keeps the developer's NATS settings (NATS_URL, NATS_CONTEXT,
// ...) out of the tests, which run the commands with the process
// environment.
func TestMain(m *testing.M) {
	for _, v := range connEnvVars {
		os.Unsetenv(v)
	}
	os.Exit(m.Run())
}

func TestUsage(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		code       int
		stdoutHas  string // "" = stdout must be empty
		stderrHas  string // "" = stderr must be empty
		stderrLine bool   // stderr is exactly one line
	}{
		{name: "no command", args: nil, code: exitUsage, stderrHas: "Usage: grouprouter <command>"},
		{name: "unknown command", args: []string{"serve"}, code: exitUsage, stderrHas: `grouprouter: unknown command "serve"`},
		{name: "-h", args: []string{"-h"}, code: exitOK, stdoutHas: "Usage: grouprouter <command>"},
		{name: "--help", args: []string{"--help"}, code: exitOK, stdoutHas: "bindings"},
		{name: "help", args: []string{"help"}, code: exitOK, stdoutHas: "run "},
		{name: "run -h", args: []string{"run", "-h"}, code: exitOK, stdoutHas: "-max-attempts N"},
		{name: "run --help", args: []string{"run", "--type", "REMOTE", "--help"}, code: exitOK, stdoutHas: "Usage: grouprouter run"},
		{name: "bindings -h", args: []string{"bindings", "-h"}, code: exitOK, stdoutHas: "-json"},
		{name: "help lists move", args: []string{"help"}, code: exitOK, stdoutHas: "\n  move "},
		{name: "help lists unbind", args: []string{"help"}, code: exitOK, stdoutHas: "\n  unbind "},
		{name: "run -h lifecycle", args: []string{"run", "-h"}, code: exitOK, stdoutHas: "-group-timeout DURATION"},
		{name: "run -h rebind", args: []string{"run", "-h"}, code: exitOK, stdoutHas: "-rebind-after DURATION"},
		{name: "move -h", args: []string{"move", "-h"}, code: exitOK, stdoutHas: "-wait"},
		{name: "unbind -h", args: []string{"unbind", "-h"}, code: exitOK, stdoutHas: "Usage: grouprouter unbind"},
		{name: "bindings stray argument", args: []string{"bindings", "orders"}, code: exitUsage,
			stderrHas: `grouprouter bindings: unexpected argument "orders"`, stderrLine: true},
		{name: "bindings empty nats", args: []string{"bindings", "--nats", " "}, code: exitUsage,
			stderrHas: "grouprouter: invalid configuration: --nats is empty", stderrLine: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, &stdout, &stderr); code != tt.code {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tt.code, stderr.String())
			}
			check := func(what, got, want string) {
				if want == "" && got != "" {
					t.Errorf("%s should be empty, got %q", what, got)
				}
				if !strings.Contains(got, want) {
					t.Errorf("%s %q does not contain %q", what, got, want)
				}
			}
			check("stdout", stdout.String(), tt.stdoutHas)
			check("stderr", stderr.String(), tt.stderrHas)
			if tt.stderrLine && strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("stderr is not one line: %q", stderr.String())
			}
		})
	}
}

// parseCommand parses and checks args as command name does, connecting
// to nothing, and returns its action and (for a client command) its
// connection settings.
func parseCommand(name string, args []string, env environment) (action, connSettings, error) {
	c, ok := lookupCommand(name)
	if !ok {
		return nil, connSettings{}, fmt.Errorf("no command %q", name)
	}
	a, in, err := c.parse(args, env, io.Discard, io.Discard)
	if err != nil {
		return nil, connSettings{}, err
	}
	return a, in.conn, nil
}

// parseRunArgs parses run's arguments into the merged options.
func parseRunArgs(args []string, env environment) (runOptions, error) {
	a, _, err := parseCommand("run", args, env)
	if err != nil {
		return runOptions{}, err
	}
	return a.(*runFlags).opts, nil
}

// TestCommandTable checks the table: every command has its help, and
// every listed one a summary and a unique name.
func TestCommandTable(t *testing.T) {
	seen := make(map[string]bool)
	for _, c := range commands() {
		if seen[c.name] {
			t.Errorf("command %q twice", c.name)
		}
		seen[c.name] = true
		if (c.setup == nil) == (c.main == nil) {
			t.Errorf("%s: want setup or main, not both or neither", c.name)
		}
		if c.setup == nil {
			continue
		}
		var buf bytes.Buffer
		c.writeHelp(&buf)
		if !strings.HasPrefix(buf.String(), "Usage: grouprouter "+c.name) || !strings.Contains(buf.String(), "lags:\n  -") {
			t.Errorf("%s -h:\n%s", c.name, &buf)
		}
		if c.client && !strings.Contains(buf.String(), "-nats") {
			t.Errorf("%s is a client command without --nats", c.name)
		}
	}
}

// TestRunHelpSections: run -h groups its flags in sections, each flag in
// exactly one (none left to "Other flags"), printed as PrintDefaults
// prints them.
func TestRunHelpSections(t *testing.T) {
	c, _ := lookupCommand("run")
	var buf bytes.Buffer
	c.writeHelp(&buf)
	help := buf.String()
	if strings.Contains(help, "Other flags:") {
		t.Errorf("run -h has flags in no section:\n%s", help)
	}
	last := -1
	for _, s := range runFlagSections {
		i := strings.Index(help, "\n"+s.title+":\n  -")
		if i <= last {
			t.Errorf("section %q missing or out of order:\n%s", s.title, help)
		}
		last = i
	}
	fs, _, _ := c.newFlagSet()
	var all bytes.Buffer
	fs.SetOutput(&all)
	fs.PrintDefaults()
	fs.VisitAll(func(f *flag.Flag) {
		if n := strings.Count(help, "\n  -"+f.Name+" ") + strings.Count(help, "\n  -"+f.Name+"\n"); n != 1 {
			t.Errorf("flag -%s shown %d times in run -h", f.Name, n)
		}
	})
	// The same lines as one PrintDefaults, only grouped.
	sorted := func(s string) string {
		var lines []string
		for l := range strings.Lines(s) {
			if strings.HasPrefix(l, "  ") {
				lines = append(lines, l)
			}
		}
		slices.Sort(lines)
		return strings.Join(lines, "")
	}
	if sorted(help) != sorted(all.String()) {
		t.Errorf("run -h's flag lines differ from PrintDefaults':\n%s", help)
	}
}
