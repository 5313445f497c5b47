package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/router"
)

func TestNodes(t *testing.T) {
	srv := natstest.RunServer(t)

	// Before any node ran: a clear error, and no bucket created.
	code, stdout, stderr := runCommand(t, "nodes", "--nats", srv.URL())
	if code != exitFailure || stdout != "" ||
		stderr != fmt.Sprintf("grouprouter: no nodes yet: is a grouprouter node running? (no bucket %q at %s)\n", kvbinding.DefaultNodesBucket, srv.URL()) {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	startRouter(t, srv, router.QueuePinned)
	// The node is listed once it announced itself, the handler once it has
	// taken the lease (the router's handler name is "h"). (Router.HandlerActive
	// is not used: it races with Router.Run setting up the handler.)
	natstest.Eventually(t, 30*time.Second, func() error {
		code, stdout, stderr = runCommand(t, "nodes", "--nats", srv.URL(), "--name", "h")
		if code != exitOK {
			return fmt.Errorf("exit %d: %s", code, stderr)
		}
		if !strings.Contains(stdout, "\nn1 ") || strings.HasSuffix(stdout, "handler: none\n") {
			return fmt.Errorf("n1 or its handler not listed yet:\n%s", stdout)
		}
		return nil
	})
	lines := strings.Split(stdout, "\n")
	header := strings.Fields(lines[0])
	if got, want := strings.Join(header, " "), "NODE TYPE CONSUMER POSITION HELD ROUTED DECISION-ERRORS DEAD-LETTERED HEARTBEAT"; got != want {
		t.Errorf("header %q, want %q", got, want)
	}
	row := strings.Fields(lines[1])
	if len(row) != len(header) || row[0] != "n1" || row[1] != "LOCAL" || row[2] != "no" {
		t.Errorf("row %q", lines[1])
	} else if _, err := time.Parse(timeLayout, row[8]); err != nil {
		t.Errorf("heartbeat %q: %v", row[8], err)
	}
	if !strings.HasSuffix(stdout, "\n\nactive LOCAL handler: h/n1\n") {
		t.Errorf("no active handler line:\n%s", stdout)
	}
	if stderr != "" {
		t.Errorf("stderr: %s", stderr)
	}

	// Another handler name has no active handler.
	code, stdout, stderr = runCommand(t, "nodes", "--nats", srv.URL())
	if code != exitOK || !strings.HasSuffix(stdout, "\nactive LOCAL handler: none\n") {
		t.Errorf("exit %d, stderr %q, stdout:\n%s", code, stderr, stdout)
	}

	t.Run("json", func(t *testing.T) {
		code, stdout, stderr := runCommand(t, "nodes", "--json", "--nats", srv.URL(), "--name", "h")
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		var got struct {
			Nodes   []kvbinding.NodeInfo `json:"nodes"`
			Handler *struct {
				Name     string    `json:"name"`
				Holder   string    `json:"holder"`
				Since    time.Time `json:"since"`
				Revision uint64    `json:"revision"`
			} `json:"handler"`
		}
		if err := json.Unmarshal([]byte(stdout), &got); err != nil {
			t.Fatalf("%v in %s", err, stdout)
		}
		if len(got.Nodes) != 1 || got.Nodes[0].Node != "n1" || got.Nodes[0].Type != "LOCAL" || got.Nodes[0].Handler != "h" {
			t.Errorf("nodes %+v", got.Nodes)
		}
		if h := got.Handler; h == nil || h.Name != "h" || h.Holder != "h/n1" || h.Since.IsZero() || h.Revision == 0 {
			t.Errorf("handler %+v", got.Handler)
		}

		code, stdout, _ = runCommand(t, "nodes", "--json", "--nats", srv.URL(), "--name", "other")
		if code != exitOK || !strings.Contains(stdout, `"handler": null`) {
			t.Errorf("exit %d, stdout %s", code, stdout)
		}
	})
}

func TestNodesUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		code int
		out  string // on stdout for 0, else on stderr
	}{
		{[]string{"nodes", "-h"}, exitOK, "Usage: grouprouter nodes"},
		{[]string{"nodes", "extra"}, exitUsage, `grouprouter nodes: unexpected argument "extra" (see 'grouprouter nodes -h')`},
		{[]string{"nodes", "--bogus"}, exitUsage, "grouprouter nodes: flag provided but not defined: -bogus"},
		{[]string{"nodes", "--name", "a b"}, exitUsage, "grouprouter: invalid configuration: name: name"},
		{[]string{"nodes", "--nats", ""}, exitUsage, "grouprouter: invalid configuration: --nats is empty"},
		{[]string{"consume", "-h"}, exitOK, "Usage: grouprouter consume"},
		{[]string{"consume", "--count", "x"}, exitUsage, `grouprouter consume: invalid value "x" for flag -count`},
		{[]string{"consume", "--count", "-2"}, exitUsage, "grouprouter: invalid configuration: --count must be >= 0, got -2"},
		{[]string{"consume", "--node", "n1", "extra"}, exitUsage, `grouprouter consume: unexpected argument "extra"`},
		{[]string{"run", "--queue-mode", "fifo"}, exitUsage, `grouprouter: invalid configuration: queue mode "fifo" (want pinned or plain)`},
	} {
		code, stdout, stderr := runCommand(t, tt.args...)
		if code != tt.code {
			t.Errorf("%v: exit %d, want %d (stderr %q)", tt.args, code, tt.code, stderr)
		}
		where := stderr
		if tt.code == exitOK {
			where = stdout
		}
		if !strings.Contains(where, tt.out) {
			t.Errorf("%v: output %q does not contain %q", tt.args, where, tt.out)
		}
	}
}
