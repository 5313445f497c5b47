// Package localnats starts NATS servers in this process: the one starter
// of in-process servers. StartServer starts one server (the embedded
// server of `grouprouter run`, the members of a cluster); Start starts the
// JetStream servers of `grouprouter bench` and `grouprouter demo`, on
// loopback, on random ports, with their stores under one directory.
// ServerOptions, JoinCluster and ProbeWrite configure and check servers
// for the test helpers of internal/natstest, which wrap them with a
// testing.TB.
package localnats

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is one JetStream server, or a cluster of them in which every
// member routes to every other.
type Cluster struct {
	servers []*server.Server
	urls    []string // client URL of each server, in order
}

// Start starts n servers named name-1...name-n (n > 1: one cluster called
// name) with their stores under dir, and returns once JetStream takes a
// write replicated on up to three of them. Route ports are reserved before
// the servers start (each must know the others'); when one was taken
// meanwhile, the servers start again on fresh ports, up to three times.
// Every option applies to every server.
func Start(ctx context.Context, dir, name string, n int, with ...Option) (*Cluster, error) {
	var last error
	for attempt := 1; attempt <= 3; attempt++ {
		c, err := start(filepath.Join(dir, "attempt-"+strconv.Itoa(attempt)), name, n, with)
		if err != nil {
			last = err
			continue
		}
		if err := c.waitReady(ctx, 60*time.Second); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	return nil, last
}

func start(dir, name string, n int, with []Option) (*Cluster, error) {
	opts := make([]*server.Options, n)
	for i := range opts {
		id := name + "-" + strconv.Itoa(i+1)
		o := ServerOptions(id, filepath.Join(dir, id))
		opts[i] = &o
	}
	if n > 1 {
		if err := JoinCluster(opts, name); err != nil {
			return nil, err
		}
	}
	c := &Cluster{}
	for _, o := range opts {
		for _, with := range with {
			with(o)
		}
		srv, err := StartServer(o, 10*time.Second, nil, nil)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("NATS server %s: %w (route port %d taken?)", o.ServerName, err, o.Cluster.Port)
		}
		c.servers = append(c.servers, srv)
		c.urls = append(c.urls, "nats://"+srv.Addr().String())
	}
	return c, nil
}

// ErrNotReady is returned by StartServer for a server that did not accept
// client connections in time.
var ErrNotReady = errors.New("localnats: server not accepting connections")

// readyPoll is how often StartServer checks its failed function.
const readyPoll = 50 * time.Millisecond

// StartServer starts the nats-server configured by o (the server keeps o
// and may change it) and returns it once it accepts client connections.
// setup, if not nil, is called with the server before it starts (to set
// its logger). It gives up after timeout (ErrNotReady), or as soon as
// failed, polled while it waits (nil: never), returns an error, which it
// returns; it then shuts the server down and waits for it.
func StartServer(o *server.Options, timeout time.Duration, setup func(*server.Server), failed func() error) (*server.Server, error) {
	srv, err := server.NewServer(o)
	if err != nil {
		return nil, err
	}
	if setup != nil {
		setup(srv)
	}
	srv.Start()
	deadline := time.Now().Add(timeout)
	for !srv.ReadyForConnections(min(readyPoll, timeout)) {
		var err error
		if failed != nil {
			err = failed()
		}
		if err == nil && !time.Now().Before(deadline) {
			err = fmt.Errorf("%w after %v", ErrNotReady, timeout)
		}
		if err != nil {
			srv.Shutdown()
			srv.WaitForShutdown()
			return nil, err
		}
	}
	return srv, nil
}

// ServerOptions returns the options of a JetStream server named name on
// loopback, on a random client port, with its store in storeDir, logging
// nothing and ignoring signals.
func ServerOptions(name, storeDir string) server.Options {
	return server.Options{
		ServerName: name,
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   storeDir,
		NoLog:      true,
		NoSigs:     true,
	}
}

// JoinCluster makes the servers of opts one cluster called name on
// loopback: each gets a route port that was free a moment ago (each must
// know the others' before it starts, so a port may be taken meanwhile:
// the server then fails to start), and every member lists every route,
// itself included.
func JoinCluster(opts []*server.Options, name string) error {
	var routes []*url.URL
	for _, o := range opts {
		p, err := FreePort()
		if err != nil {
			return err
		}
		o.Cluster.Name = name
		o.Cluster.Host = "127.0.0.1"
		o.Cluster.Port = p
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: "127.0.0.1:" + strconv.Itoa(p)})
	}
	for _, o := range opts {
		o.Routes = append([]*url.URL(nil), routes...)
	}
	return nil
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ProbeWrite creates key-value bucket bucket with replicas replicas (or
// updates it) and writes a key to it: it succeeds once JetStream has a
// meta leader and enough peers to take a replicated write.
func ProbeWrite(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) error {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Replicas: replicas})
	if err != nil {
		return err
	}
	_, err = kv.Put(ctx, "probe", []byte("ok"))
	return err
}

// waitReady polls until a key-value bucket replicated on up to three
// servers can be created and written: JetStream has a meta leader and
// every member is a peer.
func (c *Cluster) waitReady(ctx context.Context, d time.Duration) error {
	nc, err := c.Connect(0, "localnats-ready")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	const bucket = "localnats_ready"
	deadline := time.Now().Add(d)
	for {
		err := func() error {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if err := ProbeWrite(wctx, js, bucket, min(len(c.servers), 3)); err != nil {
				return err
			}
			return js.DeleteKeyValue(wctx, bucket)
		}()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().After(deadline):
			return fmt.Errorf("NATS (%d servers) not ready after %v: %w", len(c.servers), d, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// URLs returns the client URL of every server, in order.
func (c *Cluster) URLs() []string { return c.urls }

// URLsFor returns the URL list a client of server i uses: its own server
// first (Connect does not randomize), then the others, for failover.
func (c *Cluster) URLsFor(i int) []string {
	i %= len(c.urls)
	out := append([]string{c.urls[i]}, c.urls[:i]...)
	return append(out, c.urls[i+1:]...)
}

// Connect opens a connection to server i (then the others) that keeps
// reconnecting; the caller closes it.
func (c *Cluster) Connect(i int, name string, opts ...nats.Option) (*nats.Conn, error) {
	if len(c.urls) == 0 {
		return nil, errors.New("no NATS server")
	}
	return Connect(c.URLsFor(i), name, opts...)
}

// Connect opens a connection named name to urls, tried in order, that keeps
// reconnecting (every 50 ms: the servers are local); opts come after
// these. The caller closes it.
func Connect(urls []string, name string, opts ...nats.Option) (*nats.Conn, error) {
	if len(urls) == 0 {
		return nil, errors.New("no NATS URL")
	}
	all := append([]nats.Option{
		nats.Name(name),
		nats.DontRandomize(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		nats.Timeout(5 * time.Second),
	}, opts...)
	nc, err := nats.Connect(strings.Join(urls, ","), all...)
	if err != nil {
		return nil, fmt.Errorf("connect %s to %s: %w", name, strings.Join(urls, ","), err)
	}
	return nc, nil
}

// Close shuts every server down and waits for them.
func (c *Cluster) Close() {
	for _, srv := range c.servers {
		srv.Shutdown()
	}
	for _, srv := range c.servers {
		srv.WaitForShutdown()
	}
	c.servers = nil
}
