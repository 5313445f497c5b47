package consumer_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/router"
	"github.com/grouprouter/grouprouter/router/routertest"
)

// externalProgram is a consume-only program as an application writes it:
// its own module, the public API of package consumer only. It consumes
// node os.Args[2]'s queue on server os.Args[1] until it has handled
// os.Args[3] messages, checking that each group's messages arrive in
// ingress order and in the order they were published (body "<group>:<i>",
// i from 0), and prints "ok <n>".
const externalProgram = `package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
)

func main() {
	want, _ := strconv.Atoi(os.Args[3])
	nc, err := nats.Connect(os.Args[1])
	if err != nil {
		fmt.Println("connect:", err)
		os.Exit(1)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		mu      sync.Mutex
		lastSeq = map[string]uint64{}
		next    = map[string]int{}
		got     int
		bad     string
	)
	err = consumer.Consume(ctx, js, os.Args[2], func(_ context.Context, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if m.IngressSeq <= lastSeq[m.Group] && bad == "" {
			bad = fmt.Sprintf("group %s: ingress seq %d after %d", m.Group, m.IngressSeq, lastSeq[m.Group])
		}
		if body := fmt.Sprintf("%s:%d", m.Group, next[m.Group]); string(m.Data) != body && bad == "" {
			bad = fmt.Sprintf("group %s: got %q, want %q", m.Group, m.Data, body)
		}
		lastSeq[m.Group] = m.IngressSeq
		next[m.Group]++
		if got++; got == want {
			cancel()
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	switch {
	case bad != "":
		fmt.Println("order:", bad)
		os.Exit(1)
	case got != want:
		fmt.Printf("got %d of %d messages (Consume: %v)\n", got, want, err)
		os.Exit(1)
	case err != nil:
		fmt.Println("consume:", err)
		os.Exit(1)
	}
	fmt.Println("ok", got)
}
`

// TestExternalConsumeOnlyProgram builds, in a module of its own, a program
// that imports package consumer and not package router (go list checks
// that its build does not hold router), and runs it against a real router
// node: it must get every group's messages in order.
func TestExternalConsumeOnlyProgram(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the program: %v", err)
	}
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string]string{
		"go.mod":  "module example.com/consumeonly\n\ngo 1.26\n\nrequire github.com/grouprouter/grouprouter v0.0.0\n\nreplace github.com/grouprouter/grouprouter => " + strconv.Quote(root) + "\n",
		"go.sum":  string(sum),
		"main.go": externalProgram,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goCmd := func(args ...string) *exec.Cmd {
		cmd := exec.Command(goBin, args...)
		cmd.Dir = dir
		// The environment (GOPROXY, GOMODCACHE, GOCACHE) is inherited.
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		return cmd
	}
	bin := filepath.Join(dir, "consumeonly")
	begin := time.Now()
	if out, err := goCmd("build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("program built in %v", time.Since(begin).Round(time.Millisecond))
	deps, err := goCmd("list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, p := range strings.Fields(string(deps)) {
		if p == "github.com/grouprouter/grouprouter/router" {
			t.Errorf("the consume-only program's build holds %s", p)
		}
	}

	s := natstest.RunServer(t)
	nc := s.Connect(nats.Name("node-n1"))
	routertest.Start(t, nc, router.Config{Name: "external", Type: router.Local, Address: "jms", Node: "n1"})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	t.Logf("node ready %v after the start", time.Since(begin).Round(time.Millisecond))
	const groups, perGroup = 4, 25
	var stdout bytes.Buffer
	prog := exec.CommandContext(ctx, bin, s.URL(), "n1", strconv.Itoa(groups*perGroup))
	prog.Stdout, prog.Stderr = &stdout, &stdout
	if err := prog.Start(); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	routertest.PublishGroups(ctx, t, js, "jms.orders", "g", groups, perGroup)
	err = prog.Wait()
	if got, want := strings.TrimSpace(stdout.String()), "ok "+strconv.Itoa(groups*perGroup); err != nil || got != want {
		t.Fatalf("program: %v, output:\n%s\nwant %q", err, got, want)
	}
	t.Logf("program done %v after the start", time.Since(begin).Round(time.Millisecond))
}
