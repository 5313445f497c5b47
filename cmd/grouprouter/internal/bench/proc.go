package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// ChildEnv names the environment variable holding the command prefix that
// starts a benchmark child (split on white space, then NodeMain's flags are
// appended). Unset, the prefix is the running executable and "bench-node".
const ChildEnv = "GROUPROUTER_BENCH_CHILD"

// childPrefix returns the command that starts a child process.
func childPrefix() ([]string, error) {
	if v := strings.Fields(os.Getenv(ChildEnv)); len(v) > 0 {
		return v, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: own executable: %w", err)
	}
	return []string{exe, "bench-node"}, nil
}

// child is a running benchmark child process.
type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan report // reports read from its stdout; closed at EOF
	done  chan struct{}

	mu       sync.Mutex // one stats request at a time
	termOnce sync.Once
	waitErr  error  // set before done closes
	last     report // last "exit" report seen
	exited   usage
}

// startChild starts prefix + args. The child's stderr goes to stderr.
func startChild(prefix, args []string, name string, stderr io.Writer) (*child, error) {
	all := append(append([]string(nil), prefix[1:]...), args...)
	cmd := exec.Command(prefix[0], all...)
	cmd.Stderr = stderr
	cmd.Env = os.Environ()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start %s (%s): %w", name, prefix[0], err)
	}
	c := &child{name: name, cmd: cmd, stdin: stdin, lines: make(chan report, 16), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var rep report
			if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
				fmt.Fprintf(stderr, "bench: %s: %s\n", name, sc.Text())
				continue
			}
			if rep.Event == "exit" || rep.Event == "warm" {
				c.mu.Lock()
				c.last = rep
				c.mu.Unlock()
			}
			c.lines <- rep
		}
		close(c.lines)
		err := cmd.Wait()
		c.waitErr = err
		c.exited = processUsage(cmd.ProcessState)
		close(c.done)
	}()
	return c, nil
}

// next returns the next report of the given event, skipping others, within d.
func (c *child) next(ctx context.Context, event string, d time.Duration) (report, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case rep, ok := <-c.lines:
			if !ok {
				<-c.done
				return report{}, fmt.Errorf("bench: %s exited before %q: %v", c.name, event, c.waitErr)
			}
			if rep.Event == event {
				return rep, nil
			}
		case <-timer.C:
			return report{}, fmt.Errorf("bench: %s: no %q report within %v", c.name, event, d)
		case <-ctx.Done():
			return report{}, ctx.Err()
		}
	}
}

// stats asks the child for its figures now.
func (c *child) stats(ctx context.Context) (report, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := io.WriteString(c.stdin, "stats\n"); err != nil {
		return report{}, fmt.Errorf("bench: %s: %w", c.name, err)
	}
	return c.next(ctx, "stats", 15*time.Second)
}

// terminate sends SIGTERM once (the child drains). A second signal could
// reach a child that has already reset its handlers on the way out.
func (c *child) terminate() {
	c.termOnce.Do(func() { _ = terminate(c.cmd.Process) })
}

// stop terminates the child, waits up to d, then kills it. It returns the
// child's last exit report and its lifetime rusage (whose MaxRSS is not
// the child's own: see peakRSS).
func (c *child) stop(d time.Duration) (report, usage, error) {
	c.terminate()
	// Keep reading its reports so that it never blocks on stdout.
	go func() {
		for range c.lines {
		}
	}()
	var err error
	select {
	case <-c.done:
	case <-time.After(d):
		_ = c.cmd.Process.Kill()
		<-c.done
		err = fmt.Errorf("bench: %s did not stop within %v; killed", c.name, d)
	}
	_ = c.stdin.Close()
	c.mu.Lock()
	last := c.last
	c.mu.Unlock()
	if err == nil && c.waitErr != nil {
		var ee *exec.ExitError
		if !errors.As(c.waitErr, &ee) || ee.ExitCode() != 0 {
			err = fmt.Errorf("bench: %s: %v", c.name, c.waitErr)
		}
	}
	return last, c.exited, err
}

// wait waits up to d for a child that ends by itself (warm start).
func (c *child) wait(d time.Duration) (report, usage, error) {
	select {
	case <-c.done:
	case <-time.After(d):
		return c.stop(5 * time.Second)
	}
	go func() {
		for range c.lines {
		}
	}()
	_ = c.stdin.Close()
	c.mu.Lock()
	last := c.last
	c.mu.Unlock()
	if c.waitErr != nil {
		return last, c.exited, fmt.Errorf("bench: %s: %v", c.name, c.waitErr)
	}
	return last, c.exited, nil
}
