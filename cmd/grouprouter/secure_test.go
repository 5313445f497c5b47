package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

const nodePassword = "n0de-s3cret-pw"

// userServer is a JetStream server that requires a user: node, with
// password nodePassword.
func userServer(t *testing.T) *natstest.Server {
	return natstest.RunServerWith(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "node", Password: nodePassword}}
	})
}

// waitRegistry waits until a node created its registry bucket (it is
// set up) on the server at url, reached with opts.
func waitRegistry(t *testing.T, url string, stderr *natstest.Buffer, opts ...nats.Option) {
	t.Helper()
	nc := natstest.Connect(t, url, opts...)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		kv, err := js.KeyValue(ctx, kvbinding.DefaultNodesBucket)
		if err != nil {
			return fmt.Errorf("%v; node's stderr:\n%s", err, stderr)
		}
		// The node's first announcement, which 'nodes' lists, may come
		// a heartbeat after the bucket (later on a loaded machine).
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			return err
		}
		for k := range keys.Keys() {
			if strings.HasPrefix(k, "live.") {
				return nil
			}
		}
		return fmt.Errorf("no node announced yet; node's stderr:\n%s", stderr)
	})
}

// oneLine fails unless s is exactly one line containing want.
func oneLine(t *testing.T, what, s, want string) {
	t.Helper()
	if strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") || !strings.Contains(s, want) {
		t.Errorf("%s\n got %q\nwant one line containing %q", what, s, want)
	}
}

// TestUserPassword: a node and the client commands reach a server that
// requires a user, and the password never shows in the output.
func TestUserPassword(t *testing.T) {
	srv := userServer(t)
	stderr, stop := startCommand(t, "run", "--nats", srv.URL(), "--user", "node", "--password", nodePassword,
		"--node", "n1", "--log-level", "debug")
	waitRegistry(t, srv.URL(), stderr, nats.UserInfo("node", nodePassword))

	t.Setenv(envPassword, nodePassword)
	for _, cmd := range [][]string{{"bindings"}, {"nodes"}} {
		code, out, errOut := runCommand(t, append(cmd, "--nats", srv.URL(), "--user", "node")...)
		if code != exitOK || errOut != "" {
			t.Errorf("%s: exit %d, stderr %q", cmd[0], code, errOut)
		}
		if cmd[0] == "nodes" && !strings.Contains(out, "n1") {
			t.Errorf("nodes does not list n1:\n%s", out)
		}
	}
	// The password as a flag works too, with a warning that does not
	// repeat it.
	code, _, errOut := runCommand(t, "nodes", "--nats", srv.URL(), "--user", "node", "--password", nodePassword)
	if code != exitOK {
		t.Errorf("nodes --password: exit %d, stderr %q", code, errOut)
	}
	oneLine(t, "nodes --password stderr", errOut, "grouprouter: warning: a password on the command line")

	if code := stop(); code != exitOK {
		t.Fatalf("run: exit %d; stderr:\n%s", code, stderr)
	}
	log := stderr.String()
	if strings.Contains(log, nodePassword) {
		t.Errorf("the password is in the node's log:\n%s", log)
	}
	if !strings.Contains(log, "is visible to other users of this host (ps); prefer NATS_PASSWORD") {
		t.Errorf("no warning about --password in the node's log:\n%s", log)
	}
}

// TestRefusedCredentials: every command says in one line that NATS refused
// the credentials, and exits 1 at once (run does not wait for a server
// that said no).
func TestRefusedCredentials(t *testing.T) {
	srv := userServer(t)
	t.Setenv(envPassword, "wrong")
	want := `grouprouter: NATS refused the credentials for user "node" at ` + srv.URL()
	for _, args := range [][]string{
		{"run", "--node", "n1"},
		{"bindings"}, {"nodes"}, {"consume", "--node", "n1"}, {"move", "g", "n1"}, {"unbind", "g"},
		{"events"}, {"groups"}, {"where", "g"},
	} {
		t.Run(args[0], func(t *testing.T) {
			code, _, errOut := runCommand(t, append(args[:1], append([]string{"--nats", srv.URL(), "--user", "node"}, args[1:]...)...)...)
			if code != exitFailure {
				t.Errorf("exit %d, want %d", code, exitFailure)
			}
			oneLine(t, "stderr", errOut, want)
			if strings.Contains(errOut, "wrong") {
				t.Errorf("the password is in the output: %q", errOut)
			}
		})
	}
	t.Run("no credentials", func(t *testing.T) {
		os.Unsetenv(envPassword)
		code, _, errOut := runCommand(t, "bindings", "--nats", srv.URL())
		if code != exitFailure {
			t.Errorf("exit %d", code)
		}
		oneLine(t, "stderr", errOut, "grouprouter: NATS at "+srv.URL()+" requires credentials and none were given")
	})
}

// TestClientCommandsCannotReachNATS: one line, exit 1, without waiting.
func TestClientCommandsCannotReachNATS(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := "nats://" + l.Addr().String()
	l.Close()
	for _, args := range [][]string{{"bindings"}, {"nodes"}, {"consume", "--node", "n1"}, {"move", "g", "n1"}, {"unbind", "g"},
		{"events"}, {"groups"}, {"where", "g"}} {
		t.Run(args[0], func(t *testing.T) {
			code, _, errOut := runCommand(t, append(args[:1], append([]string{"--nats", nowhere}, args[1:]...)...)...)
			if code != exitFailure {
				t.Errorf("exit %d, want %d", code, exitFailure)
			}
			oneLine(t, "stderr", errOut, "grouprouter: cannot reach NATS at "+nowhere+": no server answered")
		})
	}
}

// TestTLS: a node and the client commands reach a server that requires TLS
// with client certificates.
func TestTLS(t *testing.T) {
	certs := natstest.NewTLS(t)
	srv := natstest.RunServerWith(t, func(o *server.Options) { certs.Configure(t, o, true) })
	tlsArgs := []string{"--tlsca", certs.CA, "--tlscert", certs.ClientCert, "--tlskey", certs.ClientKey}
	stderr, stop := startCommand(t, append([]string{"run", "--nats", srv.URL(), "--node", "n1"}, tlsArgs...)...)
	waitRegistry(t, srv.URL(), stderr, nats.RootCAs(certs.CA), nats.ClientCert(certs.ClientCert, certs.ClientKey))

	// The node's first announcement may come a heartbeat after the
	// bucket exists (later on a loaded machine): look until it is there.
	var (
		code        int
		out, errOut string
	)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		code, out, errOut = runCommand(t, append([]string{"nodes", "--nats", srv.URL()}, tlsArgs...)...)
		if code != exitOK || strings.Contains(out, "n1") || time.Now().After(deadline) {
			break
		}
	}
	if code != exitOK || !strings.Contains(out, "n1") {
		t.Errorf("nodes: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// The same from the environment, as the nats CLI takes it.
	t.Setenv(envCA, certs.CA)
	t.Setenv(envCert, certs.ClientCert)
	t.Setenv(envKey, certs.ClientKey)
	if code, _, errOut := runCommand(t, "bindings", "--nats", srv.URL()); code != exitOK {
		t.Errorf("bindings with NATS_CA, NATS_CERT, NATS_KEY: exit %d, stderr %q", code, errOut)
	}
	os.Unsetenv(envCA)
	code, _, errOut = runCommand(t, "bindings", "--nats", srv.URL())
	if code != exitFailure {
		t.Errorf("without the CA: exit %d", code)
	}
	oneLine(t, "without the CA", errOut, "grouprouter: TLS with NATS at "+srv.URL()+" failed: ")
	if !strings.Contains(errOut, "--tlsca") {
		t.Errorf("no hint at --tlsca: %q", errOut)
	}
	if code := stop(); code != exitOK {
		t.Fatalf("run: exit %d; stderr:\n%s", code, stderr)
	}
}

// TestContextAndInboxPrefix: a saved nats context supplies the server,
// the user and the password, and its inbox prefix is the only place the
// user may receive replies: everything the node and the commands do must
// use it.
func TestContextAndInboxPrefix(t *testing.T) {
	srv := natstest.RunServerWith(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "node", Password: nodePassword, Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{">"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"app-inbox.>", "grouping.>", "$SRV.>"}},
		}}}
	})
	xdg := t.TempDir()
	writeContext(t, xdg, "app", fmt.Sprintf(`{"url": %q, "user": "node", "password": %q, "inbox_prefix": "app-inbox"}`, srv.URL(), nodePassword))
	t.Setenv("XDG_CONFIG_HOME", xdg)
	stderr, stop := startCommand(t, "run", "--context", "app", "--node", "n1")
	waitRegistry(t, srv.URL(), stderr, nats.UserInfo("node", nodePassword), nats.CustomInboxPrefix("app-inbox"))

	t.Setenv(envContext, "app")
	natstest.Eventually(t, 30*time.Second, func() error {
		code, out, errOut := runCommand(t, "nodes")
		if code != exitOK || !strings.Contains(out, "n1") {
			return fmt.Errorf("nodes: exit %d, stdout %q, stderr %q; node:\n%s", code, out, errOut, stderr)
		}
		return nil
	})
	// A grouped message is decided, routed and consumed: proposal replies,
	// queue publish acks and pulls all come under the prefix.
	nc := natstest.Connect(t, srv.URL(), nats.UserInfo("node", nodePassword), nats.CustomInboxPrefix("app-inbox"))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg("jms.orders")
	msg.Header.Set("Group-Id", "order-1")
	msg.Data = []byte("first")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCommand(t, "consume", "--node", "n1", "--count", "1")
	if code != exitOK || !strings.Contains(out, "order-1 jms.orders first") {
		t.Errorf("consume: exit %d, stdout %q, stderr %q; node:\n%s", code, out, errOut, stderr)
	}
	if code, out, errOut := runCommand(t, "bindings"); code != exitOK || !strings.Contains(out, "order-1") {
		t.Errorf("bindings: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code := stop(); code != exitOK {
		t.Fatalf("run: exit %d; stderr:\n%s", code, stderr)
	}
	if strings.Contains(stderr.String(), "Permissions Violation") {
		t.Errorf("a reply outside the inbox prefix:\n%s", stderr)
	}
}

// TestJetStreamDomain: --js-domain sends the JetStream requests of the node
// and the commands to the domain's API.
func TestJetStreamDomain(t *testing.T) {
	srv := natstest.RunServerWith(t, func(o *server.Options) { o.JetStreamDomain = "hub" })
	stderr, stop := startCommand(t, "run", "--nats", srv.URL(), "--js-domain", "hub", "--node", "n1")
	waitRegistry(t, srv.URL(), stderr)
	natstest.Eventually(t, 30*time.Second, func() error {
		code, out, errOut := runCommand(t, "nodes", "--nats", srv.URL(), "--js-domain", "hub")
		if code != exitOK || !strings.Contains(out, "n1") {
			return fmt.Errorf("nodes: exit %d, stdout %q, stderr %q", code, out, errOut)
		}
		return nil
	})
	if code := stop(); code != exitOK {
		t.Fatalf("run: exit %d; stderr:\n%s", code, stderr)
	}
}

// TestEmbeddedRefusesOpenListen: listening beyond loopback without
// authentication, or without TLS, is refused before anything starts.
func TestEmbeddedRefusesOpenListen(t *testing.T) {
	storeDir := filepath.Join(t.TempDir(), "store")
	for _, listen := range []string{"0.0.0.0:4222", "[::]:4222", "192.0.2.1:4222"} {
		code, _, errOut := runCommand(t, "run", "--listen", listen, "--store-dir", storeDir, "--node", "n1")
		if code != exitUsage {
			t.Errorf("%s: exit %d, want %d", listen, code, exitUsage)
		}
		oneLine(t, listen, errOut, "grouprouter: invalid configuration: the embedded NATS server would listen on ")
		if !strings.Contains(errOut, "with no authentication") {
			t.Errorf("%s: %q does not say why", listen, errOut)
		}
	}
	// A configuration file whose port has no host listens everywhere too.
	portOnly := writeServerConfig(t, "port: 4333\n")
	if code, _, errOut := runCommand(t, "run", "--server-config", portOnly, "--store-dir", storeDir, "--node", "n1"); code != exitUsage {
		t.Errorf("port without host: exit %d, stderr %q", code, errOut)
	}
	if _, err := os.Stat(storeDir); !os.IsNotExist(err) {
		t.Errorf("the store directory was created: %v", err)
	}
	// Users without TLS: refused, passwords would cross the network in clear.
	withUsers := writeServerConfig(t, "authorization { users = [ {user: node, password: x} ] }\n")
	code, _, errOut := runCommand(t, "run", "--server-config", withUsers, "--listen", "0.0.0.0:4222", "--store-dir", storeDir, "--node", "n1")
	if code != exitUsage || !strings.Contains(errOut, "without TLS") {
		t.Errorf("users without TLS: exit %d, stderr %q; want refused for lack of TLS", code, errOut)
	}
	// With users and TLS, everywhere is allowed (checked without starting).
	certs := natstest.NewTLS(t)
	withTLS := writeServerConfig(t, fmt.Sprintf("authorization { users = [ {user: node, password: x} ] }\ntls { cert_file: %q, key_file: %q }\n",
		certs.ServerCert, certs.ServerKey))
	if _, err := parseRunArgs([]string{"--server-config", withTLS, "--listen", "0.0.0.0:4222"}, testEnv("h")); err != nil {
		t.Errorf("with users and TLS: %v", err)
	}
}

// TestEmbeddedServerConfig: the embedded server takes its users from
// --server-config, requires them, and the node's own connection uses the
// connection flags.
func TestEmbeddedServerConfig(t *testing.T) {
	conf := writeServerConfig(t, fmt.Sprintf("server_name: from-config\nauthorization {\n  users = [ {user: node, password: %q} ]\n}\n", nodePassword))
	t.Setenv(envPassword, nodePassword)
	stderr, stop := startCommand(t, "run", "--server-config", conf, "--listen", "127.0.0.1:0",
		"--store-dir", filepath.Join(t.TempDir(), "store"), "--user", "node", "--node", "e1", "--log-json")
	var url string
	natstest.Eventually(t, 30*time.Second, func() error {
		for _, l := range logLines(t, stderr) {
			if msg, _ := l["msg"].(string); strings.HasPrefix(msg, "embedded NATS server started") {
				url, _ = l["url"].(string)
				if l["server_name"] != "from-config" || l["auth"] != true {
					return fmt.Errorf("embedded server line %v: want server_name from-config, auth true", l)
				}
				return nil
			}
		}
		return fmt.Errorf("no embedded server line:\n%s", stderr)
	})
	waitRegistry(t, url, stderr, nats.UserInfo("node", nodePassword))
	if nc, err := nats.Connect(url, nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Error("the embedded server accepted a connection without credentials")
	}
	if code, _, errOut := runCommand(t, "nodes", "--nats", url, "--user", "node"); code != exitOK {
		t.Errorf("nodes: exit %d, stderr %q", code, errOut)
	}
	if code := stop(); code != exitOK {
		t.Fatalf("run: exit %d; stderr:\n%s", code, stderr)
	}
}

func writeServerConfig(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "server.conf")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRunPermanentSetupErrors: a node whose setup cannot succeed ends with
// one line saying why (after its log lines), exit 1.
func TestRunPermanentSetupErrors(t *testing.T) {
	srv := natstest.RunServerWith(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "producer", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{"jms.>"}},
		}}}
	})
	accounts := natstest.RunServerWith(t, func(o *server.Options) {
		noJS := server.NewAccount("NOJS")
		o.Accounts = []*server.Account{noJS}
		o.Users = []*server.User{{Username: "nojs", Password: "pw", Account: noJS}}
	})
	conflict := natstest.RunServer(t)
	js, err := jetstream.New(conflict.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "GROUPING_INGRESS", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envPassword, "pw")
	tests := []struct {
		name, url, user, want string
	}{
		{"conflicting stream", conflict.URL(), "",
			"grouprouter: setting up the node's streams at " + conflict.URL() +
				": existing stream does not match the configuration: stream GROUPING_INGRESS captures [other.>], not jms.>\n"},
		{"permission denied", srv.URL(), "producer",
			`grouprouter: NATS denied user "producer" a permission grouprouter needs at ` + srv.URL() +
				`: Permissions Violation for Publish to "$JS.API.STREAM.INFO.GROUPING_INGRESS"` + "\n"},
		{"JetStream disabled for the account", accounts.URL(), "nojs",
			`grouprouter: JetStream is not enabled for the account of user "nojs" at ` + accounts.URL() + "; grouprouter needs it\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"run", "--nats", tt.url, "--node", "n1"}
			if tt.user != "" {
				args = append(args, "--user", tt.user)
			}
			code, _, errOut := runCommand(t, args...)
			if code != exitFailure {
				t.Errorf("exit %d, want %d", code, exitFailure)
			}
			lines := strings.SplitAfter(errOut, "\n")
			if last := lines[len(lines)-2]; last != tt.want {
				t.Errorf("last line\n got %q\nwant %q\nstderr:\n%s", last, tt.want, errOut)
			}
		})
	}
}
