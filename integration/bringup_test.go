package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/router"
)

// launchNode starts a router node on a connection to url that may not be
// up yet (the server may not even listen), without waiting for it to be
// ready: see waitReady.
func launchNode(t testing.TB, url string, cfg router.Config) *node {
	t.Helper()
	n := &node{t: t, id: cfg.Node, cfg: cfg, url: url}
	n.nc = natstest.Connect(t, url, nats.Name("node-"+n.id), nats.RetryOnFailedConnect(true))
	t.Cleanup(n.stop)
	r, err := router.New(n.nc, cfg)
	if err != nil {
		t.Fatalf("router.New(%s): %v", n.id, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	n.r, n.cancel, n.done = r, cancel, done
	go func() { done <- r.Run(ctx) }()
	return n
}

// waitReady waits until the node routes, failing the test if its Run
// returned first or d passed.
func (n *node) waitReady(d time.Duration) {
	n.t.Helper()
	select {
	case <-n.r.Ready():
	case err := <-n.done:
		n.cancel = nil
		n.t.Fatalf("node %s stopped during start: %v", n.id, err)
	case <-time.After(d):
		n.t.Fatalf("node %s not ready after %v; its log's last 8 KiB (INFO and up):\n%s", n.id, d, n.log.tail(8<<10))
	}
}

// TestBringUpClusterAndNodesAtOnce starts three servers and three nodes at
// the same moment, each node on its own server, as a compose file does:
// the nodes connect while the servers start and the cluster forms, and
// every one of them must wait for it, become ready and route.
func TestBringUpClusterAndNodesAtOnce(t *testing.T) {
	t.Parallel() // see doc.go
	c := natstest.NewCluster(t, 3)
	started := make(chan error, 1)
	begin := time.Now()
	go func() { started <- c.StartAll() }()
	types := []router.HandlerType{router.Local, router.Remote, router.Remote}
	nodes := make([]*node, 3)
	for i := range nodes {
		nodes[i] = launchNode(t, c.Servers[i].URL(), testConfig(fmt.Sprintf("n%d", i), types[i]))
	}
	if err := <-started; err != nil {
		t.Fatalf("servers: %v", err)
	}
	for _, n := range nodes {
		n.waitReady(2 * time.Minute)
	}
	t.Logf("three nodes ready %v after the servers and nodes were started", time.Since(begin).Round(time.Millisecond))

	var col collector
	for _, n := range nodes {
		startConsumer(t, n.url, n.id, &col)
	}
	nc := c.Servers[0].Connect()
	waitEligible(t, nc, []string{"n0", "n1", "n2"}, []string{"n0", "n1", "n2"})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	for g := 0; g < 12; g++ {
		sendBatch(t, js, fmt.Sprintf("g%02d", g), "a", 5, want)
	}
	for g := 0; g < 12; g++ {
		sendBatch(t, js, fmt.Sprintf("g%02d", g), "b", 5, want)
	}
	got := col.waitCount(t, 120, time.Minute)
	checkGrouping(t, got, want)
	checkQueuedOnce(t, js, 120)
	for _, s := range []string{router.IngressStream, router.QueueStream, router.DeadLetterStream, "KV_grouping-bindings", "KV_grouping-nodes"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := js.Stream(ctx, s)
		cancel()
		if err != nil {
			t.Fatalf("stream %s: %v", s, err)
		}
		if r := st.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want 3 (auto in a cluster of 3)", s, r)
		}
	}
}

// TestNodeStartedBeforeItsServer: a node whose NATS server is not up yet
// waits for it, and routes once it is.
func TestNodeStartedBeforeItsServer(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.NewServer(t)
	n := launchNode(t, s.URL(), testConfig("n0", router.Local))
	select {
	case <-n.r.Ready():
		t.Fatal("node ready without a server")
	case err := <-n.done:
		n.cancel = nil
		t.Fatalf("node gave up without a server: %v", err)
	default:
	}
	if n.nc.IsConnected() {
		t.Fatal("connected without a server")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	n.waitReady(time.Minute)

	var col collector
	startConsumer(t, s.URL(), "n0", &col)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0"}, []string{"n0"})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	sendBatch(t, js, "a", "x", 5, want)
	sendBatch(t, js, "b", "x", 5, want)
	checkGrouping(t, col.waitCount(t, 10, 30*time.Second), want)
}

// TestSetupStopsOnPermanentErrors: what waiting cannot fix ends Run at once
// with an error wrapping router.ErrPermanent.
func TestSetupStopsOnPermanentErrors(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServerWith(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "producer", Password: "pw", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{"jms.>"}},
			}},
			{Username: "admin", Password: "pw"},
		}
	})
	// With accounts configured, one without JetStream.
	accounts := natstest.RunServerWith(t, func(o *server.Options) {
		noJS := server.NewAccount("NOJS")
		o.Accounts = []*server.Account{noJS}
		o.Users = []*server.User{{Username: "nojs", Password: "pw", Account: noJS}}
	})
	tests := []struct {
		name string
		srv  *natstest.Server
		user string
		prep func(t *testing.T, js jetstream.JetStream)
		want error
	}{
		{name: "permission denied", srv: s, user: "producer", want: nats.ErrPermissionViolation},
		{name: "JetStream disabled for the account", srv: accounts, user: "nojs", want: jetstream.ErrJetStreamNotEnabledForAccount},
		{name: "conflicting stream", srv: s, user: "admin", want: router.ErrStreamConflict,
			prep: func(t *testing.T, js jetstream.JetStream) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: router.IngressStream, Subjects: []string{"other.>"}}); err != nil {
					t.Fatal(err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc := natstest.Connect(t, tt.srv.URL(), nats.UserInfo(tt.user, "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
			if tt.prep != nil {
				js, err := jetstream.New(nc)
				if err != nil {
					t.Fatal(err)
				}
				tt.prep(t, js)
			}
			r, err := router.New(nc, testConfig("n0", router.Local))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err = r.Run(ctx)
			if ctx.Err() != nil {
				t.Fatalf("Run waited until the deadline; want it to stop at once (err %v)", err)
			}
			if !errors.Is(err, router.ErrPermanent) || !errors.Is(err, tt.want) {
				t.Fatalf("Run: %v; want an error wrapping ErrPermanent and %v", err, tt.want)
			}
			t.Logf("Run: %v", err)
		})
	}
}

// TestAutoReplicas: with auto replicas, a node on a cluster whose servers
// do not advertise each other to clients (cluster no_advertise, as behind
// a load balancer) still gets three replicas, since the servers place
// them; a node on a cluster of two, which cannot place three, waits for it
// to form, then settles for one, and routes.
func TestAutoReplicas(t *testing.T) {
	t.Parallel() // see doc.go
	for _, tt := range []struct {
		name    string
		servers int
		want    int
	}{
		{"3 servers, no_advertise", 3, 3},
		{"2 servers", 2, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := natstest.RunClusterWith(t, tt.servers, func(o *server.Options) { o.Cluster.NoAdvertise = true })
			n := launchNode(t, c.Servers[0].URL(), testConfig("n0", router.Local))
			n.waitReady(time.Minute)
			if known := len(n.nc.Servers()); known != 1 {
				t.Errorf("the node's connection knows %d servers, want only its own (no_advertise)", known)
			}
			nc := c.Servers[0].Connect()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []string{router.IngressStream, router.QueueStream, "KV_grouping-bindings", "KV_grouping-nodes"} {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				st, err := js.Stream(ctx, s)
				cancel()
				if err != nil {
					t.Fatalf("stream %s: %v", s, err)
				}
				if r := st.CachedInfo().Config.Replicas; r != tt.want {
					t.Errorf("stream %s has %d replicas, want %d", s, r, tt.want)
				}
			}
			var col collector
			startConsumer(t, n.url, n.id, &col)
			waitEligible(t, nc, []string{"n0"}, []string{"n0"})
			want := map[string][]string{}
			sendBatch(t, js, "g1", "a", 5, want)
			checkGrouping(t, col.waitCount(t, 5, 30*time.Second), want)
		})
	}
}
