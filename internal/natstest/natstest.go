// Package natstest starts in-process NATS servers with JetStream for tests:
// a single server or a cluster on loopback, each with its own t.TempDir()
// store, random ports, and helpers to stop and restart members. It wraps
// the starter of internal/localnats with a testing.TB.
package natstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/localnats"
)

// Server is one in-process nats-server that can be stopped and restarted
// with the same name, ports and store directory.
type Server struct {
	t    testing.TB
	opts server.Options
	srv  *server.Server
	// created, if not nil, is called with each new nats-server before it
	// starts (it then already has its ID, and solicits routes at once):
	// ProxiedCluster learns which server dials a route from it.
	created func(*server.Server)
}

// URL returns the client URL of the server (stable across restarts).
func (s *Server) URL() string {
	return "nats://127.0.0.1:" + strconv.Itoa(s.opts.Port)
}

// Name returns the server name.
func (s *Server) Name() string { return s.opts.ServerName }

// Server returns the running nats-server, or nil while stopped.
func (s *Server) Server() *server.Server { return s.srv }

// Running reports whether the server is running.
func (s *Server) Running() bool { return s.srv != nil && s.srv.Running() }

// Stop shuts the server down gracefully and waits for it to end.
func (s *Server) Stop() {
	if s.srv == nil {
		return
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
	s.srv = nil
}

// Restart starts a stopped server again with fresh options keeping its name,
// ports and store directory.
func (s *Server) Restart() {
	s.t.Helper()
	if s.srv != nil {
		s.t.Fatalf("natstest: restart of running server %s", s.Name())
	}
	s.start()
}

func (s *Server) start() {
	s.t.Helper()
	if err := s.tryStart(); err != nil {
		s.t.Fatal(err)
	}
}

// tryStart starts the server, returning an error instead of failing.
func (s *Server) tryStart() error {
	opts := s.opts // fresh copy: the server mutates its options
	opts.Routes = append([]*url.URL(nil), s.opts.Routes...)
	srv, err := localnats.StartServer(&opts, 10*time.Second, s.created, nil)
	if errors.Is(err, localnats.ErrNotReady) {
		return fmt.Errorf("natstest: server %s not ready (client port %d, cluster port %d: taken?)", s.Name(), s.opts.Port, s.opts.Cluster.Port)
	}
	if err != nil {
		return fmt.Errorf("natstest: new server %s: %w", s.Name(), err)
	}
	s.srv = srv
	if s.opts.Port <= 0 {
		s.opts.Port = srv.Addr().(*net.TCPAddr).Port
	}
	if s.opts.Cluster.Port < 0 {
		s.opts.Cluster.Port = srv.ClusterAddr().Port
	}
	return nil
}

// Connect opens a client connection to the server that keeps reconnecting
// for the length of the test, and closes it when the test ends.
func (s *Server) Connect(opts ...nats.Option) *nats.Conn {
	s.t.Helper()
	return Connect(s.t, s.URL(), opts...)
}

// JetStream returns a JetStream context on a new connection to the server
// (see Connect).
func (s *Server) JetStream() jetstream.JetStream {
	s.t.Helper()
	js, err := jetstream.New(s.Connect())
	if err != nil {
		s.t.Fatal(err)
	}
	return js
}

// Connect opens a client connection to url that reconnects forever; it is
// closed when the test ends.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		nats.Timeout(2 * time.Second),
	}, opts...)
	nc, err := nats.Connect(url, all...)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// RunServer starts a single JetStream server on a random loopback port.
// It is shut down when the test ends.
func RunServer(t testing.TB) *Server {
	t.Helper()
	return RunServerWith(t, nil)
}

// RunServerWith is RunServer with the server's options changed by
// configure first (users and permissions, TLS), if it is not nil.
func RunServerWith(t testing.TB, configure func(*server.Options)) *Server {
	t.Helper()
	s := &Server{t: t, opts: localnats.ServerOptions("S1", t.TempDir())}
	if configure != nil {
		configure(&s.opts)
	}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

// Cluster is a JetStream cluster of in-process servers on loopback.
type Cluster struct {
	t       testing.TB
	Servers []*Server
}

// RunCluster starts n JetStream servers forming one cluster and waits until
// an R-n key-value bucket can be created and written, so that tests start
// on a cluster that can take replicated writes. It is shut down when the test ends.
func RunCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	var last error
	// Cluster ports are reserved by listening and closing: another process
	// may take one before the server binds it, so retry with fresh ports.
	for attempt := 0; attempt < 3; attempt++ {
		c, err := tryCluster(t, n, nil)
		if err == nil {
			c.WaitReady(30 * time.Second)
			return c
		}
		last = err
	}
	t.Fatalf("natstest: cluster of %d: %v", n, last)
	return nil
}

// RunClusterWith is RunCluster with every member's options changed by
// configure first (e.g. users and permissions). It waits for readiness in
// the servers themselves, needing no client: a JetStream meta leader that
// has every member's statistics (what placing a replicated stream needs),
// since a client of an auth-enabled cluster may lack the rights of
// WaitReady's probe.
func RunClusterWith(t testing.TB, n int, configure func(*server.Options)) *Cluster {
	t.Helper()
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		c, err := tryCluster(t, n, configure)
		if err == nil {
			c.WaitMetaReady(30 * time.Second)
			return c
		}
		last = err
	}
	t.Fatalf("natstest: cluster of %d: %v", n, last)
	return nil
}

// WaitMetaReady waits until a running member is the JetStream meta leader
// and knows every running member as a JetStream peer with current
// statistics, or fails the test after d.
func (c *Cluster) WaitMetaReady(d time.Duration) {
	c.t.Helper()
	running := 0
	for _, s := range c.Servers {
		if s.Running() {
			running++
		}
	}
	Eventually(c.t, d, func() error {
		for _, s := range c.Servers {
			if !s.Running() || !s.srv.JetStreamIsLeader() {
				continue
			}
			if peers := s.srv.JetStreamClusterPeers(); len(peers) < running {
				return fmt.Errorf("meta leader %s knows %d of %d peers", s.Name(), len(peers), running)
			}
			return nil
		}
		return errors.New("no JetStream meta leader")
	})
}

func tryCluster(t testing.TB, n int, configure func(*server.Options)) (*Cluster, error) {
	c := newCluster(t, n, false)
	for _, s := range c.Servers {
		if configure != nil {
			configure(&s.opts)
		}
	}
	for _, s := range c.Servers {
		if err := s.tryStart(); err != nil {
			for _, started := range c.Servers {
				started.Stop()
			}
			return nil, err
		}
		t.Cleanup(s.Stop)
	}
	return c, nil
}

// NewServer configures a single JetStream server on a reserved loopback
// port without starting it: its URL is known before it listens, so a
// client can be started first. Start it with Start; it is shut down when
// the test ends.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, opts: localnats.ServerOptions("S1", t.TempDir())}
	s.opts.Port = freePort(t)
	t.Cleanup(s.Stop)
	return s
}

// Start starts a configured server and returns once it accepts client
// connections (JetStream may still be starting), or an error when it does
// not (its reserved port was taken meanwhile).
func (s *Server) Start() error { return s.tryStart() }

// NewCluster configures n JetStream servers forming one cluster on
// reserved loopback ports (client and cluster) without starting them:
// clients can be started before the servers and connect while the cluster
// forms. Start them with StartAll; they are shut down when the test ends.
func NewCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := newCluster(t, n, true)
	for _, s := range c.Servers {
		t.Cleanup(s.Stop)
	}
	return c
}

// newCluster configures n members of cluster "grouptest" (see
// localnats.JoinCluster), named S1...Sn; with clientPorts their client
// ports are reserved too, else random.
func newCluster(t testing.TB, n int, clientPorts bool) *Cluster {
	t.Helper()
	c := &Cluster{t: t}
	opts := make([]*server.Options, n)
	for i := range opts {
		o := localnats.ServerOptions(fmt.Sprintf("S%d", i+1), t.TempDir())
		if clientPorts {
			o.Port = freePort(t)
		}
		opts[i] = &o
	}
	if err := localnats.JoinCluster(opts, "grouptest"); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	for _, o := range opts {
		c.Servers = append(c.Servers, &Server{t: t, opts: *o})
	}
	return c
}

// StartAll starts every member at the same time and returns once each
// accepts client connections, without waiting for routes, a JetStream
// meta leader or anything else. It returns an error if a member did not
// start (a reserved port taken meanwhile); the others keep running.
func (c *Cluster) StartAll() error {
	errs := make([]error, len(c.Servers))
	var wg sync.WaitGroup
	for i, s := range c.Servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.tryStart()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// URLs returns the comma-separated client URLs of every member.
func (c *Cluster) URLs() string {
	var out string
	for i, s := range c.Servers {
		if i > 0 {
			out += ","
		}
		out += s.URL()
	}
	return out
}

// WaitReady waits until the cluster has a JetStream meta leader and takes a
// replicated key-value write, or fails the test after d.
func (c *Cluster) WaitReady(d time.Duration) {
	c.t.Helper()
	var live *Server
	for _, s := range c.Servers {
		if s.Running() {
			live = s
			break
		}
	}
	if live == nil {
		c.t.Fatalf("natstest: no running server")
	}
	nc := live.Connect()
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatalf("natstest: jetstream: %v", err)
	}
	replicas := 0
	for _, s := range c.Servers {
		if s.Running() {
			replicas++
		}
	}
	if replicas > 3 {
		replicas = 3
	}
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		if last = tryReplicatedWrite(js, replicas); last == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("natstest: cluster not ready after %v: %v", d, last)
}

func tryReplicatedWrite(js jetstream.JetStream, replicas int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return localnats.ProbeWrite(ctx, js, "natstest_ready", replicas)
}

// WaitStreamLeader polls until the stream has a leader that answers info
// requests, or fails the test after d.
func WaitStreamLeader(t testing.TB, js jetstream.JetStream, stream string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := js.Stream(ctx, stream)
		if err == nil {
			_, err = info.Info(ctx)
		}
		cancel()
		if err == nil {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("natstest: stream %s has no leader after %v: %v", stream, d, last)
}

// Eventually polls cond every 20ms until it returns nil or d passes, then
// fails the test with the last error.
func Eventually(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	err := cond()
	for err != nil {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", d, err)
		}
		time.Sleep(20 * time.Millisecond)
		err = cond()
	}
}

// ErrNotYet is a convenience for Eventually conditions.
var ErrNotYet = errors.New("not yet")

func freePort(t testing.TB) int {
	t.Helper()
	p, err := localnats.FreePort()
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return p
}

// RollupAll publishes "{}" on subject (a bucket's key, say) with a
// Nats-Rollup: all header: on a stream that allows roll-ups it erases every
// other subject's messages. Tests aim it at state a client may write.
func RollupAll(ctx context.Context, js jetstream.JetStream, subject string) error {
	m := nats.NewMsg(subject)
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupAll)
	m.Data = []byte("{}")
	_, err := js.PublishMsg(ctx, m)
	return err
}
