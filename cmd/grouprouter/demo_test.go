package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

// grouprouter demo, short: exit 0, and a summary that reports every
// message published processed once and in order, n2's groups flowing
// again after the kill and moved back by rebalancing after its return,
// and n3, joining a quarter of the way in, given groups by rebalancing.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := runContext(ctx, []string{"demo", "--duration", "8s", "--groups", "20", "--rate", "100"}, &stdout, &stderr)
	out := stdout.String()
	if ctx.Err() != nil {
		t.Fatalf("demo did not finish:\n%s", out)
	}
	if code != exitOK || stderr.Len() != 0 {
		t.Fatalf("demo: exit %d, stderr %q, stdout:\n%s", code, stderr.String(), out)
	}
	t.Logf("demo printed:\n%s", out)
	if strings.Contains(out, "\x1b") {
		t.Errorf("escape codes in the output to a non-terminal")
	}
	summary := out[strings.Index(out, "\nSummary\n"):]
	published := regexp.MustCompile(`published +(\d+) messages over 20 groups`).FindStringSubmatch(summary)
	processed := regexp.MustCompile(`processed +(\d+) by the consumers: every message exactly once, in order within its group`).FindStringSubmatch(summary)
	if published == nil || processed == nil || published[1] != processed[1] || published[1] == "0" {
		t.Errorf("summary does not report every message published processed once, in order:\n%s", summary)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`n2 killed +halfway, with \d+ groups: they flowed again [\d.]+s after the kill`),
		regexp.MustCompile(`n2 back +\d+ groups moved back to it by rebalancing`),
		regexp.MustCompile(`n3 joined +[\d.]+s in: rebalancing moved [1-9]\d* groups to it`),
		regexp.MustCompile(`moves +\d+ \(\d+ node n2 gone for 2s, \d+ rebalance\)`),
		regexp.MustCompile(`groups per node: n0 \d+, n1 \d+, n2 \d+, n3 [1-9]\d*`),
		regexp.MustCompile(`result +OK: every message arrived exactly once and in order per group`),
	} {
		if !want.MatchString(summary) {
			t.Errorf("summary lacks %s:\n%s", want, summary)
		}
	}
	// The live view printed plain lines: the kill and moves as they happened.
	for _, want := range []string{"now: n2 was killed", "groups moving n2 -> ", "groups taken over n2 -> ", "now: done: every message published was processed"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestDemoUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"demo", "-h"}, exitOK, "Usage: grouprouter demo [flags]"},
		{[]string{"demo", "--duration", "1s"}, exitUsage, "grouprouter demo: --duration must be at least 2s, got 1s (see 'grouprouter demo -h')"},
		{[]string{"demo", "--groups", "0"}, exitUsage, "grouprouter demo: --groups must be 1 to 100000, got 0"},
		{[]string{"demo", "--rate", "-1"}, exitUsage, "grouprouter demo: --rate must be 1 to 100000 messages a second, got -1"},
		{[]string{"demo", "extra"}, exitUsage, `grouprouter demo: unexpected argument "extra"`},
	} {
		code, stdout, stderr := runCommand(t, tt.args...)
		got := stderr
		if tt.code == exitOK {
			got = stdout
		}
		if code != tt.code || !strings.Contains(got, tt.out) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d and %q", tt.args, code, stdout, stderr, tt.code, tt.out)
		}
	}
}
