package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

// nodesTimeout bounds reading the node registry.
const nodesTimeout = 10 * time.Second

// timeLayout is how the tables print times.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// nodesOptions are the nodes command's flags.
type nodesOptions struct {
	name   string
	asJSON bool
}

func newNodesFlags(fs *flag.FlagSet) *nodesOptions {
	o := &nodesOptions{}
	fs.StringVar(&o.name, "name", defaultName, "grouping-handler `NAME` whose active LOCAL handler to show")
	fs.BoolVar(&o.asJSON, "json", false, `print a JSON object {"nodes": [...], "handler": {...} or null} instead of a table`)
	return o
}

// nodesHelp is the nodes command's help.
const nodesHelp = `Usage: grouprouter nodes [flags]

Lists the live nodes, sorted by id, as they last announced themselves
(CONSUMER: whether a consumer is pulling from the node's queue; POSITION:
the next ingress sequence the node reads; HELD: messages waiting for a
decision; the counters are since the node started), and which node's
LOCAL handler is active for --name.

Flags:
`

// check validates --name.
func (o *nodesOptions) check(*invocation) error {
	if err := kvbinding.ValidateNodeID(o.name); err != nil {
		return fmt.Errorf("%w: name: %v", router.ErrConfig, strings.Replace(err.Error(), "node id", "name", 1))
	}
	return nil
}

// run lists the nodes.
func (o *nodesOptions) run(ctx context.Context, in *invocation) error {
	nc, js, s, stdout := in.nc, in.js, in.conn, in.stdout
	ctx, cancel := context.WithTimeout(ctx, nodesTimeout)
	defer cancel()
	if err := requireBucket(ctx, nc, js, s, kvbinding.DefaultNodesBucket, "nodes"); err != nil {
		return err
	}
	before := nc.LastError()
	reg, err := kvbinding.OpenRegistry(ctx, js, kvbinding.RegistryConfig{}, nil)
	if err != nil {
		return requestError(err, s, nc, before, "open the node registry")
	}
	nodes, err := reg.ListNodes(ctx)
	if err != nil {
		return requestError(err, s, nc, before, "list nodes")
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Node < nodes[j].Node })

	var handler *handlerJSON
	lease, err := reg.GetLease(ctx, o.name)
	switch {
	case err == nil:
		handler = &handlerJSON{Name: o.name, Holder: lease.Holder, Since: lease.Since, Revision: lease.Revision}
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
	default:
		return requestError(err, s, nc, before, "handler lease "+o.name)
	}

	if o.asJSON {
		return writeNodesJSON(stdout, nodes, handler)
	}
	return writeNodesTable(stdout, nodes, handler)
}

// handlerJSON is the active LOCAL handler as --json prints it.
type handlerJSON struct {
	// Name is the grouping-handler name.
	Name string `json:"name"`
	// Holder is the active handler: <name>/<node>.
	Holder   string    `json:"holder"`
	Since    time.Time `json:"since"`
	Revision uint64    `json:"revision"`
}

// nodesJSON is what nodes --json prints.
type nodesJSON struct {
	Nodes   []kvbinding.NodeInfo `json:"nodes"`
	Handler *handlerJSON         `json:"handler"`
}

func writeNodesJSON(w io.Writer, nodes []kvbinding.NodeInfo, handler *handlerJSON) error {
	if nodes == nil {
		nodes = []kvbinding.NodeInfo{} // [] rather than null when empty
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(nodesJSON{Nodes: nodes, Handler: handler})
}

func writeNodesTable(w io.Writer, nodes []kvbinding.NodeInfo, handler *handlerJSON) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tTYPE\tCONSUMER\tPOSITION\tHELD\tROUTED\tDECISION-ERRORS\tDEAD-LETTERED\tHEARTBEAT")
	for _, n := range nodes {
		consumer := "no"
		if n.HasConsumer {
			consumer = "yes"
		}
		heartbeat := "-"
		if !n.Heartbeat.IsZero() {
			heartbeat = n.Heartbeat.UTC().Format(timeLayout)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n",
			orDash(n.Node), orDash(n.Type), consumer, n.Position, n.Held, n.Routed, n.DecisionErrors, n.DeadLettered, heartbeat)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	holder := "none"
	if handler != nil {
		holder = orDash(handler.Holder)
	}
	_, err := fmt.Fprintf(w, "\nactive LOCAL handler: %s\n", holder)
	return err
}
