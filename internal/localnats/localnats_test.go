package localnats

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestStart: one server and a cluster of three come up with JetStream, a
// client of each server reaches the others after it, and a stream
// replicated on all three takes writes.
func TestStart(t *testing.T) {
	for _, n := range []int{1, 3} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		c, err := Start(ctx, t.TempDir(), "test", n)
		if err != nil {
			cancel()
			t.Fatalf("%d servers: %v", n, err)
		}
		if got := c.URLsFor(n - 1); len(got) != n || got[0] != c.URLs()[n-1] {
			t.Errorf("URLsFor(%d) = %v, want server %d's first, then the others", n-1, got, n-1)
		}
		nc, err := c.Connect(n-1, "test")
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		// A store the server fails to create (err_code 10049) was seen
		// once in CI while the integration tests loaded the disk, and
		// never again in 40 runs: it is tried again, at most twice, and
		// said; any other error, or a third failure, fails the test.
		for attempt := 1; ; attempt++ {
			_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}, Replicas: n})
			var apiErr *jetstream.APIError
			if err != nil && attempt < 3 && errors.As(err, &apiErr) && apiErr.ErrorCode == 10049 {
				t.Logf("%d servers: stream, attempt %d: %v; trying again", n, attempt, err)
				time.Sleep(200 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatalf("%d servers: stream: %v", n, err)
			}
			break
		}
		if ack, err := js.Publish(ctx, "t", []byte("x")); err != nil || ack.Sequence != 1 {
			t.Fatalf("%d servers: publish: %v %v", n, ack, err)
		}
		nc.Close()
		c.Close()
		cancel()
	}
	if _, err := Connect(nil, "none"); err == nil {
		t.Error("Connect with no URL succeeded")
	}
}

func TestParseSync(t *testing.T) {
	tests := []struct {
		in   string
		want Sync
		ok   bool
	}{
		{"always", Sync{Always: true}, true},
		{" Always ", Sync{Always: true}, true},
		{"1s", Sync{Interval: time.Second}, true},
		{"2m", Sync{Interval: 2 * time.Minute}, true},
		{"0s", Sync{}, false},
		{"-1s", Sync{}, false},
		{"never", Sync{}, false},
		{"", Sync{}, false},
	}
	for _, tt := range tests {
		got, err := ParseSync(tt.in)
		if (err == nil) != tt.ok || got != tt.want || (err != nil && !errors.Is(err, ErrSync)) {
			t.Errorf("ParseSync(%q) = %v, %v; want %v, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
		if tt.ok {
			if back, err := ParseSync(got.String()); err != nil || back != got {
				t.Errorf("ParseSync(%q.String() = %q) = %v, %v", tt.in, got.String(), back, err)
			}
		}
	}
}

// TestStartWithSync: the servers run with the fsync policy asked for.
func TestStartWithSync(t *testing.T) {
	for _, s := range []Sync{{Always: true}, {Interval: 3 * time.Second}} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		c, err := Start(ctx, t.TempDir(), "test", 1, WithSync(s))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		jsc := c.servers[0].JetStreamConfig()
		c.Close()
		if jsc == nil || jsc.SyncAlways != s.Always || (!s.Always && jsc.SyncInterval != s.Interval) {
			t.Errorf("WithSync(%v): JetStream config %+v", s, jsc)
		}
	}
}
