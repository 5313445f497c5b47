package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/grouprouter/grouprouter/permissions"
)

type permissionsFlags struct {
	address, nodes, handlers, name, inboxPrefix, jsDomain      string
	routerAccount, producerAccount, consumerAccount, apiPrefix string
}

func newPermissionsFlags() (*flag.FlagSet, *permissionsFlags) {
	f := &permissionsFlags{}
	fs := flag.NewFlagSet("permissions", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&f.address, "address", defaultAddress, "producers publish on `ADDRESS`.>")
	fs.StringVar(&f.nodes, "nodes", "", "the router node `IDS`, comma-separated (required)")
	fs.StringVar(&f.handlers, "handlers", "", "the nodes of type LOCAL (`IDS`, comma-separated; required): they run the handler and create the streams")
	fs.StringVar(&f.name, "name", defaultName, "grouping-handler `NAME`")
	fs.StringVar(&f.inboxPrefix, "inbox-prefix", permissions.DefaultInboxPrefix, "inbox prefix `STEM`: user U receives its replies under STEM.U")
	fs.StringVar(&f.jsDomain, "js-domain", "", "also allow the router's users the JetStream API of `DOMAIN` as clients outside it address it ($JS.DOMAIN.API)")
	fs.StringVar(&f.routerAccount, "router-account", permissions.DefaultRouterAccount, "`ACCOUNT` of the router nodes, the operator, the observer and every stream and bucket")
	fs.StringVar(&f.producerAccount, "producer-account", permissions.DefaultProducerAccount, "`ACCOUNT` of the producers")
	fs.StringVar(&f.consumerAccount, "consumer-account", permissions.DefaultConsumerAccount, "`ACCOUNT` of the consumers")
	fs.StringVar(&f.apiPrefix, "js-api-prefix", "", "`PREFIX` under which the consumers' account imports the router's JetStream API (default JS.<router account>.API)")
	return fs, f
}

// printPermissionsUsage writes the permissions subcommand's help.
func printPermissionsUsage(w io.Writer) {
	fs, _ := newPermissionsFlags()
	fmt.Fprint(w, `Usage: grouprouter permissions --nodes IDS --handlers IDS [flags]

Prints a nats-server accounts block with one user per role: producer,
consumer-<node> and node-<node> for every node (LOCAL nodes also get the
handler's rights), operator and observer, each allowed exactly the subjects
its job needs. The router's users, streams and buckets are in one account;
producers and consumers are each in an account of their own that reaches
the router's through service imports only, so that no client's reply
subject can reach the router's state. Passwords are read by nats-server
from its environment ($GROUPROUTER_PASS_<USER>: the password or its bcrypt
hash), each user must connect with its own inbox prefix, and consumers with
the JetStream API prefix (both named in the block). See docs/permissions.md.

Flags:
`)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// printPermissions is the permissions subcommand.
func printPermissions(args []string, stdout io.Writer) error {
	fs, f := newPermissionsFlags()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printPermissionsUsage(stdout)
			return err
		}
		return &usageError{cmd: "permissions", msg: err.Error()}
	}
	if fs.NArg() > 0 {
		return &usageError{cmd: "permissions", msg: fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	nodes, handlers := splitIDs(f.nodes), splitIDs(f.handlers)
	switch {
	case len(nodes) == 0:
		return &usageError{cmd: "permissions", msg: "--nodes is required"}
	case len(handlers) == 0:
		return &usageError{cmd: "permissions", msg: "--handlers is required"}
	}
	l := permissions.Layout{
		Address: f.address, Nodes: nodes, Handlers: handlers,
		Name: f.name, InboxPrefix: f.inboxPrefix, JSDomain: f.jsDomain,
		RouterAccount: f.routerAccount, ProducerAccount: f.producerAccount, ConsumerAccount: f.consumerAccount, APIPrefix: f.apiPrefix,
	}
	if err := l.Validate(); err != nil {
		return &usageError{cmd: "permissions", msg: strings.TrimPrefix(err.Error(), permissions.ErrLayout.Error()+": ")}
	}
	return l.WriteConfig(stdout)
}

// splitIDs splits a comma-separated list of ids, trimming blanks.
func splitIDs(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
