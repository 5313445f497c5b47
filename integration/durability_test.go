package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// TestIngressLostWritesAfterRestart: a server restarted from a store that
// lost its last acknowledged writes (what an OS crash does to a server
// that does not fsync every write). The ingress stream's last block file
// is truncated while the server is stopped, so messages that had a PubAck
// are gone; the server keeps their sequences (its index remembers the last
// one). The node, which had not read them, notices the gap when it reads
// over it: it counts it (Stats, metrics), logs it at error, announces a
// "gap" event, and goes on routing the messages published after it.
func TestIngressLostWritesAfterRestart(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	cfg := testConfig("n0", router.Local)
	logs := captureLogs(&cfg, slog.LevelError)
	n0 := startNode(t, s.URL(), cfg)
	var before collector
	stopConsumer := startConsumer(t, s.URL(), "n0", &before)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0"}, []string{"n0"})
	js, _ := jetstream.New(nc)
	want := map[string][]string{}
	sendBatch(t, js, "a", "before", 10, want) // ingress 1-10
	checkGrouping(t, before.waitCount(t, 10, 20*time.Second), want)
	n0.stop() // its checkpoint says: next is 11
	stopConsumer()

	// The block the next writes go to, and its size before them.
	dir := filepath.Join(s.Server().StoreDir(), "$G", "streams", router.IngressStream, "msgs")
	s.Stop()
	blk, size := lastBlock(t, dir)
	s.Restart()
	lost := bodies("a/lost", 5)
	publish(t, js, "jms.orders", "a", lost...) // ingress 11-15, acknowledged
	s.Stop()
	// Lose them: the block is cut back to what it held before (a block
	// created for them loses everything).
	last, _ := lastBlock(t, dir)
	if last != blk {
		size = 0
	}
	if err := os.Truncate(last, size); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	st := streamState(t, js, router.IngressStream)
	if st.Msgs != 10 || st.LastSeq != 15 {
		t.Fatalf("after the truncation the ingress holds %d messages up to sequence %d, want 10 up to 15 (the loss this test needs)", st.Msgs, st.LastSeq)
	}

	gaps := watchEvents(t, nc, proposals.EventIngressGap)
	reg := prometheus.NewRegistry()
	n0.cfg.Metrics = reg
	n0.restart()
	var after collector
	startConsumer(t, s.URL(), "n0", &after)
	waitEligible(t, nc, []string{"n0"}, []string{"n0"})
	later := map[string][]string{}
	sendBatch(t, js, "a", "after", 5, later) // ingress 16-20
	sendBatch(t, js, "b", "after", 5, later) // ingress 21-25: a new group is decided and routed too
	checkGrouping(t, after.waitCount(t, 10, 20*time.Second), later)

	if st := n0.r.Stats(); st.IngressGaps != 1 || st.IngressMissing != 5 {
		t.Errorf("Stats: %d gaps, %d messages missing; want 1 gap of 5", st.IngressGaps, st.IngressMissing)
	}
	if got := gatherCounter(t, reg, "grouprouter_ingress_missing_messages_total"); got != 5 {
		t.Errorf("grouprouter_ingress_missing_messages_total = %v, want 5", got)
	}
	if got := gatherCounter(t, reg, "grouprouter_ingress_gaps_total"); got != 1 {
		t.Errorf("grouprouter_ingress_gaps_total = %v, want 1", got)
	}
	var ev proposals.Event
	natstest.Eventually(t, 10*time.Second, func() error {
		gaps.mu.Lock()
		defer gaps.mu.Unlock()
		if len(gaps.evs) == 0 {
			return fmt.Errorf("no gap event")
		}
		ev = gaps.evs[0]
		return nil
	})
	if ev.Node != "n0" || ev.FromSeq != 11 || ev.Count != 5 {
		t.Errorf("gap event %+v, want node n0, from_seq 11, count 5", ev)
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR msg=\"ingress messages gone") || !strings.Contains(l, "from_seq=11") || !strings.Contains(l, "missing=5") {
		t.Errorf("no error logged about the gap; the node's log:\n%s", l)
	}
}

// TestIngressRewoundUnderARunningNode: a server restarts from a store that
// lost its writes and its index (what a power loss can leave): the ingress
// starts again below what a running node has read, and would store new
// messages under sequences the node has passed. The node notices when it
// re-creates its ingress consumer: it counts and logs the sequences it will
// not read.
func TestIngressRewoundUnderARunningNode(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	cfg := testConfig("n0", router.Local)
	logs := captureLogs(&cfg, slog.LevelError)
	n0 := startNode(t, s.URL(), cfg)
	var c collector
	startConsumer(t, s.URL(), "n0", &c)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0"}, []string{"n0"})
	js, _ := jetstream.New(nc)
	want := map[string][]string{}
	sendBatch(t, js, "a", "before", 10, want) // ingress 1-10, read by n0
	checkGrouping(t, c.waitCount(t, 10, 20*time.Second), want)

	forgetStream(t, s, router.IngressStream)
	s.Restart()
	if st := streamState(t, js, router.IngressStream); st.LastSeq != 0 {
		t.Fatalf("after the loss the ingress's last sequence is %d, want 0 (the loss this test needs)", st.LastSeq)
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		if st := n0.r.Stats(); st.IngressMissing != 10 || st.IngressGaps != 1 {
			return fmt.Errorf("Stats: %d gaps, %d messages missing; want 1 of 10", st.IngressGaps, st.IngressMissing)
		}
		return nil
	})
	if l := logs.String(); !strings.Contains(l, "last sequence is behind what this node has read") || !strings.Contains(l, "stream_last=0 next=11") {
		t.Errorf("no error logged about the ingress going back; the node's log:\n%s", l)
	}
}

// captureLogs points cfg's logger at a buffer the test reads, from
// level up; with GROUPROUTER_TEST_LOG set, at stderr too, from debug up.
func captureLogs(cfg *router.Config, level slog.Level) *lockedBuffer {
	logs := &lockedBuffer{}
	var w io.Writer = logs
	if os.Getenv("GROUPROUTER_TEST_LOG") != "" {
		w, level = io.MultiWriter(logs, os.Stderr), slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
	return logs
}

// forgetStream stops s, empties every message block of its stream and
// removes its index: nothing says its messages or sequences existed, what
// a power loss can leave of writes that were never synced.
func forgetStream(t testing.TB, s *natstest.Server, stream string) {
	t.Helper()
	dir := filepath.Join(s.Server().StoreDir(), "$G", "streams", stream, "msgs")
	s.Stop()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		switch name := filepath.Join(dir, e.Name()); {
		case strings.HasSuffix(e.Name(), ".blk"):
			if err := os.Truncate(name, 0); err != nil {
				t.Fatal(err)
			}
		case e.Name() == "index.db":
			if err := os.Remove(name); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestQueueLostWritesUnderARunningNode: the queue stream's servers lose
// messages a node stored there (and their sequences) while nothing had
// consumed them. The node notices at its next check: it counts the rewind
// and the lost sequences, logs at error and announces a "queue-loss"
// event; what it routes afterwards is delivered.
func TestQueueLostWritesUnderARunningNode(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	cfg := testConfig("n0", router.Local)
	logs := captureLogs(&cfg, slog.LevelError)
	n0 := startNode(t, s.URL(), cfg)
	nc := s.Connect()
	js, _ := jetstream.New(nc)
	// No consumer yet: the messages wait on the queue (n0 is the only node,
	// so it takes its groups whether or not a consumer is there).
	sendBatch(t, js, "a", "lost", 6, map[string][]string{})
	natstest.Eventually(t, 20*time.Second, func() error {
		if st := n0.r.Stats(); st.Routed != 6 {
			return fmt.Errorf("routed %d of 6", st.Routed)
		}
		return nil
	})
	losses := watchEvents(t, nc, proposals.EventQueueLoss)
	forgetStream(t, s, router.QueueStream)
	s.Restart()
	if st := streamState(t, js, router.QueueStream); st.LastSeq != 0 {
		t.Fatalf("after the loss the queue's last sequence is %d, want 0 (the loss this test needs)", st.LastSeq)
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		if st := n0.r.Stats(); st.QueueRewinds != 1 || st.QueueLostSeqs != 6 {
			return fmt.Errorf("Stats: %d queue rewinds, %d sequences lost; want 1 of 6", st.QueueRewinds, st.QueueLostSeqs)
		}
		return nil
	})
	ev := losses.waitGroup(t, "", 10*time.Second)
	if ev.Node != "n0" || ev.FromSeq != 1 || ev.Count != 6 {
		t.Errorf("queue-loss event %+v, want node n0, from_seq 1, count 6", ev)
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR msg=\"the queue stream lost messages") || !strings.Contains(l, "from_seq=1 to_seq=6") {
		t.Errorf("no error logged about the queue's loss; the node's log:\n%s", l)
	}
	// The node goes on: later messages are delivered, and the loss is
	// reported once.
	var c collector
	startConsumer(t, s.URL(), "n0", &c)
	later := map[string][]string{}
	sendBatch(t, js, "a", "after", 5, later)
	checkGrouping(t, c.waitCount(t, 5, 20*time.Second), later)
	time.Sleep(6 * time.Second) // past the next check (every 5 s): the sequences stored again are not a loss
	if st := n0.r.Stats(); st.QueueRewinds != 1 {
		t.Errorf("Stats: %d queue rewinds after the node went on, want 1", st.QueueRewinds)
	}
}

// TestBindingsRewoundUnderARunningNode: the bindings bucket's servers
// lose its records (and their revisions) under a running node. The
// node's cache notices at its next check, logs at error, counts it,
// announces a "bindings-rewind" event and reads the bucket again: the
// groups whose records were lost are decided again, and their messages
// delivered in order. Group a's record is the bucket's second before the
// loss, and a is bound again first after it: the handler moves the
// bucket's revisions past those read before writing again, or a's new
// epoch would be below the one its consumer saw, and the consumer would
// drop its messages as stale copies (it did, 1 run in 20, when a
// happened to be bound second).
func TestBindingsRewoundUnderARunningNode(t *testing.T) {
	t.Parallel() // see doc.go
	s := natstest.RunServer(t)
	cfg := testConfig("n0", router.Local)
	logs := captureLogs(&cfg, slog.LevelDebug)
	t.Cleanup(func() {
		if t.Failed() { // failed once in CI (15 of 20 delivered), never since: keep what the node said
			t.Logf("the node's log, last 16 KiB:\n%s", tail(logs.String(), 16<<10))
		}
	})
	n0 := startNode(t, s.URL(), cfg)
	var c collector
	startConsumer(t, s.URL(), "n0", &c)
	nc := s.Connect()
	waitEligible(t, nc, []string{"n0"}, []string{"n0"})
	js, _ := jetstream.New(nc)
	want := map[string][]string{}
	sendBatch(t, js, "b", "before", 5, want)
	c.waitCount(t, 5, 20*time.Second)
	sendBatch(t, js, "a", "before", 5, want)
	checkGrouping(t, c.waitCount(t, 10, 20*time.Second), want)
	old, ok := n0.r.Cache().Lookup("a")
	if !ok {
		t.Fatal("group a not in the cache before the loss")
	}
	rewinds := watchEvents(t, nc, proposals.EventBucketRewind)
	forgetStream(t, s, "KV_"+kvbinding.DefaultBucket)
	s.Restart()
	natstest.Eventually(t, 30*time.Second, func() error {
		if n := n0.r.Stats().BindingsRewinds; n != 1 {
			return fmt.Errorf("%d bindings rewinds, want 1", n)
		}
		if _, ok := n0.r.Cache().Lookup("a"); ok {
			return fmt.Errorf("group a still cached after the bucket lost it")
		}
		return nil
	})
	ev := rewinds.waitGroup(t, "", 10*time.Second)
	if ev.Node != "n0" || ev.FromSeq != 1 {
		t.Errorf("bindings-rewind event %+v, want node n0, from_seq 1", ev)
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR msg=\"the bindings bucket went back") {
		t.Errorf("no error logged about the bucket going back; the node's log:\n%s", l)
	}
	later := map[string][]string{}
	sendBatch(t, js, "a", "after", 5, later)
	sendBatch(t, js, "c", "after", 5, later)
	natstest.Eventually(t, 20*time.Second, func() error {
		if _, ok := n0.r.Cache().Lookup("a"); !ok {
			return errors.New("group a not bound again")
		}
		return nil
	})
	if now, _ := n0.r.Cache().Lookup("a"); now.OwnerEpoch() <= old.OwnerEpoch() {
		t.Errorf("group a bound again at epoch %d (revision %d), not above its epoch before the loss, %d", now.OwnerEpoch(), now.Revision, old.OwnerEpoch())
	}
	checkGrouping(t, c.waitCount(t, 20, 30*time.Second)[10:], later)
}

// lastBlock returns the path and size of the highest-numbered message
// block in a file store's msgs directory.
func lastBlock(t testing.TB, dir string) (string, int64) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	best, idx := "", -1
	for _, e := range ents {
		var n int
		if _, err := fmt.Sscanf(e.Name(), "%d.blk", &n); err == nil && strings.HasSuffix(e.Name(), ".blk") && n > idx {
			best, idx = filepath.Join(dir, e.Name()), n
		}
	}
	if best == "" {
		t.Fatalf("no message block in %s", dir)
	}
	fi, err := os.Stat(best)
	if err != nil {
		t.Fatal(err)
	}
	return best, fi.Size()
}

// gatherCounter returns the value of the unlabelled counter name in reg.
func gatherCounter(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// lockedBuffer is a bytes.Buffer safe for concurrent writers (a logger).
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
