package main

import (
	"bytes"
	"context"
	"encoding/json"
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

func TestEmbeddedPortInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()

	var stdout, stderr bytes.Buffer
	code := run([]string{"run", "--listen", addr, "--store-dir", t.TempDir(), "--node", "n1"}, &stdout, &stderr)
	if code != exitFailure {
		t.Errorf("exit %d, want %d", code, exitFailure)
	}
	want := "grouprouter: cannot start the embedded NATS server: " + addr + " is already in use; " +
		"to join the NATS server already listening there, run with --nats nats://" + addr + " (or pick another port with --listen)\n"
	if got := stderr.String(); !strings.HasSuffix(got, want) {
		t.Errorf("stderr\n got %q\nwant suffix %q", got, want)
	}
}

// startCommand runs the command line in the background until the test
// ends or the returned stop is called; stop returns the exit code.
func startCommand(t *testing.T, args ...string) (stderr *natstest.Buffer, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stderr = &natstest.Buffer{}
	done := make(chan int, 1)
	go func() { done <- runContext(ctx, args, &bytes.Buffer{}, stderr) }()
	stopped := false
	var code int
	stop = func() int {
		t.Helper()
		if stopped {
			return code
		}
		stopped = true
		cancel()
		select {
		case code = <-done:
		case <-time.After(60 * time.Second):
			t.Fatalf("command did not stop; stderr:\n%s", stderr)
		}
		return code
	}
	t.Cleanup(func() { stop() })
	return stderr, stop
}

// logLines returns the JSON log lines written so far.
func logLines(t *testing.T, stderr *natstest.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(stderr.String(), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			continue // the final "grouprouter: ..." line of a failure
		}
		out = append(out, m)
	}
	return out
}

func TestRunEmbedded(t *testing.T) {
	storeDir := filepath.Join(t.TempDir(), "data", "grouprouter")
	stderr, stop := startCommand(t, "run", "--listen", "127.0.0.1:0", "--store-dir", storeDir, "--node", "e1", "--log-json")

	var url string
	natstest.Eventually(t, 30*time.Second, func() error {
		for _, l := range logLines(t, stderr) {
			if msg, _ := l["msg"].(string); strings.HasPrefix(msg, "embedded NATS server started") {
				url, _ = l["url"].(string)
				if !strings.Contains(msg, "--nats "+url) {
					return fmt.Errorf("log line does not say how to join: %q", msg)
				}
				if l["sync"] != "always" {
					t.Errorf("the embedded server's fsync policy is %v, want always by default", l["sync"])
				}
				return nil
			}
		}
		if s := stderr.String(); strings.HasPrefix(s, "grouprouter: ") || strings.Contains(s, "\ngrouprouter: ") {
			t.Fatalf("command failed:\n%s", stderr)
		}
		return fmt.Errorf("no start line yet in:\n%s", stderr)
	})
	if !strings.HasPrefix(url, "nats://127.0.0.1:") || strings.HasSuffix(url, ":0") {
		t.Fatalf("url %q", url)
	}

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	if got := nc.ConnectedServerName(); got != embeddedServerName {
		t.Errorf("server name %q, want %q", got, embeddedServerName)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Errorf("JetStream on the embedded server: %v", err)
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.KeyValue(ctx, kvbinding.DefaultBucket) // the node has set up
		return err
	})
	nc.Close()

	fi, err := os.Stat(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		t.Errorf("store dir mode %v, want 0700", perm)
	}
	if _, err := os.Stat(filepath.Join(storeDir, "jetstream")); err != nil {
		t.Errorf("no JetStream store under the store dir: %v", err)
	}

	if code := stop(); code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	// The embedded server is gone with the command.
	if nc, err := nats.Connect(url, nats.Timeout(time.Second)); err == nil {
		nc.Close()
		t.Error("embedded server still accepts connections after the command returned")
	}
}

func TestRunJoinsNATS(t *testing.T) {
	srv := natstest.RunServer(t)
	stderr, stop := startCommand(t, "run", "--nats", srv.URL(), "--node", "n7", "--type", "LOCAL")

	connected := func(want bool) func() error {
		return func() error {
			cz, err := srv.Server().Connz(&server.ConnzOptions{})
			if err != nil {
				return err
			}
			found := false
			for _, c := range cz.Conns {
				found = found || c.Name == "grouprouter-n7"
			}
			if found != want {
				return fmt.Errorf("connection grouprouter-n7 present=%v, want %v; stderr:\n%s", found, want, stderr)
			}
			return nil
		}
	}
	natstest.Eventually(t, 30*time.Second, connected(true))
	// Let the node finish setting up (a LOCAL node creates the bindings
	// bucket; a REMOTE one would wait for it) so
	// that the stop below is a shutdown, not an aborted start.
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.KeyValue(ctx, kvbinding.DefaultBucket)
		return err
	})
	if code := stop(); code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	natstest.Eventually(t, 10*time.Second, connected(false))
	// The start line says which build runs (a test binary has no VCS stamp).
	for _, want := range []string{`msg="grouprouter node starting" version=(devel) revision="" node=`, "grouprouter node stopped"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("no %q line:\n%s", want, stderr)
		}
	}
}

// TestRunWaitsForNATS: a node started before its NATS server says it waits
// and goes on when the server comes.
func TestRunWaitsForNATS(t *testing.T) {
	srv := natstest.NewServer(t)
	stderr, stop := startCommand(t, "run", "--nats", srv.URL(), "--node", "n1", "--log-json")
	natstest.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(stderr.String(), `"msg":"waiting for NATS at `+srv.URL()) {
			return fmt.Errorf("no waiting line yet:\n%s", stderr)
		}
		return nil
	})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := js.KeyValue(ctx, kvbinding.DefaultNodesBucket)
		return err
	})
	if code := stop(); code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{`"msg":"connected to NATS"`, `"msg":"grouprouter node starting"`} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("no %s line:\n%s", want, stderr)
		}
	}
}
