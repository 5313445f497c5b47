package natstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// echoTarget accepts connections on loopback and echoes what it reads; it
// reports each accepted connection on the returned channel.
func echoTarget(t *testing.T) (string, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String(), accepted
}

// nothingArrives asserts that reading c yields nothing for a while: what
// a held connection must show (an absence can only be watched for a time).
func nothingArrives(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if n > 0 {
		t.Fatalf("read %q through a held proxy", buf[:n])
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read through a held proxy: %v, want a timeout (the connection stays open)", err)
	}
}

func readFull(t *testing.T, c net.Conn, n int, d time.Duration) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, n)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	return buf
}

// A held proxy keeps its connections open and forwards nothing; on heal
// everything written meanwhile arrives, in order, both ways (the echo's
// answers included).
func TestProxyHoldDeliversInOrderOnHeal(t *testing.T) {
	target, _ := echoTarget(t)
	p := NewProxy(t, target)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("before;")); err != nil {
		t.Fatal(err)
	}
	if got := readFull(t, c, 7, 5*time.Second); string(got) != "before;" {
		t.Fatalf("echo %q", got)
	}

	p.Hold()
	var want bytes.Buffer
	for i := range 200 {
		chunk := fmt.Sprintf("held-%03d;", i)
		want.WriteString(chunk)
		if _, err := c.Write([]byte(chunk)); err != nil {
			t.Fatalf("write while held: %v", err)
		}
	}
	nothingArrives(t, c, 300*time.Millisecond)
	Eventually(t, 5*time.Second, func() error {
		if n := p.HeldBytes(); n != want.Len() {
			return fmt.Errorf("%d of %d bytes held", n, want.Len())
		}
		return nil
	})

	p.Heal()
	if got := readFull(t, c, want.Len(), 5*time.Second); !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("after heal got %q, want %q", got, want.Bytes())
	}
}

// A connection accepted while held is not dialed to the target until the
// heal; one whose dialer gives up before then never reaches it.
func TestProxyHeldConnectionNotDialed(t *testing.T) {
	target, accepted := echoTarget(t)
	p := NewProxy(t, target)
	p.Hold()

	gaveUp, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gaveUp.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 5*time.Second, func() error {
		if len(p.Conns()) != 1 {
			return ErrNotYet
		}
		return nil
	})
	_ = gaveUp.Close()
	Eventually(t, 5*time.Second, func() error {
		if n := len(p.Conns()); n != 0 {
			return fmt.Errorf("%d connections", n)
		}
		return nil
	})

	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-accepted:
		t.Fatal("the target saw a connection accepted while held")
	case <-time.After(300 * time.Millisecond):
	}
	p.Heal()
	if got := readFull(t, c, 5, 5*time.Second); string(got) != "hello" {
		t.Fatalf("after heal got %q", got)
	}
	if n := len(accepted); n != 1 {
		t.Fatalf("the target accepted %d connections, want 1 (the one given up must never reach it)", n)
	}
}

// Cut closes the connections and refuses new ones until healed.
func TestProxyCut(t *testing.T) {
	target, _ := echoTarget(t)
	p := NewProxy(t, target)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a cut connection: %v, want it closed", err)
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c2.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a new connection while cut stays open: %v", err)
		}
		c2.Close()
	}
	p.Heal()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if _, err := c3.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	if got := readFull(t, c3, 2, 5*time.Second); string(got) != "ok" {
		t.Fatalf("after heal got %q", got)
	}
}

// A proxy whose target refuses a connection dials its fallback, as a
// client given several servers connects to another one; Rehome closes
// such connections, and the next one reaches the target again.
func TestProxyFallsBackAndRehomes(t *testing.T) {
	// The target: a port that refuses (a listener closed), then listens.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	_ = ln.Close()
	fallback, viaFallback := echoTarget(t)
	p := NewProxy(t, target, Fallbacks(fallback))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("fb")); err != nil {
		t.Fatal(err)
	}
	if got := readFull(t, c, 2, 5*time.Second); string(got) != "fb" {
		t.Fatalf("through the fallback got %q", got)
	}
	select {
	case <-viaFallback:
	case <-time.After(5 * time.Second):
		t.Fatal("the fallback accepted no connection")
	}
	if conns := p.Conns(); len(conns) != 1 || conns[0].Target != fallback {
		t.Fatalf("connections %+v, want one dialed to the fallback %s", conns, fallback)
	}

	back, err := net.Listen("tcp", target)
	if err != nil {
		t.Skipf("the target's port %s was taken meanwhile: %v", target, err)
	}
	defer back.Close()
	if n := p.Rehome(); n != 1 {
		t.Fatalf("Rehome closed %d connections, want 1", n)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a rehomed connection: %v, want it closed", err)
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	accepted := make(chan struct{})
	go func() {
		if a, err := back.Accept(); err == nil {
			close(accepted)
			_ = a.Close()
		}
	}()
	if _, err := c2.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the target, back, got no connection")
	}
}

func TestConnectName(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"CONNECT {\"echo\":true,\"name\":\"NABC\",\"cluster\":\"x\"}\r\nINFO {}\r\n", "NABC"},
		{"INFO {\"server_id\":\"NABC\"}\r\n", ""},
		{"CONNECT {not json\r\n", ""},
	} {
		if got := connectName([]byte(tc.in)); got != tc.want {
			t.Errorf("connectName(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// kvPut writes key through js with a deadline.
func kvPut(js jetstream.JetStream, bucket, key, value string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return err
	}
	_, err = kv.PutString(ctx, key, value)
	return err
}

// Server 0 cut off from the other two: every route goes through a proxy
// (none around them), a replicated write made through server 0 times out
// while one made through server 1 succeeds, and after the heal the
// cluster converges: server 0 takes writes again and serves the value
// written on the majority side meanwhile.
func TestProxiedClusterIsolate(t *testing.T) {
	pc := RunProxiedCluster(t, 3)
	Eventually(t, 10*time.Second, func() error {
		if err := pc.CheckRoutesProxied(); err != nil {
			return err
		}
		for _, s := range pc.Servers {
			if n := s.Server().NumRoutes(); n < 2 {
				return fmt.Errorf("%s has %d routes", s.Name(), n)
			}
		}
		return nil
	})
	nc0 := Connect(t, pc.ClientURL(0))
	if ds := nc0.DiscoveredServers(); len(ds) > 0 {
		t.Errorf("a client of the proxy learned the servers' own addresses %v: it could reconnect around the proxy", ds)
	}
	js0, err := jetstream.New(nc0, jetstream.WithDefaultTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	js1, err := jetstream.New(Connect(t, pc.ClientURL(1)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js1.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "split", Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if err := kvPut(js0, "split", "k", "before", 5*time.Second); err != nil {
		t.Fatal(err)
	}

	before := pc.RouteProxy(1).HeldBytes() + pc.RouteProxy(2).HeldBytes()
	for j := range pc.Servers {
		t.Logf("route proxy of %s: %d connections", pc.Servers[j].Name(), len(pc.RouteProxy(j).Conns()))
	}
	pc.Isolate(0)
	cut := time.Now()
	if err := kvPut(js0, "split", "k", "minority", 2*time.Second); err == nil {
		t.Fatal("a replicated write through the isolated server succeeded")
	}
	// The majority may first elect a new leader for the bucket.
	Eventually(t, 20*time.Second, func() error { return kvPut(js1, "split", "k", "majority", 2*time.Second) })
	t.Logf("the majority took a write %v after the cut", time.Since(cut).Round(time.Millisecond))
	if held := pc.RouteProxy(0).HeldBytes() + pc.RouteProxy(1).HeldBytes() + pc.RouteProxy(2).HeldBytes(); held <= before {
		t.Errorf("%d bytes held on the routes during the split (%d before): the traffic went around the proxies?", held, before)
	}
	if err := pc.CheckRoutesProxied(); err != nil {
		t.Error(err)
	}

	pc.Heal()
	healed := time.Now()
	Eventually(t, 30*time.Second, func() error { return kvPut(js0, "split", "k2", "healed", 2*time.Second) })
	t.Logf("server 0 took a write %v after the heal", time.Since(healed).Round(time.Millisecond))
	Eventually(t, 10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		kv, err := js0.KeyValue(ctx, "split")
		if err != nil {
			return err
		}
		e, err := kv.Get(ctx, "k")
		if err != nil {
			return err
		}
		if string(e.Value()) != "majority" {
			return fmt.Errorf("server 0 reads k=%q, want the majority's write", e.Value())
		}
		return nil
	})
	if err := pc.CheckRoutesProxied(); err != nil {
		t.Error(err)
	}
}

// A frozen server's clients get no answer; a black-holed link cuts one
// client only; both come back on heal.
func TestProxiedClusterFreezeAndLink(t *testing.T) {
	pc := RunProxiedCluster(t, 3)
	link := pc.LinkProxy(t, 2)
	viaLink := Connect(t, link.URL())
	viaClient := Connect(t, pc.ClientURL(2))
	other := Connect(t, pc.ClientURL(1))
	if _, err := other.Subscribe("ping", func(m *nats.Msg) { _ = m.Respond([]byte("pong")) }); err != nil {
		t.Fatal(err)
	}
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}
	ask := func(nc *nats.Conn) error {
		_, err := nc.Request("ping", nil, 500*time.Millisecond)
		return err
	}
	Eventually(t, 10*time.Second, func() error { return errors.Join(ask(viaLink), ask(viaClient)) })

	link.Hold()
	if err := ask(viaLink); err == nil {
		t.Error("a request over a held link was answered")
	}
	if err := ask(viaClient); err != nil {
		t.Errorf("another client of the same server: %v", err)
	}
	pc.Heal()
	Eventually(t, 10*time.Second, func() error { return ask(viaLink) })

	pc.Freeze(2)
	if err := ask(viaClient); err == nil {
		t.Error("a request through a frozen server was answered")
	}
	if err := ask(viaLink); err == nil {
		t.Error("a request over a link to a frozen server was answered")
	}
	pc.Heal()
	Eventually(t, 10*time.Second, func() error { return errors.Join(ask(viaLink), ask(viaClient)) })
}

// A restarted server has a new ID: the route proxies still tell who dials
// (every route connection is labeled with its dialer), and its routes go
// through them.
func TestProxiedClusterRestartedServerIdentified(t *testing.T) {
	pc := RunProxiedCluster(t, 3)
	pc.Servers[1].Stop()
	pc.Servers[1].Restart()
	pc.WaitReady(30 * time.Second)
	Eventually(t, 10*time.Second, func() error {
		if err := pc.CheckRoutesProxied(); err != nil {
			return err
		}
		if n := pc.Servers[1].Server().NumRoutes(); n < 2 {
			return fmt.Errorf("the restarted server has %d routes", n)
		}
		return nil
	})
	for j := range pc.Servers {
		for _, ci := range pc.RouteProxy(j).Conns() {
			if ci.Upstream != "" && ci.Label == "" {
				t.Errorf("route connection %d to %s (dialer name %q) not identified", ci.ID, pc.Servers[j].Name(), ci.Name)
			}
		}
	}
}
