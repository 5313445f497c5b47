package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/router"
)

func TestHTTPFlag(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // httpAddr, or the error's text
		err  bool
	}{
		{name: "off by default", args: nil, want: ""},
		{name: "host and port", args: []string{"--http", "127.0.0.1:8222"}, want: "127.0.0.1:8222"},
		{name: "every interface", args: []string{"--http", " :8222"}, want: ":8222"},
		{name: "with --nats", args: []string{"--nats", "nats://a:4222", "--http", "[::1]:0"}, want: "[::1]:0"},
		{name: "no port", args: []string{"--http", "localhost"}, err: true, want: `--http "localhost": want HOST:PORT`},
		{name: "bad port", args: []string{"--http", "localhost:99999"}, err: true, want: "port must be 0 to 65535"},
		{name: "empty", args: []string{"--http", ""}, err: true, want: `--http "": want HOST:PORT`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := parseRunArgs(append([]string{"--node", "n1"}, tt.args...), testEnv("h"))
			if tt.err {
				if !errors.Is(err, router.ErrConfig) || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("err %v, want a configuration error saying %q", err, tt.want)
				}
				return
			}
			if err != nil || opts.httpAddr != tt.want {
				t.Fatalf("httpAddr %q, err %v; want %q", opts.httpAddr, err, tt.want)
			}
		})
	}
}

func TestRunHTTPAddressBusy(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	var stdout, stderr bytes.Buffer
	code := run([]string{"run", "--nats", "nats://127.0.0.1:1", "--node", "n1", "--http", busy.Addr().String()}, &stdout, &stderr)
	if code != exitFailure || !strings.HasPrefix(stderr.String(), "grouprouter: cannot serve --http "+busy.Addr().String()) {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

// TestRunHTTP runs the command with --http and reads its endpoints.
func TestRunHTTP(t *testing.T) {
	srv := natstest.RunServer(t)
	stderr, stop := startCommand(t, "run", "--nats", srv.URL(), "--node", "w1", "--http", "127.0.0.1:0", "--log-json")
	var base string
	natstest.Eventually(t, 30*time.Second, func() error {
		for _, l := range logLines(t, stderr) {
			if msg, _ := l["msg"].(string); strings.HasPrefix(msg, "HTTP endpoints listening") {
				base = fmt.Sprintf("http://%s", l["addr"])
				return nil
			}
		}
		return fmt.Errorf("no listening line yet in:\n%s", stderr)
	})
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d %q", code, body)
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		if code, body := get("/readyz"); code != http.StatusOK {
			return fmt.Errorf("/readyz: %d %q", code, body)
		}
		return nil
	})
	_, metrics := get("/metrics")
	for _, want := range []string{
		`grouprouter_node_info{handler="grouping-handler",node="w1",type="LOCAL"} 1`,
		"grouprouter_ready 1",
		"grouprouter_handler_active ",
		"grouprouter_messages_routed_total 0",
		"go_goroutines ", "process_cpu_seconds_total ", // the process's own
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if code, page := get("/"); code != http.StatusOK || !strings.Contains(page, `data-node="w1"`) {
		t.Errorf("status page: %d\n%s", code, page)
	}
	if code := stop(); code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("the HTTP endpoints still answer after the command returned")
	}
}
