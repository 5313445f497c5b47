package integration

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// TestPausedPastGrace: a REMOTE node's process is paused (SIGSTOP) past
// its node grace while producers go on, as a long GC pause, a swapped-out
// VM or a debugger would. The handler moves its groups to the live nodes.
// Then the process resumes (SIGCONT) with everything it had read and not
// yet published: it must not put a message of a group it lost on its
// queue as current, nor route a group twice. Every message is delivered
// exactly once, in order per group, whichever node it ends on. The
// binary is run as users run it.
func TestPausedPastGrace(t *testing.T) {
	t.Parallel() // see doc.go
	bin := buildRelease(t, "")
	c := natstest.RunCluster(t, 3)
	var col collector
	procs, js := startProcNodes(t, bin, c.URLs(), &col, []procNode{{"n0", "LOCAL"}, {"n1", "REMOTE"}, {"n2", "REMOTE"}},
		"--rebalance=false", "--node-grace", "2s", "--queue-ack-wait", "2s", "--log-level", "debug")
	prod := startProducer(t, c.URLs(), groupNames(24), 2*time.Millisecond)
	prod.progress(t, &col, 200)
	boundTo := func(node string) (int, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n := 0
		err := kvbinding.ScanBindings(ctx, js, "", func(b kvbinding.Binding) error {
			if b.State == kvbinding.StateBound && b.Node == node {
				n++
			}
			return nil
		})
		return n, err
	}
	had, err := boundTo("n1")
	if err != nil || had == 0 {
		t.Fatalf("n1 holds %d groups before the pause (%v); the test needs some", had, err)
	}

	p := procs["n1"]
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	natstest.Eventually(t, 60*time.Second, func() error {
		if n, err := boundTo("n1"); err != nil || n > 0 {
			return fmt.Errorf("n1 still holds %d groups (%v)", n, err)
		}
		return nil
	})
	t.Logf("n1's %d groups moved %v after the pause", had, time.Since(paused).Round(time.Millisecond))
	prod.progress(t, &col, 300) // the moved groups flow on the other nodes meanwhile
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("n1 resumed after %v", time.Since(paused).Round(time.Millisecond))
	prod.progress(t, &col, 300)
	want, total := prod.finish(t)
	got := col.waitCount(t, total, 90*time.Second)
	time.Sleep(2 * time.Second) // a late stale copy would show here
	got = col.all()
	where := checkOrderedOnce(t, got, want)
	if len(got) != total {
		t.Errorf("delivered %d messages, %d sent", len(got), total)
	}
	moved := 0
	for _, ns := range where {
		if len(ns) > 1 {
			moved++
		}
	}
	t.Logf("%d messages in %d groups; %d groups delivered on more than one node", total, len(want), moved)
}
