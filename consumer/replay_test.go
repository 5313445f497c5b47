package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/wire"
)

// events collects the events published on the server.
type events struct {
	mu  sync.Mutex
	got []proposals.Event
}

func watchEvents(t *testing.T, nc *nats.Conn) *events {
	t.Helper()
	ev := &events{}
	sub, err := nc.Subscribe(proposals.SubjectEventsPrefix+">", func(m *nats.Msg) {
		var e proposals.Event
		if json.Unmarshal(m.Data, &e) == nil {
			ev.mu.Lock()
			ev.got = append(ev.got, e)
			ev.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return ev
}

func (ev *events) of(kind string) []proposals.Event {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var out []proposals.Event
	for _, e := range ev.got {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// parkBad queues groups "bad" and "a" (seqs 1..2n interleaved) and runs
// Consume until "bad" is parked at its second message, which fails while
// fault is set. It returns bad's seqs and the handler's record.
func parkBad(t *testing.T, q *queue, n int, fault *atomic.Bool, h func(*consumer.Message) error) ([]uint64, *record, *running) {
	t.Helper()
	var bad []uint64
	for i := range n {
		q.put("bad", uint64(2*i+1), 3)
		q.put("a", uint64(2*i+2), 3)
		bad = append(bad, uint64(2*i+1))
	}
	rec := newRecord()
	r := start(t, q, func(ctx context.Context, m *consumer.Message) error {
		if m.Group == "bad" && m.IngressSeq == bad[1] && fault.Load() {
			return errors.New("cannot apply")
		}
		if h != nil {
			if err := h(m); err != nil {
				return err
			}
		}
		rec.end(m, true)
		return nil
	}, consumer.WithConcurrency(4), consumer.WithMaxAttempts(2), consumer.WithBackoff(10*time.Millisecond, 20*time.Millisecond))
	waitFor(t, "bad parked with its later messages", func() bool {
		pg, err := consumer.GetParked(context.Background(), q.js, "bad")
		return err == nil && pg.Messages == uint64(n-1) && q.left() == 0
	})
	return bad, rec, r
}

// TestReplayRetryInOrderExactlyOnce: a group parked at its second message;
// a message arriving during the replay waits; after retry with the fault
// removed every message of the group is handled once, in order, the
// record and the parked messages are gone, and park and release events
// were published.
func TestReplayRetryInOrderExactlyOnce(t *testing.T) {
	for _, pinned := range []bool{true, false} {
		t.Run(map[bool]string{true: "pinned", false: "plain"}[pinned], func(t *testing.T) {
			q := newQueue(t, pinned, 30*time.Second)
			ev := watchEvents(t, q.nc)
			var fault atomic.Bool
			fault.Store(true)
			gate := make(chan struct{})
			var once sync.Once
			bad, rec, _ := parkBad(t, q, 6, &fault, func(m *consumer.Message) error {
				if m.Replayed && m.IngressSeq == 5 {
					once.Do(func() { <-gate }) // hold the replay while a new message arrives
				}
				return nil
			})
			if got := rec.of("bad"); !slices.Equal(got, bad[:1]) {
				t.Fatalf("before the retry bad got %v, want %v", got, bad[:1])
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			fault.Store(false)
			pg, err := consumer.Replay(ctx, q.js, "bad", consumer.ReplayRetry, "")
			if err != nil {
				t.Fatal(err)
			}
			if pg.Head != bad[1] || pg.Record.IngressSeq != bad[1] || pg.Record.Attempts != 2 || pg.Messages != 5 {
				t.Errorf("Replay returned %+v, want head %d parked after 2 attempts, 5 messages", pg, bad[1])
			}
			waitFor(t, "replay reached seq 5", func() bool { return slices.Contains(rec.of("bad"), 3) })
			q.put("bad", 100, 3) // arrives while the replay runs: waits for it
			bad = append(bad, 100)
			close(gate)
			waitFor(t, "all of bad handled", func() bool { return len(rec.of("bad")) >= len(bad) })
			waitFor(t, "record released", func() bool {
				_, err := consumer.GetParked(ctx, q.js, "bad")
				return errors.Is(err, consumer.ErrNotParked)
			})
			if got := rec.of("bad"); !slices.Equal(got, bad) {
				t.Errorf("bad handled %v, want %v once each in order", got, bad)
			}
			if n := parkedCount(t, q); n != 0 {
				t.Errorf("%d messages left in the parked stream", n)
			}
			waitFor(t, "park and release events", func() bool { return len(ev.of("park")) == 1 && len(ev.of("release")) == 1 })
			if e := ev.of("release")[0]; e.Count != 5 || e.Group != "bad" {
				t.Errorf("release event %+v, want 5 replayed of bad", e)
			}
			if e := ev.of("park")[0]; e.FromSeq != bad[1] || e.Reason != "cannot apply" {
				t.Errorf("park event %+v, want from %d", e, bad[1])
			}
		})
	}
}

// TestReplaySkipDropsHead: skip drops the failing head with a skip event
// and replays the rest in order.
func TestReplaySkipDropsHead(t *testing.T) {
	q := newQueue(t, true, 30*time.Second)
	ev := watchEvents(t, q.nc)
	var fault atomic.Bool
	fault.Store(true) // never fixed: skip it
	bad, rec, _ := parkBad(t, q, 5, &fault, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := consumer.Replay(ctx, q.js, "bad", consumer.ReplaySkip, ""); err != nil {
		t.Fatal(err)
	}
	want := append([]uint64{bad[0]}, bad[2:]...)
	waitFor(t, "the rest handled", func() bool { return len(rec.of("bad")) >= len(want) })
	if got := rec.of("bad"); !slices.Equal(got, want) {
		t.Errorf("bad handled %v, want %v", got, want)
	}
	waitFor(t, "skip event", func() bool { return len(ev.of("skip")) == 1 })
	if e := ev.of("skip")[0]; e.FromSeq != bad[1] {
		t.Errorf("skip event %+v, want ingress seq %d", e, bad[1])
	}
	waitFor(t, "record released", func() bool {
		_, err := consumer.GetParked(ctx, q.js, "bad")
		return errors.Is(err, consumer.ErrNotParked) && parkedCount(t, q) == 0
	})
	if _, err := consumer.Replay(ctx, q.js, "bad", consumer.ReplayRetry, ""); !errors.Is(err, consumer.ErrNotParked) {
		t.Errorf("Replay of a released group: %v, want ErrNotParked", err)
	}
}

// TestReplayRetryParksAgain: a retry whose head still fails parks the
// group again at it, its messages kept; release then drops it and goes on.
func TestReplayRetryParksAgainThenRelease(t *testing.T) {
	q := newQueue(t, false, 30*time.Second)
	ev := watchEvents(t, q.nc)
	var fault atomic.Bool
	fault.Store(true)
	bad, rec, _ := parkBad(t, q, 4, &fault, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := consumer.Replay(ctx, q.js, "bad", consumer.ReplayRetry, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "parked again", func() bool { return len(ev.of("park")) == 2 })
	pg, err := consumer.GetParked(ctx, q.js, "bad")
	if err != nil || pg.Record.State != "" || pg.Messages != 3 || pg.Head != bad[1] {
		t.Fatalf("after a failed retry: %+v, %v; want parked at %d with 3 messages", pg, err, bad[1])
	}
	if _, err := consumer.Replay(ctx, q.js, "bad", consumer.ReplayRelease, ""); err != nil {
		t.Fatal(err)
	}
	want := append([]uint64{bad[0]}, bad[2:]...)
	waitFor(t, "released", func() bool { return len(rec.of("bad")) >= len(want) && len(ev.of("release")) == 1 })
	if got := rec.of("bad"); !slices.Equal(got, want) {
		t.Errorf("bad handled %v, want %v", got, want)
	}
	if s := ev.of("skip"); len(s) != 1 || s[0].FromSeq != bad[1] {
		t.Errorf("skip events %+v, want one for %d", s, bad[1])
	}
}

// TestReplayResumedAfterCrash: a process died during a replay, after
// handling the first parked message and deleting it, while its handler
// ran the second (its claim runs out). A new Consume takes the replay
// over: the second is handled again, flagged Redelivered, and the rest
// once each, in order; the first is not handled again.
func TestReplayResumedAfterCrash(t *testing.T) {
	q := newQueue(t, true, 30*time.Second)
	var fault atomic.Bool
	fault.Store(true)
	bad, rec, r := parkBad(t, q, 5, &fault, nil)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// What the dead process left: bad[1] handled and deleted, its claim.
	s, err := q.js.Stream(ctx, consumer.ParkedStream)
	if err != nil {
		t.Fatal(err)
	}
	filter, _ := consumer.ParkedFilter("bad")
	raw, err := s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(filter))
	if err != nil || raw.Header.Get(wire.HeaderIngressSeq) != strconv.FormatUint(bad[1], 10) {
		t.Fatalf("first parked: %v %v", raw, err)
	}
	if err := s.DeleteMsg(ctx, raw.Sequence); err != nil {
		t.Fatal(err)
	}
	kv, err := q.js.KeyValue(ctx, consumer.ParkedBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "r.bad")
	if err != nil {
		t.Fatal(err)
	}
	var pr consumer.ParkRecord
	if err := json.Unmarshal(e.Value(), &pr); err != nil {
		t.Fatal(err)
	}
	pr.State, pr.Mode, pr.Replayer, pr.ClaimedAt, pr.Claims = consumer.StateReplay, consumer.ReplayRetry, "dead", time.Now().Add(-time.Hour), 1
	val, _ := json.Marshal(pr)
	if _, err := kv.Update(ctx, "r.bad", val, e.Revision()); err != nil {
		t.Fatal(err)
	}
	// Claimed by a live process: Replay refuses.
	pr.ClaimedAt = time.Now()
	val, _ = json.Marshal(pr)
	e, _ = kv.Get(ctx, "r.bad")
	rev, err := kv.Update(ctx, "r.bad", val, e.Revision())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := consumer.Replay(ctx, q.js, "bad", consumer.ReplayRetry, ""); !errors.Is(err, consumer.ErrReplaying) {
		t.Fatalf("Replay during a live claim: %v, want ErrReplaying", err)
	}
	pr.ClaimedAt = time.Now().Add(-time.Hour) // then it died
	val, _ = json.Marshal(pr)
	if _, err := kv.Update(ctx, "r.bad", val, rev); err != nil {
		t.Fatal(err)
	}

	fault.Store(false)
	rec2 := newRecord()
	start(t, q, func(ctx context.Context, m *consumer.Message) error {
		rec2.end(m, true)
		return nil
	}, consumer.WithConcurrency(4))
	want := bad[2:]
	waitFor(t, "replay resumed", func() bool { return len(rec2.of("bad")) >= len(want) })
	waitFor(t, "record released", func() bool {
		_, err := consumer.GetParked(ctx, q.js, "bad")
		return errors.Is(err, consumer.ErrNotParked)
	})
	if got := rec2.of("bad"); !slices.Equal(got, want) {
		t.Errorf("resumed replay handled %v, want %v", got, want)
	}
	rec2.mu.Lock()
	flagged := rec2.redeliv[bad[2]]
	rec2.mu.Unlock()
	if !flagged {
		t.Errorf("the first message of a resumed replay (%d) not flagged Redelivered", bad[2])
	}
	if got := rec.of("bad"); !slices.Equal(got, bad[:1]) {
		t.Errorf("first process handled %v", got)
	}
}

// TestReplayStoppedMidwayIsResumed: Consume stops while a replayed
// message's handler runs (past the drain bound): it gives the claim up,
// the message stays parked, and the next Consume resumes the replay at
// once from that message (flagged Redelivered), in order, each once.
func TestReplayStoppedMidwayIsResumed(t *testing.T) {
	q := newQueue(t, false, 30*time.Second)
	var fault atomic.Bool
	fault.Store(true)
	bad, rec, r := parkBad(t, q, 5, &fault, nil)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	var once sync.Once
	a := start(t, q, func(ctx context.Context, m *consumer.Message) error {
		if m.Group == "bad" && m.IngressSeq == bad[2] {
			once.Do(func() { close(entered) })
			<-ctx.Done() // a handler that does not return before the drain bound
			return ctx.Err()
		}
		rec.end(m, true)
		return nil
	}, consumer.WithDrainTimeout(200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := consumer.Replay(ctx, q.js, "bad", consumer.ReplayRetry, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the replay did not reach its second message")
	}
	if err := a.stop(t); !errors.Is(err, consumer.ErrDrainTimeout) {
		t.Fatalf("Consume: %v, want ErrDrainTimeout", err)
	}
	pg, err := consumer.GetParked(ctx, q.js, "bad")
	if err != nil || pg.Record.State != consumer.StateReplay || pg.Record.Replayer != "" || pg.Head != bad[2] {
		t.Fatalf("after the stop: %+v, %v; want a replay given up at %d", pg, err, bad[2])
	}
	rec2 := newRecord()
	start(t, q, func(_ context.Context, m *consumer.Message) error {
		rec2.end(m, true)
		return nil
	})
	waitFor(t, "replay resumed and released", func() bool {
		_, err := consumer.GetParked(ctx, q.js, "bad")
		return errors.Is(err, consumer.ErrNotParked) && len(rec2.of("bad")) >= len(bad)-2
	})
	if got := rec.of("bad"); !slices.Equal(got, bad[:2]) {
		t.Errorf("first process handled %v, want %v", got, bad[:2])
	}
	if got := rec2.of("bad"); !slices.Equal(got, bad[2:]) {
		t.Errorf("second process handled %v, want %v", got, bad[2:])
	}
	rec2.mu.Lock()
	defer rec2.mu.Unlock()
	if !rec2.redeliv[bad[2]] {
		t.Errorf("the message whose handler was cut (%d) not flagged Redelivered", bad[2])
	}
}

// TestParkedAsReplayEndsStaysParked: a message parked just after its
// group's replay ended (the record deleted between the publish to the
// parked stream and what follows, as when the parking process still saw
// the group parked) parks the group again at that message, with a park
// event, and the group's later messages follow it there: none of them is
// handled before it.
func TestParkedAsReplayEndsStaysParked(t *testing.T) {
	q := newQueue(t, true, 30*time.Second)
	ev := watchEvents(t, q.nc)
	kv, err := wire.EnsureParking(context.Background(), q.js, 1)
	if err != nil {
		t.Fatal(err)
	}
	var deleted atomic.Bool
	consumer.SetParkedHook(func(group string, seq uint64) {
		if group == "bad" && seq == 7 && deleted.CompareAndSwap(false, true) {
			if err := kv.Delete(context.Background(), "r.bad"); err != nil {
				t.Errorf("delete the record: %v", err)
			}
		}
	})
	t.Cleanup(func() { consumer.SetParkedHook(nil) })
	var fault atomic.Bool
	fault.Store(true)
	bad, rec, _ := parkBad(t, q, 6, &fault, nil)
	if !deleted.Load() {
		t.Fatal("the hook never ran")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pg, err := consumer.GetParked(ctx, q.js, "bad")
	if err != nil {
		t.Fatalf("bad not parked again: %v", err)
	}
	if pg.Record.IngressSeq != 7 || !strings.HasPrefix(pg.Record.Reason, "parked as a replay ended") || pg.Head != bad[1] {
		t.Errorf("parked again as %+v (head %d), want at 7, head %d", pg.Record, pg.Head, bad[1])
	}
	if got := rec.of("bad"); !slices.Equal(got, bad[:1]) {
		t.Errorf("bad handled %v, want only %v: its later messages passed a parked one", got, bad[:1])
	}
	waitFor(t, "two park events", func() bool { return len(ev.of("park")) == 2 })
}
