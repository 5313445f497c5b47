package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"grouprouter/internal/bench"
	"grouprouter/router"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the command failed at run time
	exitUsage   = 2 // bad command line or configuration; nothing was started
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args (without the program name) until it
// completes or SIGINT/SIGTERM arrives, and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runContext(ctx, args, stdout, stderr)
}

// runContext is run with the process's signals replaced by ctx.
func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runEnv(ctx, args, osEnvironment(), stdout, stderr)
}

// runEnv is runContext with the process environment replaced by env.
func runEnv(ctx context.Context, args []string, env environment, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printUsage(stderr)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	var err error
	switch cmd {
	case "-h", "-help", "--help", "help":
		printUsage(stdout)
		return exitOK
	case "run":
		err = runNode(ctx, rest, env, stdout, stderr)
	case "bindings":
		err = listBindings(ctx, rest, env, stdout, stderr)
	case "consume":
		err = consume(ctx, rest, env, stdout, stderr)
	case "publish":
		err = publishMessage(ctx, rest, env, stdout, stderr)
	case "nodes":
		err = listNodes(ctx, rest, env, stdout, stderr)
	case "events":
		err = listEvents(ctx, rest, env, stdout, stderr)
	case "groups":
		err = listGroups(ctx, rest, env, stdout, stderr)
	case "where":
		err = whereGroup(ctx, rest, env, stdout, stderr)
	case opMove, opUnbind:
		err = moveGroup(ctx, cmd, rest, env, stdout, stderr)
	case "work":
		err = work(ctx, rest, env, stdout, stderr)
	case "parked":
		err = listParked(ctx, rest, env, stdout, stderr)
	case "retry", "skip", "release":
		err = replayParked(ctx, cmd, rest, env, stdout, stderr)
	case "permissions":
		err = printPermissions(rest, stdout)
	case "demo":
		err = runDemo(ctx, rest, env, stdout)
	case "bench":
		err = bench.Main(ctx, rest, stdout, stderr)
		if errors.Is(err, bench.ErrUsage) {
			err = &usageError{cmd: cmd, msg: strings.TrimPrefix(err.Error(), bench.ErrUsage.Error()+": ")}
		}
	case "bench-node":
		// Internal: a router node or relay run by "bench" in a child process.
		err = bench.NodeMain(ctx, rest, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "grouprouter: unknown command %q\n\n", cmd)
		printUsage(stderr)
		return exitUsage
	}
	return exitCode(stderr, cmd, err)
}

// exitCode reports err as one line on stderr and returns the exit code.
func exitCode(stderr io.Writer, cmd string, err error) int {
	var usage *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &usage):
		fmt.Fprintf(stderr, "grouprouter %s: %v\n", cmd, usage)
		return exitUsage
	case errors.Is(err, router.ErrConfig):
		msg := strings.TrimPrefix(err.Error(), router.ErrConfig.Error()+": ")
		fmt.Fprintf(stderr, "grouprouter: invalid configuration: %s\n", msg)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "grouprouter: %v\n", err)
		return exitFailure
	}
}

// printUsage writes the top-level help.
func printUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: grouprouter <command> [flags]

Routes every message of a group to one node's queue, in order, on NATS JetStream.

Commands:
  run        run a router node (starts an embedded NATS server without servers to join)
  bindings   list the group bindings (group -> node)
  groups     list the groups: node, state, since when and why, messages waiting and held
  where      show where one group is, why, and what of it waits where
  nodes      list the live nodes and the active LOCAL handler
  events     print the events kept in stream GROUPING_EVENTS (--follow for new ones)
  publish    publish one message as a producer does (--group G for its group) and wait for the PubAck
  consume    consume a node's queue as an application does, printing each message
  move       move a group to another node, with its waiting messages, in order
  unbind     end a group's binding; its next message gets a new one
  work       run a command once per message of a node's queue (body on stdin), per group in order
  parked     list the groups a consumer parked (a message failed its attempts)
  retry, skip, release  replay a parked group's messages in order (skip drops the head first)
  permissions  print the NATS users and permissions of a deployment, one user per role
  demo       run it all in this process: 3 NATS servers, 3 nodes, load, a node killed; checks the order
  bench      measure throughput, decisions and latency against baselines (own embedded NATS)

Run 'grouprouter <command> -h' for the flags of a command.
`)
}
