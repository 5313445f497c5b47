package router

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// isReady reports whether Ready is closed: from then on the state Run set
// up (cache, registry, engine, handler) may be read.
func (r *Router) isReady() bool {
	select {
	case <-r.life.ready:
		return true
	default:
		return false
	}
}

// CheckReady reports whether the node routes now: nil once its binding
// cache is loaded, while its NATS connection is connected and its ingress
// reader is reading. Otherwise it returns an error wrapping ErrNotReady
// whose text says why in one line. It is safe to call at any time, from
// any goroutine, and does no I/O.
func (r *Router) CheckReady() error {
	switch {
	case r.life.stopped.Load():
		return fmt.Errorf("%w: stopped", ErrNotReady)
	case !r.isReady():
		return fmt.Errorf("%w: starting: setting up streams and loading the binding cache", ErrNotReady)
	}
	if s := r.nc.Status(); s != nats.CONNECTED {
		return fmt.Errorf("%w: NATS connection is %s", ErrNotReady, s)
	}
	if !r.rs.up.Load() {
		return fmt.Errorf("%w: the ingress reader is not reading", ErrNotReady)
	}
	return nil
}

// Status is a snapshot of a node and of the cluster as the node sees it.
type Status struct {
	At      time.Time
	Node    string
	Type    HandlerType
	Handler string // the grouping-handler name
	// NotReady says why the node does not route ("" when it does; see
	// CheckReady). Before the node is ready, only the fields above and
	// HandlerActive are set.
	NotReady string
	// HandlerActive: this node's LOCAL handler answers proposals.
	HandlerActive bool
	// ActiveHandler is the handler lease's holder (name/node), "" when
	// nobody holds it or it could not be read.
	ActiveHandler string
	Stats         Stats
	// IngressLast is the ingress stream's last sequence (read at most
	// every 2 s); IngressKnown is false until it was read once.
	IngressLast  uint64
	IngressKnown bool
	// Records counts the binding cache's records, ended ones included;
	// Unsettled the groups moving or in a hand-over step.
	Records   int
	Unsettled int
	// Nodes are the live nodes and the nodes that have groups bound to
	// them, sorted by id.
	Nodes []NodeStatus
}

// NodeStatus is one node as the registry and the binding cache show it.
type NodeStatus struct {
	Node string
	// Live: the node announces itself; the fields below Groups are its
	// last announcement's.
	Live bool
	// Groups bound to the node.
	Groups int
	Type   string // LOCAL or REMOTE
	// Role of its LOCAL handler: "active", "standby", or "" for a REMOTE node.
	Role        string
	HasConsumer bool
	// Position is the next ingress sequence the node reads, Lag how many
	// stored messages it has still to read (when IngressKnown).
	Position uint64
	Lag      uint64
	Held     int
	// Waiting counts the groups it holds undecided.
	Waiting int
	Routed  uint64
	// QueuePending and QueueUnacked: messages on its queue not delivered
	// yet, and delivered but not acked.
	QueuePending uint64
	QueueUnacked uint64
	// HeldBack: messages of its groups held back for their share of its
	// queue's window (waiting on its held subject), HeldBackGroups how
	// many groups.
	HeldBack       int
	HeldBackGroups int
	Heartbeat      time.Time
}

// Status returns a snapshot of the node and of the nodes it knows. It reads
// the handler lease (one KV get) and, at most every 2 s, the ingress
// stream's info; everything else comes from memory. Its cost does not grow
// with the number of bindings.
func (r *Router) Status(ctx context.Context) Status {
	s := Status{At: time.Now().UTC(), Node: r.cfg.Node, Type: r.cfg.Type, Handler: r.cfg.Name, HandlerActive: r.HandlerActive()}
	if err := r.CheckReady(); err != nil {
		s.NotReady = err.Error()
	}
	if !r.isReady() {
		return s
	}
	s.Stats = r.Stats()
	s.IngressLast, s.IngressKnown = r.ingressLastCached(ctx)
	if l, err := r.reg.GetLease(ctx, r.cfg.Name); err == nil {
		s.ActiveHandler = l.Holder
	}
	s.Records, s.Unsettled = r.cache.Len(), r.cache.UnsettledLen()
	counts := r.cache.Counts()
	live := r.reg.Live()
	for _, id := range nodeIDs(counts, live) {
		n := NodeStatus{Node: id, Groups: counts[id]}
		if info, ok := live[id]; ok {
			n.Live, n.Type, n.HasConsumer = true, info.Type, info.HasConsumer
			n.Position, n.Held, n.Waiting, n.Routed = info.Position, info.Held, info.WaitingGroups, info.Routed
			n.QueuePending, n.QueueUnacked, n.Heartbeat = info.QueuePending, info.QueueUnacked, info.Heartbeat
			n.HeldBackGroups = info.HeldBackGroups
			for _, h := range info.HeldBack {
				n.HeldBack += h.Count
			}
			if id == r.cfg.Node {
				n.Position, n.Held, n.Routed = s.Stats.Position, s.Stats.Held, s.Stats.Routed // fresher
				n.HeldBack, n.HeldBackGroups = s.Stats.HeldBackMessages, s.Stats.HeldBackGroups
			}
			if info.Type == string(Local) {
				n.Role = role(info, s.ActiveHandler)
				if id == r.cfg.Node && s.HandlerActive {
					n.Role = "active"
				}
			}
			if s.IngressKnown {
				n.Lag = lag(s.IngressLast, n.Position)
			}
		}
		s.Nodes = append(s.Nodes, n)
	}
	return s
}

// role is a LOCAL node's handler role given the lease holder.
func role(info kvbinding.NodeInfo, holder string) string {
	if holder != "" && holder == info.Handler+"/"+info.Node {
		return "active"
	}
	return "standby"
}
