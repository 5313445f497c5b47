package retry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
)

// The classification, checked on errors the real client and server
// produce for each situation.
func TestPermanentOnRealErrors(t *testing.T) {
	authSrv := natstest.RunServerWith(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "app", Password: "right"},
			{Username: "narrow", Password: "pw", Permissions: &server.Permissions{
				Publish: &server.SubjectPermission{Allow: []string{"app.>"}},
			}},
		}
	})
	plain := natstest.RunServer(t)
	noJS := natstest.RunServerWith(t, func(o *server.Options) { o.JetStream = false })
	accounts := natstest.RunServerWith(t, func(o *server.Options) {
		o.Accounts = []*server.Account{server.NewAccount("NOJS")}
		o.Users = []*server.User{{Username: "nojs", Password: "pw", Account: o.Accounts[0]}}
	})
	certs := natstest.NewTLS(t)
	tlsSrv := natstest.RunServerWith(t, func(o *server.Options) { certs.Configure(t, o, false) })
	clusterOfOne := natstest.NewCluster(t, 3)
	if err := clusterOfOne.Servers[0].Start(); err != nil {
		t.Fatal(err)
	}

	connect := func(url string, opts ...nats.Option) (*nats.Conn, error) {
		return nats.Connect(url, append([]nats.Option{nats.Timeout(2 * time.Second)}, opts...)...)
	}
	mustConnect := func(t *testing.T, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
		t.Helper()
		nc, err := connect(url, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return nc, js
	}
	ctx := func(t *testing.T) context.Context {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		t.Cleanup(cancel)
		return c
	}
	stream := func(name string, subjects ...string) jetstream.StreamConfig {
		return jetstream.StreamConfig{Name: name, Subjects: subjects}
	}

	tests := []struct {
		name      string
		permanent bool
		err       func(t *testing.T) error
	}{
		{"wrong password", true, func(t *testing.T) error {
			_, err := connect(authSrv.URL(), nats.UserInfo("app", "wrong"))
			return err
		}},
		{"unknown user", true, func(t *testing.T) error {
			_, err := connect(authSrv.URL(), nats.UserInfo("nobody", "x"))
			return err
		}},
		{"no credentials where required", true, func(t *testing.T) error {
			_, err := connect(authSrv.URL())
			return err
		}},
		{"no server listening", false, func(t *testing.T) error {
			_, err := connect("nats://" + closedPort(t))
			return err
		}},
		{"TLS server, unknown authority", true, func(t *testing.T) error {
			_, err := connect(tlsSrv.URL(), nats.Secure())
			return err
		}},
		{"TLS handshake first to a server that does not expect it", true, func(t *testing.T) error {
			_, err := connect(tlsSrv.URL(), nats.TLSHandshakeFirst(), nats.RootCAs(certs.CA), nats.Secure())
			if err == nil {
				return errors.New("connected")
			}
			return err
		}},
		{"no responders", false, func(t *testing.T) error {
			nc, _ := mustConnect(t, plain.URL())
			_, err := nc.Request("nobody.listens", nil, time.Second)
			return err
		}},
		{"JetStream not enabled on the server (no responders)", false, func(t *testing.T) error {
			_, js := mustConnect(t, noJS.URL())
			_, err := js.Stream(ctx(t), "S")
			return err
		}},
		{"JetStream disabled for the account", true, func(t *testing.T) error {
			_, js := mustConnect(t, accounts.URL(), nats.UserInfo("nojs", "pw"))
			_, err := js.CreateStream(ctx(t), stream("S", "s.>"))
			return err
		}},
		{"no meta leader (one server of three)", false, func(t *testing.T) error {
			_, js := mustConnect(t, clusterOfOne.Servers[0].URL())
			_, err := js.CreateStream(ctx(t), stream("S", "s.>"))
			return err
		}},
		{"stream exists with another configuration", true, func(t *testing.T) error {
			_, js := mustConnect(t, plain.URL())
			if _, err := js.CreateStream(ctx(t), stream("CONFLICT", "c1.>")); err != nil {
				t.Fatal(err)
			}
			_, err := js.CreateStream(ctx(t), stream("CONFLICT", "c2.>"))
			return err
		}},
		{"replicas on a single server", true, func(t *testing.T) error {
			_, js := mustConnect(t, plain.URL())
			cfg := stream("R3", "r3.>")
			cfg.Replicas = 3
			_, err := js.CreateStream(ctx(t), cfg)
			return err
		}},
		{"stream not found", false, func(t *testing.T) error {
			_, js := mustConnect(t, plain.URL())
			_, err := js.Stream(ctx(t), "MISSING")
			return err
		}},
		{"closed connection", true, func(t *testing.T) error {
			nc, js := mustConnect(t, plain.URL())
			nc.Close()
			_, err := js.Stream(ctx(t), "S")
			return err
		}},
		{"wrapped as the router wraps", true, func(t *testing.T) error {
			_, err := connect(authSrv.URL(), nats.UserInfo("app", "wrong"))
			return fmt.Errorf("grouping: setup: %w", err)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.err(t)
			if err == nil {
				t.Fatal("no error")
			}
			t.Logf("%v", err)
			if got := Permanent(err); got != tt.permanent {
				t.Errorf("Permanent(%v) = %v, want %v", err, got, tt.permanent)
			}
		})
	}

	// A JetStream request the user may not publish gets no answer; the
	// violation comes on the connection.
	t.Run("permission denied", func(t *testing.T) {
		nc, js := mustConnect(t, authSrv.URL(), nats.UserInfo("narrow", "pw"))
		before := nc.LastError()
		_, err := js.Stream(ctx(t), "S")
		if err == nil {
			t.Fatal("no error")
		}
		if Permanent(err) {
			t.Errorf("the request's own error %v: permanent, want transient (it only timed out)", err)
		}
		var v error
		for deadline := time.Now().Add(5 * time.Second); v == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			v = Violation(nc, before)
		}
		if v == nil || !Permanent(v) {
			t.Fatalf("Violation = %v, want a permanent permissions violation", v)
		}
		if Violation(nc, nc.LastError()) != nil {
			t.Error("an old violation reported again")
		}
	})
}

func TestBackoff(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		w *= time.Millisecond
		if d := b.Next(); d < w/2 || d > w {
			t.Errorf("attempt %d: %v, want between %v and %v", i+1, d, w/2, w)
		}
	}
	b.Reset()
	if d := b.Next(); d > 100*time.Millisecond {
		t.Errorf("after Reset: %v", d)
	}
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().(*net.TCPAddr)
	l.Close()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(addr.Port))
}
