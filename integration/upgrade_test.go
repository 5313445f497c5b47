package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// upgradeBase is the release a rolling upgrade starts from: the last
// commit that landed before records were typed (untyped records, wire
// protocol 3). Move it forward when a release changes what is stored or
// sent, so that the test always mixes this tree with the release before.
const upgradeBase = "0f01eb2370378d4e074ca00212ade7bcb741def2"

// TestRollingUpgrade: three nodes of the previous release (two LOCAL, one
// REMOTE) route under load on a 3-server cluster; each is stopped and
// started again from this tree's binary, one at a time, REMOTE first,
// while producers go on; once all run it, the registry bucket is hardened.
// Every message is delivered exactly once, in
// order per group. The binaries are built and run as users run them.
func TestRollingUpgrade(t *testing.T) {
	t.Parallel() // see doc.go
	oldBin := buildRelease(t, upgradeBase)
	newBin := buildRelease(t, "")
	c := natstest.RunCluster(t, 3)
	urls := c.URLs()
	var col collector
	procs, js := startProcNodes(t, oldBin, urls, &col, []procNode{{"n0", "LOCAL"}, {"n1", "LOCAL"}, {"n2", "REMOTE"}},
		"--rebalance=false", "--log-level", "debug")
	prod := startProducer(t, urls, groupNames(12), 5*time.Millisecond)
	prod.progress(t, &col, 100)

	reg, err := kvbinding.OpenRegistry(context.Background(), js, kvbinding.RegistryConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"n2", "n1", "n0"} {
		p := procs[id]
		start := time.Now()
		p.stop(t)
		procs[id] = startRouterProc(t, newBin, id, p.args...)
		pid := procs[id].cmd.Process.Pid
		natstest.Eventually(t, 60*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			info, _, found, err := reg.LiveRecord(ctx, id)
			switch {
			case err != nil:
				return err
			case !found || info.PID != pid:
				return fmt.Errorf("node %s not announced by the new process yet", id)
			}
			return nil
		})
		t.Logf("%s upgraded in %v", id, time.Since(start).Round(time.Millisecond))
		prod.progress(t, &col, 100)
	}
	// Every node now announces its record's TTL: the active handler
	// hardens the registry bucket the earlier release created (no expiry
	// markers, roll-ups and purges denied), and routing goes on.
	natstest.Eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if ok, err := reg.Hardened(ctx); err != nil || !ok {
			return fmt.Errorf("registry bucket not hardened: %v", err)
		}
		return nil
	})
	prod.progress(t, &col, 100)
	want, total := prod.finish(t)
	got := col.waitCount(t, total, 90*time.Second)
	checkGrouping(t, got, want)
	if len(got) != total {
		t.Errorf("delivered %d messages, %d sent", len(got), total)
	}
	t.Logf("%d messages in %d groups across the upgrade", total, len(want))
}

// procNode names a node run as a process and its type.
type procNode struct{ id, typ string }

// startProcNodes runs nodes from bin on the servers at urls, each with
// --nats, --node, --type and args; waits for their queue consumers and
// consumes each queue into col; and waits until every node is announced
// with its consumer. It returns the processes and a JetStream context.
func startProcNodes(t *testing.T, bin, urls string, col *collector, nodes []procNode, args ...string) (map[string]*routerProc, jetstream.JetStream) {
	t.Helper()
	procs := map[string]*routerProc{}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.id
		procs[n.id] = startRouterProc(t, bin, n.id, append([]string{"--nats", urls, "--node", n.id, "--type", n.typ}, args...)...)
	}
	nc := natstest.Connect(t, urls)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		natstest.Eventually(t, 60*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := js.Consumer(ctx, router.QueueStream, router.QueueConsumer(id))
			return err
		})
		startConsumer(t, urls, id, col)
	}
	waitEligible(t, nc, ids, ids)
	return procs, js
}

// groupNames returns g0..g<n-1>.
func groupNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "g" + strconv.Itoa(i)
	}
	return out
}

// progress waits until more messages than p has sent so far are in col.
func (p *producer) progress(t *testing.T, col *collector, more int) {
	t.Helper()
	_, sent := p.total()
	col.waitCount(t, sent+more, 90*time.Second)
}

// finish stops p and returns what it sent; a publish that failed fails the test.
func (p *producer) finish(t *testing.T) (map[string][]string, int) {
	t.Helper()
	p.halt()
	if p.errors > 0 {
		t.Fatalf("the producer stopped on a failed publish")
	}
	return p.total()
}

// routerProc is a grouprouter process run from a built binary.
type routerProc struct {
	cmd  *exec.Cmd
	args []string
	log  *lockedBuffer
	done chan struct{}
}

// startRouterProc runs bin with args ("run" is prepended); its log is
// shown if the test fails, and it is killed at cleanup.
func startRouterProc(t *testing.T, bin, name string, args ...string) *routerProc {
	t.Helper()
	return runRouterProc(t, bin, name, &lockedBuffer{}, args...)
}

// runRouterProc is startRouterProc writing to log: a process started
// again after a crash continues its predecessor's log.
func runRouterProc(t *testing.T, bin, name string, log *lockedBuffer, args ...string) *routerProc {
	t.Helper()
	p := &routerProc{args: args, log: log, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"run"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("log of %s (%s), last 4 KiB:\n%s", name, filepath.Base(bin), tail(p.log.String(), 4096))
		}
	})
	return p
}

// kill kills the process (SIGKILL) and waits for it.
func (p *routerProc) kill(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("node still running 30 s after SIGKILL")
	}
}

// httpListening is the line a node run with --http logs once it listens.
var httpListening = regexp.MustCompile(`HTTP endpoints listening.* addr=(\S+)`)

// httpAddr waits for the process (run with --http) to log the address its
// operator endpoints listen on, and returns it.
func (p *routerProc) httpAddr(t *testing.T) string {
	t.Helper()
	var addr string
	natstest.Eventually(t, 30*time.Second, func() error {
		m := httpListening.FindStringSubmatch(p.log.String())
		if m == nil {
			return errors.New("the node has not logged its HTTP address")
		}
		addr = m[1]
		return nil
	})
	return addr
}

// stop stops the process as an operator does (SIGTERM) and waits for it.
func (p *routerProc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("node did not stop within 30 s of SIGTERM; its log:\n%s", tail(p.log.String(), 4096))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// buildRelease builds cmd/grouprouter at commit (this tree when "") and
// returns the binary's path. An older commit is taken from the
// repository's history, which the test therefore needs (a full clone).
func buildRelease(t *testing.T, commit string) string {
	t.Helper()
	if commit == "" {
		// This tree's binary: built once for the whole package.
		current.once.Do(func() {
			current.dir, current.err = os.MkdirTemp("", "grouprouter-integration-")
			if current.err == nil {
				current.path, current.err = build("", "grouprouter-current", current.dir)
			}
		})
		if current.err != nil {
			t.Fatal(current.err)
		}
		return current.path
	}
	bin, err := build(commit, "grouprouter-"+commit[:7], t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// current is this tree's binary, built by the first test that asks for
// it; TestMain (main_test.go) removes it.
var current struct {
	once      sync.Once
	dir, path string
	err       error
}

// build builds cmd/grouprouter at commit (this tree when "") as dir/name.
func build(commit, name, dir string) (string, error) {
	root, err := filepath.Abs("..")
	if err != nil {
		return "", err
	}
	src := root
	if commit != "" {
		src = filepath.Join(dir, "src")
		var out, errOut bytes.Buffer
		git := exec.Command("git", "-C", root, "archive", "--format=tar", commit)
		git.Stdout, git.Stderr = &out, &errOut
		if err := git.Run(); err != nil {
			return "", fmt.Errorf("git archive %s (the test needs the repository's history: a full clone): %v: %s", commit, err, errOut.String())
		}
		if err := untar(&out, src); err != nil {
			return "", err
		}
	}
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/grouprouter")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", name, err, out)
	}
	return bin, nil
}

// untar writes the regular files and directories of the tar stream r
// under dir.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		path := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}
