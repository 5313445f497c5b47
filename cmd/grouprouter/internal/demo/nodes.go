package demo

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/internal/localnats"
	"github.com/grouprouter/grouprouter/router"
)

// Timings of the demo's nodes: shorter than the defaults, so that a lost
// node's groups move within seconds of a half-minute run.
const (
	nodeGrace  = 2 * time.Second
	heartbeat  = 250 * time.Millisecond
	ackWait    = 3 * time.Second // queue consumers: a stopped one's messages move after it
	nodeReady  = 60 * time.Second
	handlerTTL = 2 * time.Second
)

// node is a router node running in this process on its own connection
// to its own server.
type node struct {
	id     string
	typ    router.HandlerType
	server int // index of its server
	cfg    router.Config

	mu     sync.Mutex
	nc     *nats.Conn
	r      *router.Router
	cancel context.CancelFunc
	done   chan error
	killed bool
}

func newNode(id string, typ router.HandlerType, server int, log *slog.Logger) *node {
	return &node{id: id, typ: typ, server: server, cfg: router.Config{
		Name: "demo", Type: typ, Address: address, Timeout: 2 * time.Second, Node: id,
		Heartbeat: heartbeat, LeaseTTL: handlerTTL, CheckpointInterval: 250 * time.Millisecond,
		PinnedTTL: 2 * time.Second, NodeGrace: nodeGrace, QueueAckWait: ackWait,
		Logger: log.With("node", id),
	}}
}

// start connects the node and runs it until stop or kill, and returns
// once it routes.
func (n *node) start(ctx context.Context, c *localnats.Cluster) error {
	n.reap() // the run before a kill
	nc, err := c.Connect(n.server, "demo-node-"+n.id)
	if err != nil {
		return err
	}
	r, err := router.New(nc, n.cfg)
	if err != nil {
		nc.Close()
		return err
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	n.mu.Lock()
	n.nc, n.r, n.cancel, n.done, n.killed = nc, r, cancel, done, false
	n.mu.Unlock()
	t := time.NewTimer(nodeReady)
	defer t.Stop()
	select {
	case <-r.Ready():
		return nil
	case err := <-done:
		done <- err // for stop
		return fmt.Errorf("demo: node %s stopped while starting: %v", n.id, err)
	case <-t.C:
		return fmt.Errorf("demo: node %s not routing after %v", n.id, nodeReady)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// router returns the running router, nil while the node is down.
func (n *node) router() *router.Router {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cancel == nil {
		return nil
	}
	return n.r
}

// isKilled reports whether the node was killed and not started again.
func (n *node) isKilled() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.killed
}

// kill stops the node as a crash would: its connection is closed first,
// so it saves no checkpoint, withdraws nothing and releases nothing; then
// its Run is cancelled. It does not wait for Run to return (the view goes
// on meanwhile): start and stop do.
func (n *node) kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cancel == nil {
		return
	}
	n.nc.Close()
	n.cancel()
	n.cancel, n.killed = nil, true
}

// reap waits for the Run of a killed node to return.
func (n *node) reap() {
	n.mu.Lock()
	done, running := n.done, n.cancel != nil
	n.mu.Unlock()
	if done != nil && !running {
		<-done
		n.mu.Lock()
		if n.done == done {
			n.done = nil
		}
		n.mu.Unlock()
	}
}

// stop stops the node gracefully (it drains, saves its checkpoint and
// withdraws) and closes its connection.
func (n *node) stop() {
	n.mu.Lock()
	nc, cancel, done := n.nc, n.cancel, n.done
	n.cancel = nil
	n.mu.Unlock()
	if cancel == nil {
		n.reap() // killed: its Run may still be returning
		return
	}
	cancel()
	<-done
	nc.Close()
}
