package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/router"
)

// publishWith runs publish with args and stdin.
func publishWith(t *testing.T, stdin io.Reader, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	env := environment{goos: "linux", getenv: envMap{}.get, hostname: func() string { return "h" }, stdin: stdin}
	var out, errOut bytes.Buffer
	code = runEnv(ctx, append([]string{"publish"}, args...), env, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestPublishMany: --count N publishes N numbered messages and --stdin one
// per line, in order, each acknowledged; a failure says how many were
// stored.
func TestPublishMany(t *testing.T) {
	srv := natstest.RunServer(t)
	js, err := jetstream.New(srv.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: router.IngressStream, Subjects: []string{"jms.>"}})
	if err != nil {
		t.Fatal(err)
	}
	// stored checks that seqs from..from+len(want)-1 hold want (body,
	// group), in order.
	stored := func(from uint64, want [][2]string) {
		t.Helper()
		for i, w := range want {
			m, err := stream.GetMsg(ctx, from+uint64(i))
			if err != nil {
				t.Fatal(err)
			}
			if string(m.Data) != w[0] || m.Header.Get(router.DefaultGroupHeader) != w[1] {
				t.Fatalf("seq %d: body %q group %q, want %q %q", from+uint64(i), m.Data, m.Header.Get(router.DefaultGroupHeader), w[0], w[1])
			}
		}
	}

	// More than the window on the way: some publishes wait for PubAcks.
	n := publishWindow + 44
	code, stdout, stderr := publishWith(t, nil, "--nats", srv.URL(), "--count", strconv.Itoa(n), "--group", "order-{{i}}", "jms.orders", "item {{i}}")
	if want := fmt.Sprintf("stored: %d messages, stream %s seq 1 to %d, groups order-1 to order-%d\n", n, router.IngressStream, n, n); code != exitOK || stdout != want {
		t.Fatalf("--count: exit %d, stdout %q, stderr %q; want %q", code, stdout, stderr, want)
	}
	var want [][2]string
	for i := 1; i <= n; i++ {
		want = append(want, [2]string{"item " + strconv.Itoa(i), "order-" + strconv.Itoa(i)})
	}
	stored(1, want)

	// Lines: CRLF, an empty one, a last one without a newline.
	code, stdout, stderr = publishWith(t, strings.NewReader("first\r\n\nthird {{i}}\nlast"), "--nats", srv.URL(), "--stdin", "--group", "g", "jms.orders")
	if want := fmt.Sprintf("stored: 4 messages, stream %s seq %d to %d, group g\n", router.IngressStream, n+1, n+4); code != exitOK || stdout != want {
		t.Fatalf("--stdin: exit %d, stdout %q, stderr %q; want %q", code, stdout, stderr, want)
	}
	stored(uint64(n+1), [][2]string{{"first", "g"}, {"", "g"}, {"third {{i}}", "g"}, {"last", "g"}})

	if code, stdout, _ := publishWith(t, strings.NewReader(""), "--nats", srv.URL(), "--stdin", "jms.orders"); code != exitOK || stdout != "stored: 0 messages (stdin had no line)\n" {
		t.Errorf("empty stdin: exit %d, %q", code, stdout)
	}
	// One message: as before; {{i}} is replaced only with --count or --stdin.
	code, stdout, _ = publishWith(t, nil, "--nats", srv.URL(), "jms.orders", "{{i}}")
	if want := fmt.Sprintf("stored: stream %s seq %d, group (ungrouped)\n", router.IngressStream, n+5); code != exitOK || stdout != want {
		t.Errorf("one message: exit %d, %q, want %q", code, stdout, want)
	}
	stored(uint64(n+5), [][2]string{{"{{i}}", ""}})
	code, stdout, _ = publishWith(t, nil, "--nats", srv.URL(), "--count", "1", "jms.orders", "x{{i}}")
	if want := fmt.Sprintf("stored: stream %s seq %d, group (ungrouped)\n", router.IngressStream, n+6); code != exitOK || stdout != want {
		t.Errorf("--count 1: exit %d, %q, want %q", code, stdout, want)
	}
	stored(uint64(n+6), [][2]string{{"x1", ""}})

	// No stream takes the subject: the first message fails.
	code, _, stderr = publishWith(t, nil, "--nats", srv.URL(), "--count", "3", "other.x", "y")
	if code != exitFailure || !strings.Contains(stderr, `message 1 not stored: no stream stores "other.x"`) || !strings.Contains(stderr, "(0 stored before it;") {
		t.Errorf("no stream: exit %d, stderr %q", code, stderr)
	}
	// A line longer than the server's max payload stops --stdin after
	// what came before it.
	long := "a\n" + strings.Repeat("x", 2<<20) + "\n"
	code, _, stderr = publishWith(t, strings.NewReader(long), "--nats", srv.URL(), "--stdin", "jms.orders")
	if code != exitFailure || !strings.Contains(stderr, "reading stdin: line 2 is longer than the server's max payload") || !strings.Contains(stderr, "(1 stored, seq ") {
		t.Errorf("long line: exit %d, stderr %q", code, stderr)
	}
}
