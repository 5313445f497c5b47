package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// readmeBlock is a shell block of README.md marked with a quickstart
// comment: kind is "install", "run" or "" (a block of commands that end).
type readmeBlock struct {
	kind string
	text string
}

var quickstartMarker = regexp.MustCompile("(?m)^<!-- quickstart(?:: (install|run))? -->\n```sh\n((?s:.*?))```")

// readmeQuickstart returns the marked blocks of readme, in order.
func readmeQuickstart(readme string) []readmeBlock {
	var out []readmeBlock
	for _, m := range quickstartMarker.FindAllStringSubmatch(readme, -1) {
		out = append(out, readmeBlock{kind: m[1], text: m[2]})
	}
	return out
}

func TestReadmeQuickstartBlocks(t *testing.T) {
	readme := "intro\n<!-- quickstart: install -->\n```sh\ngo install ./x\n```\ntext\n```sh\nnot marked\n```\n" +
		"<!-- quickstart: run -->\n```sh\nx run # c\n```\n<!-- quickstart -->\n```sh\na\nb\n```\n"
	got := readmeQuickstart(readme)
	want := []readmeBlock{{"install", "go install ./x\n"}, {"run", "x run # c\n"}, {"", "a\nb\n"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("blocks %q, want %q", got, want)
	}
}

// freeLoopbackAddr returns a 127.0.0.1 address with a port free now.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// cleanEnv is the process environment without NATS_* variables (a
// developer's NATS_URL or context must not leak into the run) and with the
// given ones added.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NATS_") && !strings.HasPrefix(kv, "XDG_DATA_HOME=") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// TestReadmeQuickstart runs the README's quickstart blocks as a reader
// would, from the repository: the install block (with GOBIN in a temporary
// directory put first on PATH), the run block in the background, then
// every other block with sh -e, checking what each prints. The only
// changes: the fixed ports (the embedded server's 127.0.0.1:4222 and the
// status page's 127.0.0.1:8222) become free ones, given to run as --listen
// and to the other commands as NATS_URL, and HOME is a temporary
// directory (the embedded server's data).
func TestReadmeQuickstart(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the quickstart test needs the go command on PATH: %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := readmeQuickstart(string(readme))
	var install, runBlock string
	var rest []string
	for _, b := range blocks {
		switch b.kind {
		case "install":
			install = b.text
		case "run":
			runBlock = b.text
		default:
			rest = append(rest, b.text)
		}
	}
	if install == "" || runBlock == "" || len(rest) < 2 {
		t.Fatalf("README.md has lost its quickstart blocks (install %q, run %q, %d others)", install, runBlock, len(rest))
	}
	dir := t.TempDir()
	bin, home := filepath.Join(dir, "bin"), filepath.Join(dir, "home")
	path := "PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A block's commands run one after another; what each writes to
	// stderr must be shown in the README (a reader who sees another line
	// takes it for a problem), and both outputs are returned.
	sh := func(block string, env []string, quiet bool) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "sh", "-e", "-c", block)
		cmd.Dir, cmd.Env = root, env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		t.Logf("$ %s\n%s%s", strings.TrimSpace(block), &stdout, &stderr)
		if err != nil {
			t.Fatalf("README block failed: %v\n%s\noutput:\n%s%s", err, block, &stdout, &stderr)
		}
		if quiet {
			for _, line := range strings.Split(stderr.String(), "\n") {
				if line = strings.TrimSpace(line); line != "" && !strings.Contains(string(readme), line) {
					t.Errorf("a README block wrote to stderr a line the README does not show: %q", line)
				}
			}
		}
		return stdout.String() + stderr.String()
	}
	sh(install, cleanEnv("GOBIN="+bin, "GOFLAGS=", path), false)
	if _, err := os.Stat(filepath.Join(bin, "grouprouter")); err != nil {
		t.Fatalf("the install block installed no grouprouter in GOBIN: %v", err)
	}

	// The run block: one command, left running.
	natsAddr, httpAddr := freeLoopbackAddr(t), freeLoopbackAddr(t)
	runLine := strings.TrimSpace(runBlock)
	if strings.Contains(runLine, "\n") || !strings.HasPrefix(runLine, "grouprouter run ") || !strings.Contains(runLine, "127.0.0.1:8222") {
		t.Fatalf("the run block is not one `grouprouter run ... --http 127.0.0.1:8222` line: %q", runBlock)
	}
	runLine = strings.Replace(runLine, "127.0.0.1:8222", httpAddr, 1)
	runLine = strings.Replace(runLine, "grouprouter run ", "exec grouprouter run --listen "+natsAddr+" ", 1)
	var runOut natstest.Buffer
	node := exec.Command("sh", "-c", runLine)
	node.Dir, node.Env = root, cleanEnv("HOME="+home, path)
	node.Stdout, node.Stderr = &runOut, &runOut
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- node.Wait() }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = node.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("grouprouter run exited with %v after SIGTERM; output:\n%s", err, &runOut)
			}
		case <-time.After(60 * time.Second):
			_ = node.Process.Kill()
			t.Errorf("grouprouter run did not stop on SIGTERM; output:\n%s", &runOut)
		}
	}
	defer stop()
	natstest.Eventually(t, 60*time.Second, func() error {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s; output:\n%s", resp.Status, &runOut)
		}
		return nil
	})

	env := cleanEnv("HOME="+home, path, "NATS_URL=nats://"+natsAddr)
	first := sh(rest[0], env, true)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`stored: stream GROUPING_INGRESS seq 1, group order-42`),
		regexp.MustCompile(`(?s)order-42 jms.orders first\n.*order-42 jms.orders second\n`),
		regexp.MustCompile(`(?m)^group: +order-42\nstate: +bound\nnode: +n1$`),
		regexp.MustCompile(`(?m)^order-42 +n1 +bound `),
	} {
		if !want.MatchString(first) {
			t.Errorf("the first quickstart block's output does not match %s", want)
		}
	}
	ungrouped := sh(rest[1], env, true)
	if strings.Contains(ungrouped, "parked") {
		t.Errorf("the ungrouped block's output speaks of parking, which the messages without a group never are")
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`stored: stream GROUPING_INGRESS seq 3, group \(ungrouped\)`),
		regexp.MustCompile(`(?m)^group: +\(ungrouped\)\nstate: +bound\nnode: +n1$`),
		regexp.MustCompile(`(?m)^\S+ +bind +\(ungrouped\) +n1 `),
	} {
		if !want.MatchString(ungrouped) {
			t.Errorf("the ungrouped block's output does not match %s", want)
		}
	}
	stop()
	if t.Failed() {
		t.Logf("grouprouter run's output:\n%s", &runOut)
	}
}

// TestWhereUngrouped: where --ungrouped shows the routing binding of the
// messages without a group id, where ungrouped the group of that name, and
// where '(ungrouped)' points at --ungrouped.
func TestWhereUngrouped(t *testing.T) {
	srv := natstest.RunServer(t)
	startCommand(t, "run", "--nats", srv.URL(), "--node", "u1")
	pub := func(args ...string) {
		t.Helper()
		natstest.Eventually(t, 30*time.Second, func() error {
			if code, out, errOut := runCommand(t, append([]string{"publish", "--nats", srv.URL()}, args...)...); code != exitOK {
				return fmt.Errorf("publish %v: exit %d %s %s", args, code, out, errOut)
			}
			return nil
		})
	}
	pub("jms.a", "no group")
	pub("--group", "ungrouped", "jms.a", "the group named ungrouped")
	pub("--group", "ungrouped", "jms.a", "again")
	where := func(args ...string) string {
		t.Helper()
		var out string
		natstest.Eventually(t, 30*time.Second, func() error {
			code, stdout, stderr := runCommand(t, append([]string{"where", "--nats", srv.URL()}, args...)...)
			if code != exitOK {
				return fmt.Errorf("where %v: exit %d: %s", args, code, stderr)
			}
			if !regexp.MustCompile(`(?m)^state: +bound$`).MatchString(stdout) {
				return fmt.Errorf("where %v: not bound yet:\n%s", args, stdout)
			}
			out = stdout + stderr
			return nil
		})
		return out
	}
	// The messages without a group are never parked as a group: where
	// --ungrouped says nothing about parking (it once printed "cannot
	// tell whether the group is parked: ... invalid group id: empty").
	if out := where("--ungrouped"); !regexp.MustCompile(`(?m)^group: +\(ungrouped\)$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^waiting: +1$`).MatchString(out) || strings.Contains(out, "parked") {
		t.Errorf("where --ungrouped:\n%s", out)
	}
	if code, stdout, stderr := runCommand(t, "where", "--nats", srv.URL(), "--ungrouped", "--json"); code != exitOK || stderr != "" ||
		strings.Contains(stdout, "parked") {
		t.Errorf("where --ungrouped --json: exit %d, stderr %q, stdout:\n%s", code, stderr, stdout)
	}
	if out := where("ungrouped"); !regexp.MustCompile(`(?m)^group: +ungrouped$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^waiting: +2$`).MatchString(out) {
		t.Errorf("where ungrouped:\n%s", out)
	}
	code, stdout, stderr := runCommand(t, "where", "--nats", srv.URL(), "(ungrouped)")
	if code != exitOK || !strings.Contains(stdout, "unbound") || !strings.Contains(stderr, "grouprouter where --ungrouped") {
		t.Errorf("where '(ungrouped)': exit %d, stdout %q, stderr %q; want unbound and a pointer to --ungrouped", code, stdout, stderr)
	}
	for _, args := range [][]string{{"--ungrouped", "g"}, {}} {
		if code, _, stderr := runCommand(t, append([]string{"where"}, args...)...); code != exitUsage || !strings.Contains(stderr, "--ungrouped") {
			t.Errorf("where %q: exit %d, stderr %q; want a usage error naming --ungrouped", args, code, stderr)
		}
	}
	var buf bytes.Buffer
	whereCmd, _ := lookupCommand("where")
	whereCmd.writeHelp(&buf)
	if !strings.Contains(buf.String(), "--ungrouped") {
		t.Errorf("where's help does not mention --ungrouped:\n%s", &buf)
	}
}

func TestPublishArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		subject string
		headers map[string]string
		err     string
	}{
		{name: "grouped", args: []string{"--group", "order-42", "jms.orders", "first"}, subject: "jms.orders",
			headers: map[string]string{"Group-Id": "order-42"}},
		{name: "ungrouped, no body", args: []string{"jms.orders"}, subject: "jms.orders", headers: map[string]string{}},
		{name: "other header name", args: []string{"--group-header", "JMSXGroupID", "--group", "g", "jms.a", "x"}, subject: "jms.a",
			headers: map[string]string{"JMSXGroupID": "g"}},
		{name: "extra headers", args: []string{"--header", "A:1", "--header", "B: two", "jms.a"}, subject: "jms.a",
			headers: map[string]string{"A": "1", "B": "two"}},
		{name: "no subject", args: nil, err: "want SUBJECT [BODY], got 0 arguments"},
		{name: "too many", args: []string{"jms.a", "b", "c"}, err: "got 3 arguments"},
		{name: "wildcard", args: []string{"jms.>"}, err: `invalid SUBJECT "jms.>"`},
		{name: "bad header", args: []string{"--header", "nocolon", "jms.a"}, err: `want NAME:VALUE, got "nocolon"`},
		{name: "bad group header", args: []string{"--group-header", "a b", "jms.a"}, err: "not a valid header name"},
		{name: "count 0", args: []string{"--count", "0", "jms.a"}, err: "--count must be >= 1, got 0"},
		{name: "stdin and BODY", args: []string{"--stdin", "jms.a", "x"}, err: "want SUBJECT with --stdin"},
		{name: "stdin and count", args: []string{"--stdin", "--count", "2", "jms.a"}, err: "--count or --stdin, not both"},
		{name: "stdin without one", args: []string{"--stdin", "jms.a"}, err: "--stdin: no standard input"},
		{name: "numbered group checked", args: []string{"--count", "10", "--group", strings.Repeat("g", kvbinding.MaxGroupIDLen-1) + "{{i}}", "jms.a"},
			err: "invalid --group"},
		{name: "numbered group", args: []string{"--count", "9", "--group", "g-{{i}}", "jms.a"}, subject: "jms.a",
			headers: map[string]string{"Group-Id": "g-{{i}}"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, _, err := parseCommand("publish", tt.args, testEnv("h"))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want one saying %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			o := a.(*publishOptions)
			if o.subject != tt.subject || len(o.headers) != len(tt.headers) {
				t.Fatalf("subject %q headers %v; want %q %v", o.subject, o.headers, tt.subject, tt.headers)
			}
			for k, v := range tt.headers {
				if got := o.headers.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
		})
	}
}
