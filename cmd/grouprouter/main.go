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

	"github.com/grouprouter/grouprouter/router"
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
	name, rest := args[0], args[1:]
	switch name {
	case "-h", "-help", "--help", "help":
		printUsage(stdout)
		return exitOK
	case "-version", "--version":
		name = "version"
	}
	cmd, ok := lookupCommand(name)
	if !ok {
		fmt.Fprintf(stderr, "grouprouter: unknown command %q\n\n", name)
		printUsage(stderr)
		return exitUsage
	}
	return exitCode(stderr, name, cmd.execute(ctx, rest, env, stdout, stderr))
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
