// Package localnats starts NATS servers in this process, outside tests:
// the JetStream servers of `grouprouter bench` and `grouprouter demo`, on
// loopback, on random ports, with their stores under one directory. (The
// helpers of internal/natstest need a testing.TB.)
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
	ports := make([]int, n)
	var routes []*url.URL
	if n > 1 {
		for i := range ports {
			p, err := freePort()
			if err != nil {
				return nil, err
			}
			ports[i] = p
			routes = append(routes, &url.URL{Scheme: "nats-route", Host: "127.0.0.1:" + strconv.Itoa(p)})
		}
	}
	c := &Cluster{}
	for i := range n {
		id := name + "-" + strconv.Itoa(i+1)
		opts := &server.Options{
			ServerName: id,
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			JetStream:  true,
			StoreDir:   filepath.Join(dir, id),
			NoLog:      true,
			NoSigs:     true,
		}
		if n > 1 {
			opts.Cluster.Name = name
			opts.Cluster.Host = "127.0.0.1"
			opts.Cluster.Port = ports[i]
			opts.Routes = routes // every member lists every route, itself included
		}
		for _, o := range with {
			o(opts)
		}
		srv, err := server.NewServer(opts)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("NATS server %s: %w", id, err)
		}
		srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			srv.Shutdown()
			c.Close()
			return nil, fmt.Errorf("NATS server %s not ready (route port %d taken?)", id, ports[i])
		}
		c.servers = append(c.servers, srv)
		c.urls = append(c.urls, "nats://"+srv.Addr().String())
	}
	return c, nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
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
			kv, err := js.CreateOrUpdateKeyValue(wctx, jetstream.KeyValueConfig{Bucket: bucket, Replicas: min(len(c.servers), 3)})
			if err != nil {
				return err
			}
			if _, err := kv.Put(wctx, "probe", []byte("ok")); err != nil {
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
