package integration

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/router"
	"github.com/grouprouter/grouprouter/router/routertest"
)

// envNodeJS names the Node.js binary the TypeScript example runs with (a
// path or a command on PATH). When it is set, the test fails if it (or
// npm) cannot be found; when it is not, the test looks for node on PATH
// and is skipped, saying so, without it. .ci/run sets it.
const envNodeJS = "GROUPROUTER_NODEJS"

// findNodeJS returns the node and npm binaries, or skips when neither
// is expected nor found.
func findNodeJS(t *testing.T) (node, npm string) {
	t.Helper()
	want := os.Getenv(envNodeJS)
	name := want
	if name == "" {
		name = "node"
	}
	node, err := exec.LookPath(name)
	if err == nil {
		npm, err = exec.LookPath("npm")
	}
	if err != nil {
		if want != "" {
			t.Fatalf("%s=%s, but Node.js or npm is missing: %v", envNodeJS, want, err)
		}
		t.Skipf("no Node.js: install nodejs and npm, or set %s to node (CI does)", envNodeJS)
	}
	return node, npm
}

// TestTypeScriptExampleConsumesInOrder runs examples/typescript (nats.js
// v3, what a client in another language must do: the priority group,
// Grouping-Ingress-Seq, the epoch as a fence) against a router node: it
// must get every group's messages once, in the order they were published.
// It installs the example's packages (npm ci, from its lock file) and
// compiles it (tsc) when they are missing.
func TestTypeScriptExampleConsumesInOrder(t *testing.T) {
	t.Parallel() // see doc.go
	node, npm := findNodeJS(t)
	dir, err := filepath.Abs(filepath.Join("..", "examples", "typescript"))
	if err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@nats-io", "jetstream")); err != nil {
		run(npm, "ci", "--no-audit", "--no-fund")
	}
	run(node, filepath.Join("node_modules", "typescript", "bin", "tsc"), "-p", ".")

	s := natstest.RunServer(t)
	nc := s.Connect(nats.Name("node-n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The example starts first: it waits for the node's queue consumer.
	const groups, perGroup = 8, 25
	var stdout, stderr bytes.Buffer
	prog := exec.CommandContext(ctx, node, filepath.Join(dir, "dist", "consume.js"), s.URL(), "n1", strconv.Itoa(groups*perGroup))
	prog.Stdout, prog.Stderr = &stdout, &stderr
	if err := prog.Start(); err != nil {
		t.Fatal(err)
	}
	routertest.Start(t, nc, router.Config{Name: "typescript", Type: router.Local, Address: "jms", Node: "n1"})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	routertest.PublishGroups(ctx, t, js, "jms.orders", "ts-", groups, perGroup)
	err = prog.Wait()
	t.Logf("example's stderr:\n%s", &stderr)
	if got, want := strings.TrimSpace(stdout.String()), "ok "+strconv.Itoa(groups*perGroup); err != nil || got != want {
		t.Fatalf("example: %v, output:\n%s\nwant %q", err, got, want)
	}
}
