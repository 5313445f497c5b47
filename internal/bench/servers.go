package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsSet is the NATS the benchmark runs on: one JetStream server, or a
// JetStream cluster of in-process servers, all on loopback with random
// ports and their stores under one directory.
type natsSet struct {
	servers []*server.Server
	urls    []string // client URL of each server, in order
}

// startNATS starts n servers (1: standalone; more: one cluster, every
// member routing to every other) with stores under dir, and returns once
// JetStream takes a replicated write (for a cluster) or the server accepts
// connections. Close stops them.
func startNATS(ctx context.Context, dir string, n int) (*natsSet, error) {
	set := &natsSet{}
	var routes []*url.URL
	clusterPorts := make([]int, n)
	if n > 1 {
		for i := range clusterPorts {
			p, err := freePort()
			if err != nil {
				return nil, err
			}
			clusterPorts[i] = p
			routes = append(routes, &url.URL{Scheme: "nats-route", Host: "127.0.0.1:" + strconv.Itoa(p)})
		}
	}
	for i := 0; i < n; i++ {
		opts := &server.Options{
			ServerName: "B" + strconv.Itoa(i+1),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			JetStream:  true,
			StoreDir:   filepath.Join(dir, "nats-"+strconv.Itoa(i+1)),
			NoLog:      true,
			NoSigs:     true,
		}
		if n > 1 {
			// Every member lists every route, itself included.
			opts.Cluster.Name = "bench"
			opts.Cluster.Host = "127.0.0.1"
			opts.Cluster.Port = clusterPorts[i]
			opts.Routes = routes
		}
		srv, err := server.NewServer(opts)
		if err != nil {
			set.Close()
			return nil, fmt.Errorf("bench: nats server %d: %w", i+1, err)
		}
		srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			srv.Shutdown()
			set.Close()
			return nil, fmt.Errorf("bench: nats server %d not ready", i+1)
		}
		set.servers = append(set.servers, srv)
		set.urls = append(set.urls, "nats://"+srv.Addr().String())
	}
	if n > 1 {
		if err := set.waitCluster(ctx, 60*time.Second); err != nil {
			set.Close()
			return nil, err
		}
	}
	return set, nil
}

// freePort returns a loopback port that was free a moment ago (cluster
// members must know each other's route ports before they start).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("bench: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitCluster polls until a replicated key-value bucket can be created and
// written (a meta leader exists and every member is a peer).
func (s *natsSet) waitCluster(ctx context.Context, d time.Duration) error {
	nc, err := nats.Connect(s.urls[0], nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("bench: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	replicas := min(len(s.servers), 3)
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		last = func() error {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			kv, err := js.CreateOrUpdateKeyValue(wctx, jetstream.KeyValueConfig{Bucket: "bench_ready", Replicas: replicas})
			if err != nil {
				return err
			}
			_, err = kv.Put(wctx, "probe", []byte("ok"))
			return err
		}()
		if last == nil {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_ = js.DeleteKeyValue(dctx, "bench_ready")
			cancel()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("bench: cluster of %d not ready after %v: %w", len(s.servers), d, last)
}

// urlsFor returns the URL list a client of member i uses: its own server
// first (clients are started with DontRandomize), then the others.
func (s *natsSet) urlsFor(i int) []string {
	i %= len(s.urls)
	out := append([]string{s.urls[i]}, s.urls[:i]...)
	return append(out, s.urls[i+1:]...)
}

// Close shuts every server down and waits for them.
func (s *natsSet) Close() {
	for _, srv := range s.servers {
		srv.Shutdown()
	}
	for _, srv := range s.servers {
		srv.WaitForShutdown()
	}
	s.servers = nil
}

// connect opens a client connection to urls (tried in order) that keeps
// reconnecting; the caller closes it.
func connect(urls []string, name string) (*nats.Conn, error) {
	if len(urls) == 0 {
		return nil, errors.New("bench: no NATS URL")
	}
	var all string
	for i, u := range urls {
		if i > 0 {
			all += ","
		}
		all += u
	}
	nc, err := nats.Connect(all,
		nats.Name(name),
		nats.DontRandomize(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond),
		nats.Timeout(5*time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("bench: connect %s: %w", all, err)
	}
	return nc, nil
}

// mustLoopback rejects a URL whose host is not a loopback address: the
// benchmark never talks to another machine.
func mustLoopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	ip := net.ParseIP(u.Hostname())
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("bench: %s is not a loopback address", raw)
	}
	return nil
}
