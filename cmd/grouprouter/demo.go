package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/grouprouter/grouprouter/cmd/grouprouter/internal/demo"
)

// demoOptions are the demo command's flags.
type demoOptions struct {
	cfg demo.Config
}

func newDemoFlags(fs *flag.FlagSet) *demoOptions {
	o := &demoOptions{}
	cfg := &o.cfg
	fs.DurationVar(&cfg.Duration, "duration", demo.DefaultDuration, "how long the producers publish (`DURATION`, like 30s); n2 is killed halfway")
	fs.IntVar(&cfg.Groups, "groups", demo.DefaultGroups, "how many groups the messages are spread over")
	fs.Float64Var(&cfg.Rate, "rate", demo.DefaultRate, "messages a second, all producers together")
	fs.BoolVar(&cfg.NoKill, "no-kill", false, "run without killing node n2")
	return o
}

// demoHelp is the demo command's help.
const demoHelp = `Usage: grouprouter demo [flags]

Runs grouprouter end to end in this process, with no NATS needed: a
3-server JetStream cluster on 127.0.0.1 (random ports, stores in a
temporary directory removed at the end), nodes n0 (LOCAL, the active
handler), n1 (LOCAL, its hot backup) and n2 (REMOTE), each on its own
server, producers publishing numbered messages over the groups at a steady
rate and a consumer per node acking them.

Halfway, n2 is killed (its connection closed, nothing released): its
groups wait, in order, and after the node grace move to n0 and n1 with
the messages that waited on its queue. Later n2 comes back and groups are
moved back to it, as 'grouprouter move' does.

A live view (redrawn in place on a terminal, plain lines otherwise) shows
the groups per node, the rates, the messages held and the moves as they
happen; a closing summary checks that every message published arrived
exactly once and in order within its group.

Exit codes: 0 every message once and in order; 1 not so (the summary says
which), or the demo could not run; 2 bad arguments.

Flags:
`

// check validates the demo's settings.
func (o *demoOptions) check(in *invocation) error {
	if err := o.cfg.Validate(); err != nil {
		return in.usagef("%s", strings.TrimPrefix(err.Error(), demo.ErrConfig.Error()+": "))
	}
	return nil
}

// run runs the demo and writes its summary.
func (o *demoOptions) run(ctx context.Context, in *invocation) error {
	cfg, stdout, env := o.cfg, in.stdout, in.env
	cfg.Out, cfg.Terminal = stdout, isTerminal(stdout, env)
	sum, err := demo.Run(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return errors.New("demo: interrupted")
		}
		return err
	}
	if err := sum.Write(stdout); err != nil {
		return err
	}
	if !sum.OK() {
		return fmt.Errorf("demo: %d duplicates, %d missing, %d out of order, %d never published (see the summary)",
			sum.Duplicates, sum.Missing, sum.OutOfOrder, sum.Unexpected)
	}
	return nil
}
