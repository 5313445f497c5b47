package demo

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

// cluster is the demo's NATS: JetStream servers in this process forming
// one cluster on loopback, on random ports, their stores under one
// directory. (internal/bench starts its servers the same way; the test
// helpers of internal/natstest cannot be used outside tests.)
type cluster struct {
	servers []*server.Server
	urls    []string // client URL of each server, in order
}

// startCluster starts n servers named S1...Sn with stores under dir and
// returns once the cluster takes a replicated write. Route ports are
// reserved before the servers start (each must know the others'); when
// one was taken meanwhile, it starts again on fresh ports, up to three
// times.
func startCluster(ctx context.Context, dir string, n int) (*cluster, error) {
	var last error
	for attempt := 1; attempt <= 3; attempt++ {
		c, err := tryCluster(filepath.Join(dir, "attempt-"+strconv.Itoa(attempt)), n)
		if err != nil {
			last = err
			continue
		}
		if err := c.waitReady(ctx, 60*time.Second); err != nil {
			c.close()
			return nil, err
		}
		return c, nil
	}
	return nil, last
}

func tryCluster(dir string, n int) (*cluster, error) {
	ports := make([]int, n)
	var routes []*url.URL
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: "127.0.0.1:" + strconv.Itoa(p)})
	}
	c := &cluster{}
	for i := 0; i < n; i++ {
		opts := &server.Options{
			ServerName: "S" + strconv.Itoa(i+1),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			JetStream:  true,
			StoreDir:   filepath.Join(dir, "S"+strconv.Itoa(i+1)),
			NoLog:      true,
			NoSigs:     true,
			Routes:     routes, // every member lists every route, itself included
		}
		opts.Cluster.Name = "demo"
		opts.Cluster.Host = "127.0.0.1"
		opts.Cluster.Port = ports[i]
		srv, err := server.NewServer(opts)
		if err != nil {
			c.close()
			return nil, fmt.Errorf("demo: NATS server S%d: %w", i+1, err)
		}
		srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			srv.Shutdown()
			c.close()
			return nil, fmt.Errorf("demo: NATS server S%d not ready (route port %d taken?)", i+1, ports[i])
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
		return 0, fmt.Errorf("demo: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitReady polls until a replicated key-value bucket can be created and
// written: the cluster has a JetStream meta leader and every member is a
// peer.
func (c *cluster) waitReady(ctx context.Context, d time.Duration) error {
	nc, err := c.connect(0, "demo-ready")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(d)
	for {
		err := func() error {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			kv, err := js.CreateOrUpdateKeyValue(wctx, jetstream.KeyValueConfig{Bucket: "demo_ready", Replicas: min(len(c.servers), 3)})
			if err != nil {
				return err
			}
			if _, err := kv.Put(wctx, "probe", []byte("ok")); err != nil {
				return err
			}
			return js.DeleteKeyValue(wctx, "demo_ready")
		}()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().After(deadline):
			return fmt.Errorf("demo: the NATS cluster is not ready after %v: %w", d, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// connect opens a connection to server i (the others after it, for
// failover) that keeps reconnecting; the caller closes it.
func (c *cluster) connect(i int, name string, opts ...nats.Option) (*nats.Conn, error) {
	if len(c.urls) == 0 {
		return nil, errors.New("demo: no NATS server")
	}
	i %= len(c.urls)
	urls := append([]string{c.urls[i]}, c.urls[:i]...)
	urls = append(urls, c.urls[i+1:]...)
	all := append([]nats.Option{
		nats.Name(name),
		nats.DontRandomize(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond),
		nats.Timeout(5 * time.Second),
	}, opts...)
	nc, err := nats.Connect(strings.Join(urls, ","), all...)
	if err != nil {
		return nil, fmt.Errorf("demo: connect %s: %w", name, err)
	}
	return nc, nil
}

// close shuts every server down and waits for them.
func (c *cluster) close() {
	for _, srv := range c.servers {
		srv.Shutdown()
	}
	for _, srv := range c.servers {
		srv.WaitForShutdown()
	}
	c.servers = nil
}
