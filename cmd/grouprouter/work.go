package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// Exit codes of a work command that mean something to work.
const (
	// workExitTerminal (EX_DATAERR in sysexits.h): the message can never
	// be processed; it is parked at once, with the group's later ones.
	workExitTerminal = 65
	// workEnvPrefix starts the names of the variables work sets.
	workEnvPrefix = "GROUPING_"
	// workKillGrace is how long a command has after SIGTERM (its timeout,
	// or the group moved on) before it is killed.
	workKillGrace = 5 * time.Second
)

// workOptions is what the work subcommand was asked for.
type workOptions struct {
	node         string
	concurrency  int
	maxAttempts  int
	backoff      time.Duration
	timeout      time.Duration
	drainTimeout time.Duration
	groupHeader  string
	verbose      bool
	argv         []string
}

func newWorkFlags(fs *flag.FlagSet) *workOptions {
	o := &workOptions{}
	fs.StringVar(&o.node, "node", "", "process the queue of node `ID` (default: the host name, sanitized, as for run)")
	fs.IntVar(&o.concurrency, "concurrency", consumer.DefaultConcurrency, "run at most `K` commands at once, each for a different group")
	fs.IntVar(&o.maxAttempts, "max-attempts", consumer.DefaultMaxAttempts, "park a message (and its group's later ones) after `N` failed runs")
	fs.DurationVar(&o.backoff, "backoff", consumer.DefaultBackoffMin, "wait `D` before running a failed message again, doubling up to 30s")
	fs.DurationVar(&o.timeout, "timeout", time.Minute, "stop a command that runs longer than `D` (SIGTERM, then SIGKILL 5s later); it counts as failed")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", consumer.DefaultDrainTimeout, "on ^C, let running commands finish for at most `D`")
	fs.StringVar(&o.groupHeader, "group-header", router.DefaultGroupHeader, "`HEADER` holding the group id")
	fs.BoolVar(&o.verbose, "v", false, "log every state change (debug level)")
	return o
}

// workHelp is the work command's help.
func workHelp() string {
	return fmt.Sprintf(`Usage: grouprouter work [flags] -- CMD [ARGS...]

Processes a node's queue by running CMD once per message, in any language:
one message of a group at a time, in ingress order; up to --concurrency
groups at once (package consumer, see docs/consuming.md).

CMD gets the body on stdin and, in its environment:
  GROUPING_NODE          the node whose queue it is
  GROUPING_SUBJECT       the subject the producer published on
  GROUPING_GROUP         the group id ("" without one)
  GROUPING_INGRESS_SEQ   the ingress sequence: orders the group, names the message
  GROUPING_EPOCH         the group's epoch on this node (0: not set)
  GROUPING_FENCE         "<epoch>:<ingress seq>", zero-padded: write only if above the stored one
  GROUPING_ATTEMPT       this process's try of the message, from 1
  GROUPING_REDELIVERED   "true" if it may have been processed before (a crash)
  GROUPING_REPLAYED      "true" if replayed from the parked stream (retry, skip, release)
  GROUPING_HEADER_<NAME> each header, NAME upper-cased with '-' as '_'

Exit 0 acknowledges the message. Exit %d (EX_DATAERR) parks it at once:
it, and every later message of its group, wait in stream %s until
'grouprouter retry|skip|release GROUP'. Any other exit, a signal or the
timeout fails the run: it is retried after --backoff (other groups go on),
and parked after --max-attempts. CMD's stdout and stderr pass through.
Started before the node's router, work says so once (a log line) and
waits for the queue consumer the router creates.

Flags:
`, workExitTerminal, consumer.ParkedStream)
}

// check validates the flags and arguments.
func (o *workOptions) check(in *invocation) error {
	o.argv = in.args()
	if len(o.argv) == 0 {
		return in.usagef("want -- CMD [ARGS...]")
	}
	if !in.isSet("node") {
		o.node = sanitizeNodeID(in.env.hostname())
	}
	switch err := kvbinding.ValidateNodeID(o.node); {
	case err != nil:
		return fmt.Errorf("%w: node: %v", router.ErrConfig, err)
	case o.concurrency < 1:
		return fmt.Errorf("%w: --concurrency must be >= 1, got %d", router.ErrConfig, o.concurrency)
	case o.maxAttempts < 1:
		return fmt.Errorf("%w: --max-attempts must be >= 1, got %d", router.ErrConfig, o.maxAttempts)
	case o.backoff <= 0 || o.timeout <= 0 || o.drainTimeout <= 0:
		return fmt.Errorf("%w: --backoff, --timeout and --drain-timeout must be > 0", router.ErrConfig)
	case !router.ValidHeaderName(o.groupHeader):
		return fmt.Errorf("%w: group header %q is not a valid header name", router.ErrConfig, o.groupHeader)
	}
	return nil
}

// dial names the connection after the node; it reconnects for as long as
// work runs.
func (o *workOptions) dial() (string, []nats.Option) {
	return "work-" + o.node, []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(reconnectWait)}
}

// run runs CMD per message until ctx ends.
func (o *workOptions) run(ctx context.Context, in *invocation) error {
	js, stdout, stderr := in.js, in.stdout, in.stderr
	level := slog.LevelInfo
	if o.verbose {
		level = slog.LevelDebug
	}
	out, errOut := &lockedWriter{w: stdout}, &lockedWriter{w: stderr}
	log := slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: level}))
	w := &worker{o: *o, stdout: out, stderr: errOut, base: os.Environ()}
	logWorkStart(ctx, js, o, log)
	err := consumer.Consume(ctx, js, o.node, w.handle,
		consumer.WithConcurrency(o.concurrency), consumer.WithMaxAttempts(o.maxAttempts),
		consumer.WithBackoff(o.backoff, max(o.backoff, consumer.DefaultBackoffMax)),
		consumer.WithDrainTimeout(o.drainTimeout), consumer.WithGroupHeader(o.groupHeader), consumer.WithLogger(log))
	if errors.Is(err, consumer.ErrNoQueue) {
		return fmt.Errorf("node %s's queue consumer %s was deleted", o.node, router.QueueConsumer(o.node))
	}
	return err
}

// worker runs the command for each message.
type worker struct {
	o              workOptions
	stdout, stderr io.Writer
	base           []string // the environment CMD inherits
}

// handle runs the command on m: nil for exit 0, a Terminal error for exit
// workExitTerminal, an error otherwise.
func (w *worker) handle(ctx context.Context, m *consumer.Message) error {
	ctx, cancel := context.WithTimeout(ctx, w.o.timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.o.argv[0], w.o.argv[1:]...)
	cmd.Env = append(append(make([]string, 0, len(w.base)+16), w.base...), workEnv(w.o.node, m)...)
	cmd.Stdin = bytes.NewReader(m.Data)
	cmd.Stdout = w.stdout
	tail := &tailWriter{max: 200}
	cmd.Stderr = io.MultiWriter(w.stderr, tail)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = workKillGrace
	err := cmd.Run()
	if err == nil {
		return nil
	}
	why := err.Error()
	if ctx.Err() == context.DeadlineExceeded {
		why = fmt.Sprintf("timed out after %v (%v)", w.o.timeout, err)
	}
	if t := strings.TrimSpace(tail.String()); t != "" {
		why += ": " + t
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == workExitTerminal {
		return consumer.Terminal(errors.New(why))
	}
	return errors.New(why)
}

// workEnv returns the variables work sets for m.
func workEnv(node string, m *consumer.Message) []string {
	env := []string{
		workEnvPrefix + "NODE=" + node,
		workEnvPrefix + "SUBJECT=" + m.Subject,
		workEnvPrefix + "GROUP=" + m.Group,
		workEnvPrefix + "INGRESS_SEQ=" + strconv.FormatUint(m.IngressSeq, 10),
		workEnvPrefix + "EPOCH=" + strconv.FormatUint(m.Epoch, 10),
		workEnvPrefix + "FENCE=" + m.Fence.String(),
		workEnvPrefix + "ATTEMPT=" + strconv.Itoa(m.Attempt),
		workEnvPrefix + "REDELIVERED=" + strconv.FormatBool(m.Redelivered),
		workEnvPrefix + "REPLAYED=" + strconv.FormatBool(m.Replayed),
	}
	for k, v := range m.Header {
		env = append(env, workEnvPrefix+"HEADER_"+envName(k)+"="+strings.Join(v, ","))
	}
	return env
}

// envName turns a header name into a variable name part: upper case,
// anything but A-Z and 0-9 as '_'.
func envName(h string) string {
	b := []byte(strings.ToUpper(h))
	for i, c := range b {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// lockedWriter serializes the writes of concurrent commands.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// tailWriter keeps the last max bytes written (a command's last words).
type tailWriter struct {
	max int
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(p), nil
}

func (t *tailWriter) String() string { return string(t.buf) }
