package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/cmd/grouprouter/internal/bench"
)

// command is a row of the command table: main dispatches on it, and
// 'grouprouter help' and the command's -h are written from it.
type command struct {
	name string
	// summary is the command's line in 'grouprouter help'; commands next
	// to each other with the same summary share the line; "" hides the
	// command.
	summary string
	// help is what 'grouprouter NAME -h' prints before the flags.
	help string
	// client: the command talks to NATS as a client. It takes the
	// connection flags, and its run gets the connection, opened once its
	// flags and arguments are checked.
	client bool
	// args: the command takes arguments after its flags (its check reads
	// them); without, any argument is a usage error.
	args bool
	// setup defines the command's flags on fs and returns the command,
	// checked and run once the flags are parsed.
	setup func(fs *flag.FlagSet) action
	// main runs a command that parses its own arguments (setup nil).
	main func(ctx context.Context, args []string, in *invocation) error
	// sections, if any, group the flags in -h, in order; help then ends
	// before them (each section has its title).
	sections []flagSection
}

// flagSection is a titled group of flags in a command's -h.
type flagSection struct {
	title string
	flags []string
}

// action is a command with its flags defined.
type action interface {
	// check validates the parsed flags and arguments; nothing is
	// connected yet. It returns a *usageError for command-line mistakes
	// and errors wrapping router.ErrConfig for invalid values.
	check(in *invocation) error
	// run does the command's work until it is done or ctx ends.
	run(ctx context.Context, in *invocation) error
}

// dialer is an action that connects as a client with its own name and
// options, rather than the command's name and the defaults.
type dialer interface {
	dial() (name string, opts []nats.Option)
}

// invocation is one run of a command: its parsed command line, its
// environment and outputs and, for a client command, its connection.
type invocation struct {
	cmd            string
	fs             *flag.FlagSet
	env            environment
	stdout, stderr io.Writer
	// conn are the client command's connection settings, resolved after
	// check; nc and js its connection, open while run runs.
	conn connSettings
	nc   *nats.Conn
	js   jetstream.JetStream
}

// args are the arguments after the flags.
func (in *invocation) args() []string { return in.fs.Args() }

// isSet reports whether flag name was given on the command line.
func (in *invocation) isSet(name string) bool {
	set := false
	in.fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// usagef returns a *usageError of the command.
func (in *invocation) usagef(format string, a ...any) error {
	return &usageError{cmd: in.cmd, msg: fmt.Sprintf(format, a...)}
}

// commands is the command table, in the order 'grouprouter help' lists it.
func commands() []command {
	replay := "replay a parked group's messages in order (skip drops the head first)"
	return []command{
		{name: "run", summary: "run a router node (starts an embedded NATS server without servers to join)",
			help: runHelp, setup: newRunFlags, sections: runFlagSections},
		{name: "bindings", summary: "list the group bindings (group -> node)",
			help: bindingsHelp, client: true, setup: func(fs *flag.FlagSet) action { return newBindingsFlags(fs) }},
		{name: "groups", summary: "list the groups: node, state, since when and why, messages waiting and held",
			help: groupsHelp(), client: true, setup: func(fs *flag.FlagSet) action { return newGroupsFlags(fs) }},
		{name: "where", summary: "show where one group is, why, and what of it waits where",
			help: whereHelp(), client: true, args: true, setup: func(fs *flag.FlagSet) action { return newWhereFlags(fs) }},
		{name: "nodes", summary: "list the live nodes and the active LOCAL handler",
			help: nodesHelp, client: true, setup: func(fs *flag.FlagSet) action { return newNodesFlags(fs) }},
		{name: "events", summary: "print the events kept in stream GROUPING_EVENTS (--follow for new ones)",
			help: eventsHelp(), client: true, setup: func(fs *flag.FlagSet) action { return newEventsFlags(fs) }},
		{name: "publish", summary: "publish a message as a producer does (--group G for its group; --count N or --stdin for many) and wait for the PubAck",
			help: publishHelp, client: true, args: true, setup: func(fs *flag.FlagSet) action { return newPublishFlags(fs) }},
		{name: "consume", summary: "consume a node's queue as an application does, printing each message",
			help: consumeHelp(), client: true, setup: func(fs *flag.FlagSet) action { return newConsumeFlags(fs) }},
		{name: opMove, summary: "move a group to another node, with its waiting messages, in order",
			help: moveHelp(opMove), client: true, args: true, setup: func(fs *flag.FlagSet) action { return newMoveFlags(opMove, fs) }},
		{name: opUnbind, summary: "end a group's binding; its next message gets a new one",
			help: moveHelp(opUnbind), client: true, args: true, setup: func(fs *flag.FlagSet) action { return newMoveFlags(opUnbind, fs) }},
		{name: "work", summary: "run a command once per message of a node's queue (body on stdin), per group in order",
			help: workHelp(), client: true, args: true, setup: func(fs *flag.FlagSet) action { return newWorkFlags(fs) }},
		{name: "parked", summary: "list the groups a consumer parked (a message failed its attempts)",
			help: parkedHelp("parked"), client: true, setup: func(fs *flag.FlagSet) action { return newParkedFlags(fs) }},
		{name: "retry", summary: replay, help: parkedHelp("retry"), client: true, args: true,
			setup: func(fs *flag.FlagSet) action { return newReplayFlags("retry", fs) }},
		{name: "skip", summary: replay, help: parkedHelp("skip"), client: true, args: true,
			setup: func(fs *flag.FlagSet) action { return newReplayFlags("skip", fs) }},
		{name: "release", summary: replay, help: parkedHelp("release"), client: true, args: true,
			setup: func(fs *flag.FlagSet) action { return newReplayFlags("release", fs) }},
		{name: "version", summary: "print the version: module version, VCS revision and time, Go version (also --version)",
			help: versionHelp, setup: func(fs *flag.FlagSet) action { return newVersionFlags(fs) }},
		{name: "permissions", summary: "print the NATS users and permissions of a deployment, one user per role",
			// permissions.go parses its own flags and writes its own help.
			main: func(_ context.Context, args []string, in *invocation) error { return printPermissions(args, in.stdout) }},
		{name: "demo", summary: "run it all in this process: 3 NATS servers, 3 nodes, load, a node killed; checks the order",
			help: demoHelp, setup: func(fs *flag.FlagSet) action { return newDemoFlags(fs) }},
		{name: "bench", summary: "measure throughput, decisions and latency against baselines (own embedded NATS)",
			main: func(ctx context.Context, args []string, in *invocation) error {
				err := bench.Main(ctx, args, in.stdout, in.stderr)
				if errors.Is(err, bench.ErrUsage) {
					return in.usagef("%s", strings.TrimPrefix(err.Error(), bench.ErrUsage.Error()+": "))
				}
				return err
			}},
		{name: "bench-node", // a router node or relay that bench runs in a child process
			main: func(ctx context.Context, args []string, in *invocation) error {
				return bench.NodeMain(ctx, args, in.stdout, in.stderr)
			}},
	}
}

// lookupCommand returns the row of command name.
func lookupCommand(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// newFlagSet returns the flag set of c with its flags defined (the
// connection flags for a client command) and the action they feed.
func (c command) newFlagSet() (*flag.FlagSet, *connFlags, action) {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported as one line by the caller
	fs.Usage = func() {}
	var conn *connFlags
	if c.client {
		conn = addConnFlags(fs, natsClientUsage)
	}
	return fs, conn, c.setup(fs)
}

// parse parses and checks args for c. It returns flag.ErrHelp for -h, a
// *usageError for command-line mistakes and errors wrapping
// router.ErrConfig for invalid values. It connects to nothing.
func (c command) parse(args []string, env environment, stdout, stderr io.Writer) (action, *invocation, error) {
	fs, conn, a := c.newFlagSet()
	in := &invocation{cmd: c.name, fs: fs, env: env, stdout: stdout, stderr: stderr}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, err
		}
		return nil, nil, in.usagef("%s", err.Error())
	}
	if !c.args && fs.NArg() > 0 {
		return nil, nil, in.usagef("unexpected argument %q", fs.Arg(0))
	}
	if err := a.check(in); err != nil {
		return nil, nil, err
	}
	if conn != nil {
		var err error
		if in.conn, err = conn.resolve(env, defaultNATSURL); err != nil {
			return nil, nil, err
		}
	}
	return a, in, nil
}

// execute runs c with args: parses and checks them, connects a client
// command, and runs it.
func (c command) execute(ctx context.Context, args []string, env environment, stdout, stderr io.Writer) error {
	if c.setup == nil {
		return c.main(ctx, args, &invocation{cmd: c.name, env: env, stdout: stdout, stderr: stderr})
	}
	a, in, err := c.parse(args, env, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		c.writeHelp(stdout)
		return err
	}
	if err != nil {
		return err
	}
	if c.client {
		name, opts := c.name, []nats.Option(nil)
		if d, ok := a.(dialer); ok {
			name, opts = d.dial()
		}
		if in.nc, in.js, err = connectClient(in.conn, name, warnTo(stderr), opts...); err != nil {
			return err
		}
		defer in.nc.Close()
	}
	return a.run(ctx, in)
}

// writeHelp writes 'grouprouter NAME -h'.
func (c command) writeHelp(w io.Writer) {
	fs, _, _ := c.newFlagSet()
	fmt.Fprint(w, c.help)
	if len(c.sections) == 0 {
		fs.SetOutput(w)
		fs.PrintDefaults()
		return
	}
	writeFlagSections(w, fs, c.sections)
}

// writeFlagSections writes fs's flags as PrintDefaults does, grouped in
// sections; a flag no section names comes last, under "Other flags".
func writeFlagSections(w io.Writer, fs *flag.FlagSet, sections []flagSection) {
	placed := make(map[string]bool)
	write := func(title string, flags []*flag.Flag) {
		if len(flags) == 0 {
			return
		}
		// A flag set of the section's flags prints them as fs would: the
		// values are fs's, still at their defaults.
		sub := flag.NewFlagSet(title, flag.ContinueOnError)
		for _, f := range flags {
			sub.Var(f.Value, f.Name, f.Usage)
		}
		fmt.Fprintf(w, "\n%s:\n", title)
		sub.SetOutput(w)
		sub.PrintDefaults()
	}
	for _, s := range sections {
		var flags []*flag.Flag
		for _, name := range s.flags {
			if f := fs.Lookup(name); f != nil && !placed[name] {
				flags = append(flags, f)
				placed[name] = true
			}
		}
		write(s.title, flags)
	}
	var rest []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if !placed[f.Name] {
			rest = append(rest, f)
		}
	})
	write("Other flags", rest)
}

// printUsage writes the top-level help, listing the table.
func printUsage(w io.Writer) {
	var b strings.Builder
	b.WriteString(`Usage: grouprouter <command> [flags]

Routes every message of a group to one node's queue, in order, on NATS JetStream.

Commands:
`)
	cmds := commands()
	for i := 0; i < len(cmds); {
		if cmds[i].summary == "" {
			i++
			continue
		}
		names := []string{cmds[i].name}
		j := i + 1
		for ; j < len(cmds) && cmds[j].summary == cmds[i].summary; j++ {
			names = append(names, cmds[j].name)
		}
		fmt.Fprintf(&b, "  %-10s %s\n", strings.Join(names, ", ")+pad(names), cmds[i].summary)
		i = j
	}
	b.WriteString("\nRun 'grouprouter <command> -h' for the flags of a command.\n")
	io.WriteString(w, b.String())
}

// pad is the extra space after a name column too long to align.
func pad(names []string) string {
	if len(strings.Join(names, ", ")) > 10 {
		return " "
	}
	return ""
}
