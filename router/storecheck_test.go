package router

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestQueueLost(t *testing.T) {
	for _, tc := range []struct {
		name     string
		last     uint64
		found    bool
		atID     string
		noLeader bool
		lo, hi   uint64
		wantLost bool
	}{
		{"still there", 10, true, "GROUPING_INGRESS:7", false, 0, 0, false},
		{"consumed (a work queue deleted it)", 10, false, "", false, 0, 0, false},
		{"the stream went on", 30, false, "", false, 0, 0, false},
		{"the stream ends below it", 6, false, "", false, 7, 10, true},
		{"the stream is empty again", 0, false, "", false, 1, 10, true},
		{"another message at its sequence", 12, true, "GROUPING_INGRESS:99", false, 10, 10, true},
		{"ends below it, answered without a leader", 6, false, "", true, 0, 0, false},
		{"another message, answered without a leader", 12, true, "GROUPING_INGRESS:99", true, 0, 0, false},
	} {
		lo, hi, lost := queueLost(10, "GROUPING_INGRESS:7", tc.last, tc.found, tc.atID, !tc.noLeader)
		if lost != tc.wantLost || lo != tc.lo || hi != tc.hi {
			t.Errorf("%s: queueLost = %d-%d %v, want %d-%d %v", tc.name, lo, hi, lost, tc.lo, tc.hi, tc.wantLost)
		}
	}
}

// keptQueue returns a router of node n0 whose queue stream keeps what was
// acknowledged (limits retention, in memory), with n0's queue consumer.
func keptQueue(t *testing.T) (*Router, jetstream.JetStream, jetstream.Consumer, context.Context) {
	t.Helper()
	r, js := testRouter(t, "n0")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	if err := js.DeleteStream(ctx, QueueStream); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: QueueStream, Subjects: []string{QueueSubjectPrefix + ">"},
		Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	cons, err := ensureQueueConsumer(ctx, js, "n0", QueuePlain, time.Second, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return r, js, cons, ctx
}

// A message of the node's queue at or below its consumer's ack floor was
// acknowledged: the sweep removes it, and nothing else (not the node's
// unacknowledged messages, not another node's). The queue stream here
// keeps what was acknowledged (limits retention), standing in for a work
// queue that kept messages across a server restart (TestBatchesAcrossFaults
// restarts the server for real).
func TestSweepQueueOrphans(t *testing.T) {
	r, js, cons, ctx := keptQueue(t)
	for i, node := range []string{"n0", "n1", "n0", "n0", "n1"} {
		if _, err := js.Publish(ctx, QueueSubject(node, "jms.orders"), []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	r.qcheck.check(ctx) // nothing acknowledged yet
	if n := r.qcheck.tail.orphans.Load(); n != 0 {
		t.Fatalf("removed %d messages before any was acknowledged", n)
	}
	// n0's consumer acknowledges its first two messages (seqs 1 and 3),
	// and has the third (seq 4) delivered, not acknowledged.
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for m := range batch.Messages() {
		meta, _ := m.Metadata()
		got = append(got, meta.Sequence.Stream)
		if len(got) <= 2 {
			if err := m.DoubleAck(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !slices.Equal(got, []uint64{1, 3, 4}) {
		t.Fatalf("n0's consumer got sequences %v, want 1, 3, 4", got)
	}
	r.qcheck.check(ctx)
	s, err := js.Stream(ctx, QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	var left []uint64
	for seq := range uint64(5) {
		if _, err := s.GetMsg(ctx, seq+1); err == nil {
			left = append(left, seq+1)
		} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatal(err)
		}
	}
	if !slices.Equal(left, []uint64{2, 4, 5}) || r.qcheck.tail.orphans.Load() != 2 {
		t.Errorf("after the sweep the queue holds %v and %d were counted removed; want 2, 4, 5 and 2 (n0's acknowledged 1 and 3 removed)",
			left, r.qcheck.tail.orphans.Load())
	}
}

// A node that found the queue rewound removes nothing: a message below
// the ack floor may be one stored at a reused sequence, never delivered.
func TestSweepQueueOrphansStopsAfterARewind(t *testing.T) {
	r, js, cons, ctx := keptQueue(t)
	if _, err := js.Publish(ctx, QueueSubject("n0", "jms.orders"), []byte("a")); err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	r.qcheck.tail.rewinds.Add(1)
	r.qcheck.check(ctx)
	s, err := js.Stream(ctx, QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetMsg(ctx, 1); err != nil || r.qcheck.tail.orphans.Load() != 0 {
		t.Errorf("after a rewind the sweep removed the message below the ack floor (get: %v, removed %d)", err, r.qcheck.tail.orphans.Load())
	}
}

// Publishes acknowledged while the store check reads the queue are no
// loss: the check takes what this node stored before it reads the stream,
// so a PubAck that comes in between lies past the end it compares with.
// (Read the other way round, a demo with no fault reported a queue-loss.)
func TestQueueCheckRacingPublishesIsNoLoss(t *testing.T) {
	r, js, _, ctx := keptQueue(t)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			id := "race:" + strconv.Itoa(i)
			ack, err := js.Publish(ctx, QueueSubject("n0", "jms.orders"), []byte("x"), jetstream.WithMsgID(id))
			if err != nil {
				done <- err
				return
			}
			r.qcheck.tail.stored(ack.Sequence, id)
		}
	}()
	for range 300 {
		r.qcheck.check(ctx)
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := r.qcheck.tail.rewinds.Load(); n != 0 {
		t.Errorf("the check reported %d losses (%d sequences) while nothing was lost", n, r.qcheck.tail.lost.Load())
	}
}
