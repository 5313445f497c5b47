package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// TestIsGoneOnTheLibrarysErrors checks isGone against the errors the
// JetStream client really returns: a drain tells "the old consumer acked it
// meanwhile" from a failure by them, and Stream.DeleteMsg does not wrap the
// server's API error.
func TestIsGoneOnTheLibrarysErrors(t *testing.T) {
	s := natstest.RunServer(t)
	js, err := jetstream.New(s.Connect())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, "t.a", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, ack.Sequence); err != nil {
		t.Fatal(err)
	}
	err = st.DeleteMsg(ctx, ack.Sequence)
	if err == nil || !isGone(err) {
		t.Errorf("second delete: isGone(%v) = false", err)
	}
	if _, err = st.GetMsg(ctx, ack.Sequence); err == nil || !isGone(err) {
		t.Errorf("get of a deleted message: isGone(%v) = false", err)
	}
	if err := js.DeleteStream(ctx, "T"); err != nil {
		t.Fatal(err)
	}
	if err = st.DeleteMsg(ctx, ack.Sequence); err == nil || isGone(err) {
		t.Errorf("delete in a deleted stream: isGone(%v) = true, want a real failure", err)
	}
	// A replicated stream's answer to deleting a message gone already, as
	// Stream.DeleteMsg flattened it in a nemesis run (a catch-up retried
	// every second on it, and its group stalled).
	replicated := fmt.Errorf("%w: %w", jetstream.ErrMsgDeleteUnsuccessful,
		&jetstream.APIError{Code: 400, ErrorCode: 10043, Description: "sequence 5190 not found"})
	flat := fmt.Errorf("%w: %s", jetstream.ErrMsgDeleteUnsuccessful, "nats: API error: code=400 err_code=10043 description=sequence 5190 not found")
	for _, err := range []error{replicated, flat} {
		if !isGone(err) {
			t.Errorf("isGone(%v) = false", err)
		}
	}
}

// testRouter returns a router for node with its streams on a fresh server,
// ready for the hand-over shell's steps (no Run: no goroutines).
func testRouter(t *testing.T, node string) (*Router, jetstream.JetStream) {
	t.Helper()
	return testRouterOn(t, natstest.RunServer(t), node)
}

// testRouterOn is testRouter on server s.
func testRouterOn(t *testing.T, s *natstest.Server, node string) (*Router, jetstream.JetStream) {
	t.Helper()
	js, err := jetstream.New(s.Connect())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Name: "h", Type: Local, Address: "jms", Timeout: time.Second, Node: node}.withDefaults()
	if err := ensureStreams(context.Background(), js, cfg, 1); err != nil {
		t.Fatal(err)
	}
	r := &Router{js: js, cfg: cfg, log: slog.New(slog.DiscardHandler), side: newSideReads(js), qcheck: newQueueCheck(js, nil, node, slog.New(slog.DiscardHandler)),
		cache: kvbinding.NewCache(kvbinding.CacheConfig{})}
	r.warn.lapsed = logagg.New(r.log, "lapsed", logagg.DefaultEvery)
	r.warn.late = logagg.New(r.log, "late", logagg.DefaultEvery)
	t.Cleanup(func() { r.warn.lapsed.Close(); r.warn.late.Close() })
	r.eng = newEngine(engineConfig{node: node, maxHeldMessages: 100, maxHeldBytes: 1 << 20, maxInFlight: 100, timeout: time.Second},
		r.cache, rand.New(rand.NewPCG(1, 2)))
	r.out = r.newPublisher()
	r.ho = r.newHandOver()
	return r, js
}

// noConsumerInfo is the queue consumer's Info for a fair shell whose
// release a test calls alone.
func noConsumerInfo(context.Context) (*jetstream.ConsumerInfo, error) {
	return nil, errors.New("no queue consumer")
}

// holding gives r, made by testRouter and not yet stepped, an engine that
// holds groups back past their share (Config.GroupShare's rule on).
func holding(r *Router) {
	cfg := r.eng.cfg
	cfg.holds = true
	r.eng = newEngine(cfg, r.cache, rand.New(rand.NewPCG(1, 2)))
	r.ho.holds = true
}

// record puts b in the router's cache and returns its route.
func record(t *testing.T, r *Router, b kvbinding.Binding) kvbinding.Binding {
	t.Helper()
	if !r.cache.Apply(b) {
		t.Fatalf("record %+v not applied", b)
	}
	route, _ := r.cache.Lookup(b.Group)
	return route
}

// queuedSeqs returns the ingress sequences on node's queue, in stream order.
func queuedSeqs(t *testing.T, js jetstream.JetStream, node string) []uint64 {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for seq := uint64(1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(QueueSubjectPrefix+node+".>"))
		if isGone(err) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		is, _ := strconv.ParseUint(m.Header.Get(HeaderIngressSeq), 10, 64)
		out = append(out, is)
		seq = m.Sequence + 1
	}
}

func publishQueued(t *testing.T, js jetstream.JetStream, node, group string, seq uint64) {
	t.Helper()
	m := nats.NewMsg(QueueSubject(node, "jms.x"))
	m.Header.Set(DefaultGroupHeader, group)
	m.Header.Set(HeaderIngressSeq, strconv.FormatUint(seq, 10))
	m.Header.Set(jetstream.MsgIDHeader, IngressStream+":"+strconv.FormatUint(seq, 10))
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// A takeover of the ungrouped routing binding catches up the messages
// that cannot be grouped onto the dead-letter stream, as the lane would
// have: skipped, they were lost with the node that owned the binding.
// (The simulation's seeds 134 and 165.)
func TestCatchUpDeadLettersWhatCannotBeGrouped(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	for i, hdr := range []nats.Header{
		{},                               // 1: ungrouped
		{DefaultGroupHeader: {"a", "b"}}, // 2: two different group ids
		{},                               // 3: ungrouped
		{DefaultGroupHeader: {"g"}},      // 4: another group's
		{},                               // 5: past the span
	} {
		m := &nats.Msg{Subject: "jms.x", Header: hdr, Data: []byte{byte('0' + i)}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	r.step(inBegin{resume: resumePoint{ckpt: kvbinding.Checkpoint{Next: 5}}}) // read past them
	route := record(t, r, kvbinding.Binding{Group: "", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, PrevNode: "n0",
		Step: kvbinding.StepCatchUp, Revision: 7})
	if _, err := r.ho.catchUp(ctx, map[string]kvbinding.Binding{"": route}); err != nil {
		t.Fatal(err)
	}
	if got := queuedSeqs(t, js, "n1"); len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Errorf("queue holds %v, want [1 3]", got)
	}
	dlq, err := js.Stream(ctx, DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := dlq.GetMsg(ctx, 1)
	if err != nil {
		t.Fatalf("nothing dead-lettered: %v", err)
	}
	if m.Header.Get(HeaderIngressSeq) != "2" || m.Header.Get(HeaderDeadReason) == "" {
		t.Errorf("dead-lettered %v, want ingress seq 2 with a reason", m.Header)
	}
}

// A catch-up whose publish the queue stream takes for a duplicate of a
// copy on the old owner's queue moves that copy here before it routes the
// group's next message: the old owner's publish was held by a partitioned
// link and landed after the drain looked (CI: a group's message 30
// processed from the old queue after 31..193 from the new one). A
// duplicate of this node's own earlier attempt stays where it is. When the
// deletion of the late copy's original fails, the step's retry moves it
// again: the copy is on this node's queue, but the retry does not start
// past it, since nothing else would look at the original, which the old
// consumer takes once the pause ends (the simulation's seed 27524, once it
// ran the real publisher).
func TestCatchUpMovesACopyThatLandedLateOnTheOldQueue(t *testing.T) {
	for _, fails := range []int{0, 1} {
		t.Run(fmt.Sprintf("failed_deletes=%d", fails), func(t *testing.T) {
			r, js := testRouter(t, "n1")
			ctx := context.Background()
			for range 4 {
				m := &nats.Msg{Subject: "jms.x", Header: nats.Header{DefaultGroupHeader: {"g"}}}
				if _, err := js.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			publishQueued(t, js, "n1", "g", 1) // this node's own earlier attempt
			publishQueued(t, js, "n9", "g", 2) // the old owner's, landed late
			queue := r.ho.io.queue
			r.ho.io.queue = func(ctx context.Context) (msgStore, error) {
				s, err := queue(ctx)
				return failingDeletes{s, &fails}, err
			}
			r.step(inBegin{resume: resumePoint{ckpt: kvbinding.Checkpoint{Next: 5}}})
			route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, PrevNode: "n9",
				Step: kvbinding.StepCatchUp, Revision: 7, Epoch: 7})
			if fails > 0 {
				if _, err := r.ho.catchUp(ctx, map[string]kvbinding.Binding{"g": route}); !errors.Is(err, errInjected) {
					t.Fatalf("first attempt: %v, want the failed delete", err)
				}
			}
			if _, err := r.ho.catchUp(ctx, map[string]kvbinding.Binding{"g": route}); err != nil {
				t.Fatal(err)
			}
			if got := queuedSeqs(t, js, "n1"); fmt.Sprint(got) != "[1 2 3 4]" {
				t.Fatalf("n1's queue holds %v, want [1 2 3 4]", got)
			}
			if got := queuedSeqs(t, js, "n9"); len(got) != 0 {
				t.Errorf("n9's queue still holds %v", got)
			}
		})
	}
}

// failingDeletes is a msgStore whose next *fails deletions fail.
type failingDeletes struct {
	msgStore
	fails *int
}

func (f failingDeletes) delete(ctx context.Context, seq uint64) error {
	if *f.fails > 0 {
		*f.fails--
		return errInjected
	}
	return f.msgStore.delete(ctx, seq)
}

// A copy the old node's publish landed on its queue after the drain
// looked there (held by a partitioned link, or flushed from its client's
// buffer after a reconnect) is moved by the catch-up, in its turn: the
// staging, run beside the drain, met it by its id, and the catch-up looks
// at it again. Taken for the old node's routing before, it stayed on the
// old queue for the old consumer to take once the pause ended, behind
// what the drain had moved (the simulation's seed 46348, once it ran the
// real publisher).
func TestCatchUpMovesALateCopyTheDrainMissed(t *testing.T) {
	r, js := testRouter(t, "n1")
	e := newEvacuation(t, r, js, 4)
	publishQueued(t, js, "n9", "g", 1) // routed by the old node, still waiting
	e.drainQueues()                    // moves 1
	publishQueued(t, js, "n9", "g", 2) // lands after the drain looked
	if s := e.stage(); s == nil || s.routed[2] == 0 || len(s.copies) != 2 {
		t.Fatalf("staged %+v, want copies of 3 and 4, and 2 routed by n9", s)
	}
	e.catchUp(2, "[1 2 3 4]")
	if got := queuedSeqs(t, js, "n9"); len(got) != 0 {
		t.Errorf("n9's queue still holds %v", got)
	}
}

// A group coming back to a node whose own queue still holds some of it is
// drained from that queue too, so that the earlier messages from the other
// queue come first; a retried drain leaves its own copies in place. (The
// simulation's seeds 39554 and 78333.)
func TestDrainMergesTheTakersOwnQueue(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	publishQueued(t, js, "n1", "g", 8)
	publishQueued(t, js, "n1", "g", 9)
	publishQueued(t, js, "n9", "g", 7)
	publishQueued(t, js, "n1", "g", 10)
	route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 11, PrevNode: "n1",
		Step: kvbinding.StepDrain, Drain: []string{"n1", "n9"}, Revision: 5})
	for attempt := 1; attempt <= 2; attempt++ {
		if _, err := r.ho.drainQueues(ctx, map[string]kvbinding.Binding{"g": route}, nil); err != nil {
			t.Fatal(err)
		}
		if got := queuedSeqs(t, js, "n1"); fmt.Sprint(got) != "[7 8 9 10]" {
			t.Fatalf("attempt %d: n1's queue holds %v, want [7 8 9 10]", attempt, got)
		}
		if got := queuedSeqs(t, js, "n9"); len(got) != 0 {
			t.Fatalf("attempt %d: n9's queue still holds %v", attempt, got)
		}
	}
}

// The scan of the old queues finds a group's messages among many of other
// groups and nodes, in queue order, and what the old node held back of it,
// whatever the walkers' split of the sequences; a node with nothing
// waiting is not walked.
func TestScanQueuesFindsTheGroupsAmongMany(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	want := map[string][]uint64{}
	for seq := uint64(1); seq <= 300; seq++ {
		node := "n9"
		if seq%3 == 0 {
			node = "n8" // another node's queue: never looked at
		}
		g := "g" + strconv.FormatUint(seq%7, 10)
		publishQueued(t, js, node, g, seq)
		if node == "n9" && (g == "g3" || g == "g5") {
			want[g] = append(want[g], seq)
		}
	}
	for _, seq := range []uint64{301, 302} {
		m := nats.NewMsg(HeldSubject("n9", "g3", "jms.x"))
		m.Header.Set(DefaultGroupHeader, "g3")
		m.Header.Set(HeaderIngressSeq, strconv.FormatUint(seq, 10))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		want["g3"] = append(want["g3"], seq)
	}
	m := nats.NewMsg(HeldSubject("n9", "g4", "jms.x")) // another group's
	m.Header.Set(DefaultGroupHeader, "g4")
	m.Header.Set(HeaderIngressSeq, "303")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	byNode := map[string]map[string]bool{"n9": {"g3": true, "g5": true}, "n7": {"g3": true}}
	found, err := r.ho.scanQueues(ctx, jsStore{stream}, byNode, map[string]kvbinding.Binding{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for g, w := range want {
		var got []uint64
		for _, q := range found[g] {
			if q.from != "n9" {
				t.Errorf("%s: found on %s's queue", g, q.from)
			}
			got = append(got, q.ingressSeq)
		}
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("%s: found %v, want %v", g, got, w)
		}
	}
	if len(found) != 2 {
		t.Errorf("found groups %d, want 2", len(found))
	}
	for _, n := range []int{1, 7, 64, 1000} {
		msgs, err := (&handOver{clock: sysClock{}}).walkSubject(ctx, jsStore{stream}, QueueSubjectPrefix+"n9.>", 1, 300, n)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != 200 {
			t.Fatalf("walk with n=%d: %d messages, want 200", n, len(msgs))
		}
		for i := 1; i < len(msgs); i++ {
			if msgs[i].Sequence <= msgs[i-1].Sequence {
				t.Fatalf("walk with n=%d: out of order at %d", n, i)
			}
		}
	}
}

// A drain of a queue whose consumer is paused already (the handler paused
// it before it wrote the record) takes that reading for its first renewal
// and for a quiet one: it moves at once what was never delivered.
func TestDrainOfAPausedQueue(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	if _, err := ensureQueueConsumer(ctx, js, "n9", QueuePinned, 5*time.Second, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := js.PauseConsumer(ctx, QueueStream, QueueConsumer("n9"), time.Now().Add(drainPause)); err != nil {
		t.Fatal(err)
	}
	v, ok := r.ho.pausedView(ctx, "n9")
	if !ok || !v.quiet {
		t.Fatalf("paused consumer: view %+v, ok %v; want a quiet one", v, ok)
	}
	if _, ok := r.ho.pausedView(ctx, "n8"); ok {
		t.Fatal("a queue without a consumer: taken as paused")
	}
	publishQueued(t, js, "n9", "g", 7)
	publishQueued(t, js, "n9", "h", 8)
	route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 9, PrevNode: "n9",
		Step: kvbinding.StepDrain, Drain: []string{"n9"}, Revision: 5})
	moved, err := r.ho.drainQueues(ctx, map[string]kvbinding.Binding{"g": route}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if moved["g"] != 1 {
		t.Errorf("moved %v, want g: 1", moved)
	}
	if got := queuedSeqs(t, js, "n1"); fmt.Sprint(got) != "[7]" {
		t.Errorf("n1's queue holds %v, want [7]", got)
	}
	if got := queuedSeqs(t, js, "n9"); fmt.Sprint(got) != "[8]" {
		t.Errorf("n9's queue holds %v, want [8] (another group's)", got)
	}
}

// A drain stops once the record moved past the revision it works for.
// (The simulation's seed 112894.)
func TestDrainStopsWhenTheRecordMovesOn(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	publishQueued(t, js, "n9", "g", 7)
	route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 8, PrevNode: "n9",
		Step: kvbinding.StepDrain, Drain: []string{"n9"}, Revision: 5})
	record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n2", FromSeq: 8, PrevNode: "n9",
		Step: kvbinding.StepDrain, Drain: []string{"n9", "n1"}, Revision: 6})
	if _, err := r.ho.drainQueues(ctx, map[string]kvbinding.Binding{"g": route}, nil); !errors.Is(err, errSuperseded) {
		t.Fatalf("drain of a superseded revision: err %v, want errSuperseded", err)
	}
	if got := queuedSeqs(t, js, "n9"); fmt.Sprint(got) != "[7]" {
		t.Errorf("n9's queue holds %v, want [7] (left to the record's new node)", got)
	}
}

// A step report the handler could not take yet is sent again; one the
// record moved past is not. (The simulation's seeds 120, 130, 177: failed;
// 284, 1693: refused from an older revision.)
func TestSortReports(t *testing.T) {
	sent := []proposals.Proposal{
		{Op: proposals.OpDrained, Group: "accepted", Rev: 5},
		{Op: proposals.OpDrained, Group: "failed", Rev: 5},
		{Op: proposals.OpCaughtUp, Group: "lagging", Rev: 6},
		{Op: proposals.OpCaughtUp, Group: "moved-on", Rev: 6},
		{Op: proposals.OpCaughtUp, Group: "failed-moved-on", Rev: 6},
		{Op: proposals.OpDrained, Group: "no-record-here", Rev: 5},
	}
	ds := []proposals.Decision{
		{Group: "accepted", Outcome: proposals.Accepted, Revision: 6},
		{Group: "failed", Outcome: proposals.Failed, Error: "write failed"},
		{Group: "lagging", Outcome: proposals.Refused, Revision: 2},
		{Group: "moved-on", Outcome: proposals.Refused, Revision: 9},
		{Group: "failed-moved-on", Outcome: proposals.Failed},
		{Group: "no-record-here", Outcome: proposals.Refused, Revision: 0},
	}
	seen := map[string]uint64{"accepted": 5, "failed": 5, "lagging": 6, "moved-on": 9, "failed-moved-on": 8, "no-record-here": 0}
	again, notTaken := sortReports(sent, ds, func(g string) uint64 { return seen[g] })
	var gotAgain []string
	for _, p := range again {
		gotAgain = append(gotAgain, p.Group)
	}
	wantAgain := []string{"failed", "lagging"}
	wantNot := []string{"moved-on", "failed-moved-on", "no-record-here"}
	if len(gotAgain) != len(wantAgain) || gotAgain[0] != wantAgain[0] || gotAgain[1] != wantAgain[1] {
		t.Errorf("sent again %v, want %v", gotAgain, wantAgain)
	}
	if len(notTaken) != len(wantNot) {
		t.Fatalf("not taken %v, want %v", notTaken, wantNot)
	}
	for i := range wantNot {
		if notTaken[i] != wantNot[i] {
			t.Errorf("not taken %v, want %v", notTaken, wantNot)
		}
	}
}

// A group's previous owner published a message whose copy landed on its
// queue late (a frozen server or a partitioned link held it) after the
// drain had looked there, and this node, which read the ingress behind
// the old owner, routes that message by its lane: the PubAck says
// duplicate and names the old copy, which the lane moves onto this node's
// queue before it routes the group's next message. Without that, the copy
// would be processed from the old queue behind the later messages (CI's
// nemesis seed 103: `9..38@n2 40..42@n2 39@n0`).
func TestLaneMovesACopyThatLandedLateOnTheOldQueue(t *testing.T) {
	s := natstest.RunServer(t)
	nc := s.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(nc, Config{Name: "h", Type: Local, Address: "jms", Timeout: time.Second, Node: "n0",
		MaxBatch: 1, Heartbeat: 100 * time.Millisecond, LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	<-r.Ready()
	// The group came here from n9 (a fresh binding's copies are all this
	// node's own: the lane checks none), and n9's copy of ingress message
	// 2 landed on its queue late.
	if _, err := r.store.Create(ctx, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n0", PrevNode: "n9", FromSeq: 1}); err != nil {
		t.Fatal(err)
	}
	publishQueued(t, js, "n9", "g", 2)
	for range 3 {
		m := &nats.Msg{Subject: "jms.x", Header: nats.Header{DefaultGroupHeader: {"g"}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		if got := queuedSeqs(t, js, "n0"); fmt.Sprint(got) != "[1 2 3]" {
			return fmt.Errorf("n0's queue holds %v, want [1 2 3]", got)
		}
		return nil
	})
	if got := queuedSeqs(t, js, "n9"); len(got) != 0 {
		t.Errorf("n9's queue still holds %v", got)
	}
}

// A fence says clean only for a group of which this node's queue and held
// subject store nothing: not for one with a message waiting, nor one with
// a message held back, and not at all once the queue stores more than a
// fence reads; other asks are left as they are.
func TestMarkCleanLooksAtThisNodesQueue(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	publishQueued(t, js, "n1", "waits", 1)
	publishQueued(t, js, "n2", "elsewhere", 2) // another node's queue
	// Routed by n1 under its binding, in the group's epoch (not a drain
	// step's copy).
	record(t, r, kvbinding.Binding{Group: "routed", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 5})
	m := nats.NewMsg(QueueSubject("n1", "jms.x"))
	m.Header.Set(DefaultGroupHeader, "routed")
	m.Header.Set(HeaderIngressSeq, "4")
	m.Header.Set(HeaderEpoch, "5")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	m = nats.NewMsg(HeldSubject("n1", "held", "jms.x"))
	m.Header.Set(DefaultGroupHeader, "held")
	m.Header.Set(HeaderIngressSeq, "3")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	fence := func(g string) proposals.Proposal {
		return proposals.Proposal{Op: proposals.OpFence, Group: g, Seq: 9, Rev: 2}
	}
	ps := []proposals.Proposal{fence("waits"), fence("elsewhere"), fence("held"), fence("none"), fence("routed"),
		{Group: "new", Node: "n1", Seq: 9}}
	r.ho.markClean(ctx, ps)
	got := map[string]bool{}
	for _, p := range ps {
		got[p.Group] = p.Clean
	}
	want := map[string]bool{"waits": false, "elsewhere": true, "held": false, "none": true, "routed": false, "new": false}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("clean: %v, want %v", got, want)
	}

	for seq := uint64(10); seq < 10+cleanScanMax; seq++ {
		publishQueued(t, js, "n1", "busy", seq)
	}
	ps = []proposals.Proposal{fence("none")}
	r.ho.markClean(ctx, ps)
	if ps[0].Clean {
		t.Fatalf("a fence said clean with %d messages on the queue, past the %d it reads", cleanScanMax+1, cleanScanMax)
	}
}

// A release whose publish fails returns at once, with the error, and
// leaves the held message where it is: the fair shell goes on with the
// other groups and releases this one again next round. (It used to retry
// the publish until it succeeded, and a message id the servers kept "in
// process" for a minute after a fault stalled every held group behind it.)
func TestReleaseReturnsWhenItsPublishFails(t *testing.T) {
	r, js := testRouter(t, "n1")
	r.warn.release = logagg.New(r.log, "release", logagg.DefaultEvery)
	t.Cleanup(r.warn.release.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 3})
	m := nats.NewMsg(HeldSubject("n1", "g", "jms.x"))
	m.Header.Set(DefaultGroupHeader, "g")
	m.Header.Set(HeaderIngressSeq, "7")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	// The queue stream refuses every new message from now on.
	stream, err := js.Stream(ctx, QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	cfg.MaxMsgs, cfg.Discard = 1, jetstream.DiscardNew
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	seqs, left, err := r.newFairShell(noConsumerInfo).release(ctx, jsStore{stream}, releaseTask{ref: "g", group: "g", n: 4})
	if err == nil || ctx.Err() != nil {
		t.Fatalf("release: seqs %v, err %v (ctx %v): want the publish's error, at once", seqs, err, ctx.Err())
	}
	if len(seqs) != 0 || !left {
		t.Fatalf("release: moved %v, left %v: want nothing moved, the held message left", seqs, left)
	}
	if _, err := stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(HeldFilter("n1", "*.*"))); err != nil {
		t.Fatalf("the held message: %v", err)
	}
}

// A node stopped between its release's copy of a held message and the
// deletion of the original (seed 680930086: SIGSTOP) leaves both; its
// consumer processes the copy, and the drain of the next owner finds the
// original on the held subject, never delivered. Its copy of the original
// is a duplicate of the release's (one id, movedID), which it finds
// processed: the original is deleted and nothing is stored again.
func TestDrainMovesNothingOfAHeldMessageWhoseReleaseWasProcessed(t *testing.T) {
	s := natstest.RunServer(t)
	r9, js := testRouterOn(t, s, "n9")
	r1, _ := testRouterOn(t, s, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := nats.NewMsg(HeldSubject("n9", "g", "jms.x"))
	m.Header.Set(DefaultGroupHeader, "g")
	m.Header.Set(HeaderIngressSeq, "5")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	held, err := stream.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := r9.newFairShell(noConsumerInfo).releaseCopy(ctx, "g", held, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx, ack.Sequence); err != nil { // n9's consumer processed it
		t.Fatal(err)
	}
	route := record(t, r1, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 7, PrevNode: "n9",
		Step: kvbinding.StepDrain, Drain: []string{"n9"}, Epoch: 9, Revision: 9})
	if _, err := r1.ho.drainQueues(ctx, map[string]kvbinding.Binding{"g": route}, nil); err != nil {
		t.Fatal(err)
	}
	if got := queuedSeqs(t, js, "n1"); len(got) != 0 {
		t.Errorf("n1's queue holds %v: processed on n9 already", got)
	}
	if _, err := stream.GetMsg(ctx, held.Sequence); !isGone(err) {
		t.Errorf("the held original: %v, want it deleted", err)
	}
}

// A drain hands the groups the old queues hold nothing of to none as soon
// as it has read them, while it still waits for a group whose message the
// old consumer holds unacknowledged: an evacuated node's groups with
// nothing left on its queue are reported, and caught up, without waiting
// for the batch's slowest group (within the duplicate window, before a
// server restart could lose it).
func TestDrainHandsOverAtOnceTheGroupsWithNothingWaiting(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cons, err := ensureQueueConsumer(ctx, js, "n9", QueuePlain, 5*time.Second, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	publishQueued(t, js, "n9", "busy", 7)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var held jetstream.Msg
	for m := range batch.Messages() {
		held = m // delivered, not acknowledged
	}
	if held == nil {
		t.Fatal("the old consumer was delivered nothing")
	}
	routes := map[string]kvbinding.Binding{}
	for i, g := range []string{"busy", "empty-a", "empty-b"} {
		routes[g] = record(t, r, kvbinding.Binding{Group: g, State: kvbinding.StateBound, Node: "n1", FromSeq: 9, PrevNode: "n9",
			Step: kvbinding.StepDrain, Drain: []string{"n9"}, Revision: uint64(5 + i)})
	}
	none := make(chan []string, 1)
	done := make(chan error, 1)
	go func() {
		_, err := r.ho.drainQueues(ctx, routes, func(groups, _ []string) {
			if len(groups) > 0 {
				none <- groups
			}
		})
		done <- err
	}()
	select {
	case groups := <-none:
		if fmt.Sprint(groups) != "[empty-a empty-b]" {
			t.Fatalf("handed at once: %v, want [empty-a empty-b]", groups)
		}
	case err := <-done:
		t.Fatalf("the drain ended (%v) before it handed over the groups with nothing waiting", err)
	}
	select {
	case err := <-done:
		t.Fatalf("the drain ended (%v) while the old consumer still holds a message of busy", err)
	default:
	}
	if err := held.Ack(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A step handed for one revision of a record is dropped when the record
// moved on before the step ran (a batch waits for one of the hand-over
// loop's slots; a paused process resumes with a cache that caught up):
// run on the newer record, which names another node, it would have moved
// that node's group onto this one's queue. (Nemesis seed 712389592: a
// catch-up of a record bound to n0 run by n1.)
func TestStepDroppedWhenItsRecordMovedOn(t *testing.T) {
	r, js := testRouter(t, "n1")
	r.ho.propose = proposals.NewClient(r.side.js.Conn(), "n1", 100*time.Millisecond).Propose
	publishQueued(t, js, "n9", "g", 7)
	record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n2", FromSeq: 8, PrevNode: "n9",
		Step: kvbinding.StepDrain, Drain: []string{"n9"}, Revision: 7})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r.ho.runSteps(ctx, map[string]dutyJob{"g": {duty: proposals.DutyDrain, rev: 5}})
	if got := queuedSeqs(t, js, "n1"); len(got) != 0 {
		t.Fatalf("n1's queue holds %v: a step ran for a record that names n2", got)
	}
	if got := queuedSeqs(t, js, "n9"); fmt.Sprint(got) != "[7]" {
		t.Fatalf("n9's queue holds %v, want [7] (left to n2)", got)
	}
}

// evacuation is n1 taking group g over from n9, which the handler
// evacuated from its checkpoint at ingress sequence 1: the test's
// hand-over steps on r.
type evacuation struct {
	t     *testing.T
	r     *Router
	js    jetstream.JetStream
	drain kvbinding.Binding // the drain step's record (revision 7)
}

// newEvacuation publishes n ingress messages of g, has n1's lane take over
// after them, and records the drain step.
func newEvacuation(t *testing.T, r *Router, js jetstream.JetStream, n int) *evacuation {
	t.Helper()
	holding(r)
	for range n {
		m := &nats.Msg{Subject: "jms.x", Header: nats.Header{DefaultGroupHeader: {"g"}}}
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	r.step(inBegin{resume: resumePoint{ckpt: kvbinding.Checkpoint{Next: uint64(n) + 1}}})
	drain := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, PrevNode: "n9",
		Step: kvbinding.StepDrain, Drain: []string{"n9"}, Revision: 7})
	return &evacuation{t: t, r: r, js: js, drain: drain}
}

// stage runs the drain step's staging and returns what it learned.
func (e *evacuation) stage() *stagedSpan {
	e.t.Helper()
	if err := e.r.ho.stage(context.Background(), map[string]kvbinding.Binding{"g": e.drain}); err != nil {
		e.t.Fatal(err)
	}
	return e.r.ho.duties.stagedOf("g", e.drain.Epoch)
}

// drainQueues runs the drain step's drain.
func (e *evacuation) drainQueues() {
	e.t.Helper()
	if _, err := e.r.ho.drainQueues(context.Background(), map[string]kvbinding.Binding{"g": e.drain}, nil); err != nil {
		e.t.Fatal(err)
	}
}

// catchUp runs the catch-up step attempts times and checks, after each,
// that n1's queue holds the ingress sequences want and its held subject
// nothing.
func (e *evacuation) catchUp(attempts int, want string) {
	e.t.Helper()
	route := record(e.t, e.r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, PrevNode: "n9",
		Step: kvbinding.StepCatchUp, Revision: 8, Epoch: 7})
	for attempt := 1; attempt <= attempts; attempt++ {
		if _, err := e.r.ho.catchUp(context.Background(), map[string]kvbinding.Binding{"g": route}); err != nil {
			e.t.Fatal(err)
		}
		if got := queuedSeqs(e.t, e.js, "n1"); fmt.Sprint(got) != want {
			e.t.Fatalf("attempt %d: n1's queue holds %v, want %s", attempt, got, want)
		}
		if n := heldOn(e.t, e.js, "n1"); n != 0 {
			e.t.Errorf("attempt %d: n1's held subject still holds %d messages", attempt, n)
		}
	}
}

// A drain step stages its catch-up on this node's held subject while the
// queue stream's duplicate window still knows what the old node routed:
// a server restart before the catch-up then no longer lets a message the
// old node routed and its consumer consumed through a second time
// (nats-io/nats-server#3272; nemesis seed 907382602: a cut-off consumer
// held 57..89 of a group and had acked 90, the drain waited its ack wait
// for them, the servers restarted, and the catch-up from 90 stored 90
// again).
func TestStagedCatchUpSkipsWhatTheOldNodeRoutedAcrossAServerRestart(t *testing.T) {
	srv := natstest.RunServer(t)
	r, js := testRouterOn(t, srv, "n1")
	ctx := context.Background()
	e := newEvacuation(t, r, js, 6)
	// The old node n9 routed 1..5 after its checkpoint (1); its consumer
	// took 1, 2 and 5 and holds 3 and 4.
	st, err := js.Stream(ctx, QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 5; seq++ {
		publishQueued(t, js, "n9", "g", seq)
	}
	for _, qseq := range []uint64{1, 2, 5} {
		if err := st.DeleteMsg(ctx, qseq); err != nil {
			t.Fatal(err)
		}
	}
	if s := e.stage(); s == nil || len(s.copies) != 1 || s.copies[6].at == 0 || len(s.routed) != 5 {
		t.Fatalf("staged %+v, want a copy of 6 and 1..5 routed", s)
	}
	srv.Stop()
	srv.Restart() // the window is rebuilt from what is stored: 3, 4 and the staged 6
	natstest.WaitStreamLeader(t, js, QueueStream, 10*time.Second)
	e.drainQueues()
	e.catchUp(2, "[3 4 6]") // not 5: consumed from n9's queue
	// What the test stands on: after the restart the window no longer
	// knows 5, so a catch-up from the ingress would have stored it again.
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: QueueSubject("n8", "jms.x"),
		Header: nats.Header{jetstream.MsgIDHeader: {IngressStream + ":5"}}})
	if err != nil {
		t.Fatal(err)
	}
	if ack.Duplicate {
		t.Fatal("the restart kept the duplicate window of a consumed message: the test shows nothing")
	}
}

// A catch-up after a restart of its node (no memory of the drain step's
// staging) finds the staged copies by their ids and moves them, read back
// from the stream when they are past what a staging keeps in memory.
func TestCatchUpAfterARestartMovesTheStagedCopies(t *testing.T) {
	for _, keep := range []int{stageKeepBytes, 0} {
		t.Run(fmt.Sprintf("keep=%d", keep), func(t *testing.T) {
			defer func(was int) { stageKeepBytes = was }(stageKeepBytes)
			stageKeepBytes = keep
			r, js := testRouter(t, "n1")
			e := newEvacuation(t, r, js, 3)
			publishQueued(t, js, "n9", "g", 1) // routed by the old node, still waiting
			e.stage()
			if n := heldOn(t, js, "n1"); n != 2 {
				t.Fatalf("n1's held subject holds %d messages, want 2 staged", n)
			}
			e.drainQueues()
			r.ho.duties = newDutyQueue() // the node restarted
			e.catchUp(1, "[1 2 3]")
		})
	}
}

// heldOn counts the messages on node's held subject.
func heldOn(t *testing.T, js jetstream.JetStream, node string) int {
	t.Helper()
	st, err := js.Stream(context.Background(), QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(HeldSubjectPrefix+node+".>"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n
}

// A staged copy found gone when the catch-up deletes it (an earlier
// attempt of the catch-up deleted it and its answer was lost, or a
// successor drained it along with the queue copy) leaves the queue copy in
// place; a retried catch-up moves nothing twice and withdraws nothing.
func TestCatchUpKeepsTheCopyOfAStagedMessageGoneMeanwhile(t *testing.T) {
	r, js := testRouter(t, "n1")
	e := newEvacuation(t, r, js, 2)
	s := e.stage()
	if s == nil || len(s.copies) != 2 {
		t.Fatalf("staged %+v, want copies of 1 and 2", s)
	}
	st, err := js.Stream(context.Background(), QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(context.Background(), s.copies[2].at); err != nil {
		t.Fatal(err)
	}
	e.catchUp(2, "[1 2]")
}

// A node restarted during a take-over does not count the take-over's
// staged copies as messages held back for their share (the catch-up moves
// them); another group's held messages it counts.
func TestRestoreHeldSkipsAStagedCatchUp(t *testing.T) {
	r, js := testRouter(t, "n1")
	holding(r)
	r.ho.nc = js.Conn()
	ctx := context.Background()
	for _, g := range []string{"taken", "held"} {
		m := &nats.Msg{Subject: HeldSubject("n1", g, "jms.x"), Header: nats.Header{DefaultGroupHeader: {g}, HeaderIngressSeq: {"1"}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	record(t, r, kvbinding.Binding{Group: "taken", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, PrevNode: "n9",
		Step: kvbinding.StepCatchUp, Revision: 8, Epoch: 7})
	record(t, r, kvbinding.Binding{Group: "held", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Revision: 9})
	if err := r.restoreHeld(ctx); err != nil {
		t.Fatal(err)
	}
	if r.eng.fair.held != 1 || r.eng.fair.heldGroups != 1 {
		t.Errorf("restored %d held messages of %d groups, want 1 of 1 (the other group's)", r.eng.fair.held, r.eng.fair.heldGroups)
	}
}

// A message stored on two of the drained queues (a mover stopped between
// its copy and the original's deletion) is moved once, and its other entry
// deleted: left on its queue it would be delivered after the group moved
// on (the simulation's seed 7003: 39 delivered from the stopped mover's
// queue before 31 and 34 from the new owner's).
func TestDrainMovesAMessageStoredTwiceOnce(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	publishQueued(t, js, "n9", "g", 5) // the original
	publishQueued(t, js, "n9", "g", 6)
	m := nats.NewMsg(QueueSubject("n8", "jms.x")) // the stopped mover's copy of 5
	m.Header.Set(DefaultGroupHeader, "g")
	m.Header.Set(HeaderIngressSeq, "5")
	m.Header.Set(HeaderMovedFrom, "n9")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 7, PrevNode: "n8",
		Step: kvbinding.StepDrain, Drain: []string{"n9", "n8"}, Revision: 9})
	if _, err := r.ho.drainQueues(ctx, map[string]kvbinding.Binding{"g": route}, nil); err != nil {
		t.Fatal(err)
	}
	if got := queuedSeqs(t, js, "n1"); fmt.Sprint(got) != "[5 6]" {
		t.Errorf("n1's queue holds %v, want [5 6]", got)
	}
	for _, n := range []string{"n8", "n9"} {
		if got := queuedSeqs(t, js, n); len(got) != 0 {
			t.Errorf("%s's queue still holds %v", n, got)
		}
	}
}

// publishCopy stores on node's queue a copy of group's ingress message is
// as a mover makes it of the original at queue sequence orig, and returns
// its queue sequence.
func publishCopy(t *testing.T, js jetstream.JetStream, node, group string, is, orig uint64) uint64 {
	t.Helper()
	m := nats.NewMsg(QueueSubject(node, "jms.x"))
	m.Header.Set(DefaultGroupHeader, group)
	m.Header.Set(HeaderIngressSeq, strconv.FormatUint(is, 10))
	m.Header.Set(HeaderMovedFrom, "n9")
	m.Header.Set(jetstream.MsgIDHeader, movedID(orig))
	ack, err := js.PublishMsg(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// A mover that stopped between its copy and the deletion of the original
// (CI's nemesis seed 103: n2 paused there), whose copy its consumer then
// processed: the successor's copy of the original is a duplicate of that
// copy, and the successor deletes the original instead of delivering the
// message a second time.
func TestDrainDeletesAnOriginalWhoseEarlierCopyWasProcessed(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	publishQueued(t, js, "n9", "g", 5) // queue sequence 1
	c := publishCopy(t, js, "n8", "g", 5, 1)
	st, err := js.Stream(ctx, QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteMsg(ctx, c); err != nil { // n8's consumer acked it
		t.Fatal(err)
	}
	publishQueued(t, js, "n9", "g", 6)
	route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 7, PrevNode: "n8",
		Step: kvbinding.StepDrain, Drain: []string{"n9", "n8"}, Revision: 9})
	moved, err := r.ho.drainQueues(ctx, map[string]kvbinding.Binding{"g": route}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := queuedSeqs(t, js, "n1"); fmt.Sprint(got) != "[6]" {
		t.Errorf("n1's queue holds %v, want [6]: 5 was processed on n8", got)
	}
	if got := queuedSeqs(t, js, "n9"); len(got) != 0 {
		t.Errorf("n9's queue still holds %v", got)
	}
	if moved["g"] != 1 {
		t.Errorf("moved %d, want 1", moved["g"])
	}
}

// An earlier mover's copy of an original (queue sequence 1) is moved here
// once, and both it and the original are deleted: found with the original
// on the drained queues (n8's, moved in its turn once the successor's copy
// of the original turned out a duplicate of it), or on a queue the drain
// does not read, where it landed after the drain looked (n7's, moved here
// before the original is deleted).
func TestDrainMovesAnEarlierMoversCopyOnce(t *testing.T) {
	for _, tc := range []struct{ copyOn, drain string }{{"n8", "n9,n8"}, {"n7", "n9"}} {
		t.Run(tc.copyOn, func(t *testing.T) {
			r, js := testRouter(t, "n1")
			publishQueued(t, js, "n9", "g", 5) // queue sequence 1
			publishCopy(t, js, tc.copyOn, "g", 5, 1)
			publishQueued(t, js, "n9", "g", 6)
			route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 7, PrevNode: "n9",
				Step: kvbinding.StepDrain, Drain: strings.Split(tc.drain, ","), Revision: 9})
			if _, err := r.ho.drainQueues(context.Background(), map[string]kvbinding.Binding{"g": route}, nil); err != nil {
				t.Fatal(err)
			}
			if got := queuedSeqs(t, js, "n1"); fmt.Sprint(got) != "[5 6]" {
				t.Errorf("n1's queue holds %v, want [5 6]", got)
			}
			for _, n := range []string{tc.copyOn, "n9"} {
				if got := queuedSeqs(t, js, n); len(got) != 0 {
					t.Errorf("%s's queue still holds %v", n, got)
				}
			}
		})
	}
}

// A mover whose liveness may have lapsed, or whose record moved on,
// deletes no original and no staged copy: a successor draining the same
// queues finds both the original and the copy and moves the message once
// (the tests above), where a deletion by the stale mover could make it
// take a copy gone for one consumed and withdraw its own.
func TestAMoverThatMayHaveLapsedDeletesNothing(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	e := newEvacuation(t, r, js, 2)
	s := e.stage()
	if s == nil || len(s.copies) != 2 {
		t.Fatalf("staged %+v, want copies of 1 and 2", s)
	}
	st, err := js.Stream(ctx, QueueStream)
	if err != nil {
		t.Fatal(err)
	}
	publishQueued(t, js, "n9", "g", 9) // an id the staging did not use
	orig, err := st.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(QueueSubjectPrefix+"n9.>"))
	if err != nil {
		t.Fatal(err)
	}
	route, _ := r.cache.Lookup("g")
	q := queued{msg: orig, from: "n9", ingressSeq: 9, group: "g"}
	if err := r.ho.deleteOriginal(ctx, jsStore{st}, q, kvbinding.Binding{Group: "g", Revision: route.Revision - 1}); !errors.Is(err, errSuperseded) {
		t.Errorf("deleteOriginal under a past revision: %v, want errSuperseded", err)
	}
	r.step(inAlive{until: time.Now().Add(-time.Second)})
	if err := r.ho.deleteOriginal(ctx, jsStore{st}, q, route); !errors.Is(err, errFencedNow) {
		t.Errorf("deleteOriginal while fenced: %v, want errFencedNow", err)
	}
	if err := r.ho.unstage(ctx, jsStore{st}, s, s.copies[1].at, 1); !errors.Is(err, errFencedNow) {
		t.Errorf("unstage while fenced: %v, want errFencedNow", err)
	}
	if err := r.ho.dropStaged(ctx, jsStore{st}, "g", s, 3); !errors.Is(err, errFencedNow) {
		t.Errorf("dropStaged while fenced: %v, want errFencedNow", err)
	}
	if n := heldOn(t, js, "n1"); n != 2 {
		t.Errorf("n1's held subject holds %d messages, want the 2 staged", n)
	}
	if got := queuedSeqs(t, js, "n9"); fmt.Sprint(got) != "[9]" {
		t.Errorf("n9's queue holds %v, want the original [9]", got)
	}
}

// A node that restarted between its drain step's staging and its
// catch-up, whose retried drain found nothing left on the old queues (so
// it staged nothing again and marked the group not staged), finds its
// staged copies by their ids when the catch-up's publishes are duplicates
// of them, and moves them onto its queue in order: no consumer reads the
// held subject. (The simulation's seed 2698 once its cache kept an
// evacuation's Reason, as the real one does: seq 12 stayed on the held
// subject.)
func TestCatchUpMovesAStagedCopyItForgot(t *testing.T) {
	r, js := testRouter(t, "n1")
	e := newEvacuation(t, r, js, 3)
	if s := e.stage(); s == nil || len(s.copies) != 3 {
		t.Fatalf("staged %+v, want copies of 1..3", s)
	}
	r.ho.duties = newDutyQueue() // the node restarted
	e.drainQueues()
	r.ho.duties.notStaged("g", e.drain.Epoch) // the drain's retry found nothing
	e.catchUp(2, "[1 2 3]")
}

// A take-over whose record pins the old node's checkpoint (an evacuation
// took its start from it: kvbinding.Binding.Ckpt) does not route again
// what that checkpoint says the old node finished, although the
// checkpoint's start (2, where one slow group held it back) is behind
// them: with the duplicate window lost meanwhile, they would be stored and
// delivered twice (nemesis seed 354129787). A checkpoint the old node
// saved over since pins nothing (it may count as finished what the node
// skipped as no longer its own): the catch-up routes the whole span, but
// for what the new checkpoint says the node routed of the group before it
// was taken (Checkpoint.Lost: through 4), when that message is gone from
// the queue stream (consumed); still there, it may have landed after the
// drain looked, and the catch-up routes the whole span (nemesis seeds
// 858423323 and 817403570: 86..95 routed again a minute after a rolling
// restart).
func TestCatchUpSkipsWhatThePinnedCheckpointSaysWasFinished(t *testing.T) {
	type savedOver int
	const (
		notSaved savedOver = iota
		saved
		savedNamingItGone
		savedNamingItQueued
	)
	for _, over := range []savedOver{notSaved, saved, savedNamingItGone, savedNamingItQueued} {
		t.Run([]string{"pinned", "saved_over", "saved_over_naming_it_consumed", "saved_over_naming_it_queued"}[over], func(t *testing.T) {
			r, js := testRouter(t, "n1")
			ctx := context.Background()
			var err error
			if r.reg, err = kvbinding.OpenRegistry(ctx, js, kvbinding.RegistryConfig{}, nil); err != nil {
				t.Fatal(err)
			}
			r.ho.loadCheckpointAt = r.reg.LoadCheckpointAt
			holding(r)
			for range 6 {
				m := &nats.Msg{Subject: "jms.x", Header: nats.Header{DefaultGroupHeader: {"g"}}}
				if _, err := js.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			r.step(inBegin{resume: resumePoint{ckpt: kvbinding.Checkpoint{Next: 7}}}) // the lane reads from 7
			if err := r.reg.SaveCheckpoint(ctx, "n9", kvbinding.Checkpoint{Next: 7, Pending: [][2]uint64{{2, 2}, {5, 5}}}); err != nil {
				t.Fatal(err)
			}
			_, rev, _, err := r.reg.LoadCheckpointRev(ctx, "n9")
			if err != nil {
				t.Fatal(err)
			}
			want := "[2 5]"
			if over != notSaved {
				c := kvbinding.Checkpoint{Next: 7}
				want = "[2 3 4 5 6]"
				if over == savedNamingItGone || over == savedNamingItQueued {
					// n9's copy of 4, on its queue.
					ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: QueueSubject("n9", "jms.x"), Header: nats.Header{DefaultGroupHeader: {"g"}}})
					if err != nil {
						t.Fatal(err)
					}
					if over == savedNamingItGone {
						st, err := js.Stream(ctx, QueueStream)
						if err != nil {
							t.Fatal(err)
						}
						if err := st.DeleteMsg(ctx, ack.Sequence); err != nil { // consumed
							t.Fatal(err)
						}
						want = "[5 6]"
					}
					c.Lost, c.Seen = map[string]kvbinding.LostPos{"g": {4, ack.Sequence, 7}}, 8
				}
				if err := r.reg.SaveCheckpoint(ctx, "n9", c); err != nil {
					t.Fatal(err)
				}
			}
			drain := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 2, PrevNode: "n9",
				Step: kvbinding.StepDrain, Drain: []string{"n9"}, Reason: "node n9 gone", Ckpt: rev, Revision: 7})
			if err := r.ho.stage(ctx, map[string]kvbinding.Binding{"g": drain}); err != nil {
				t.Fatal(err)
			}
			s := r.ho.duties.stagedOf("g", drain.Epoch)
			if s == nil || fmt.Sprint(stagedSeqs(s, 2, 7)) != want {
				t.Fatalf("staged %+v, want %s", s, want)
			}
			r.ho.duties = newDutyQueue() // restarted: the catch-up stages again, then reads the ingress
			route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 2, PrevNode: "n9",
				Step: kvbinding.StepCatchUp, Ckpt: rev, Revision: 8, Epoch: 7})
			if _, err := r.ho.catchUp(ctx, map[string]kvbinding.Binding{"g": route}); err != nil {
				t.Fatal(err)
			}
			if got := queuedSeqs(t, js, "n1"); fmt.Sprint(got) != want {
				t.Errorf("n1's queue holds %v, want %s", got, want)
			}
			if n := heldOn(t, js, "n1"); n != 0 {
				t.Errorf("n1's held subject still holds %d messages", n)
			}
		})
	}
}

// A lane's publish that the queue stream takes for a duplicate of this
// node's own staged copy (a restart left the catch-up's span short of what
// the drain had staged, and the lane routes the rest) moves that copy onto
// the queue: no consumer reads the held subject (the simulation's seed
// 32443, where 30 and 31 stayed there).
func TestLaneMovesItsOwnStagedCopy(t *testing.T) {
	r, js := testRouter(t, "n0")
	ctx := context.Background()
	route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n0", PrevNode: "n9", FromSeq: 1, Revision: 4})
	staged := nats.NewMsg(HeldSubject("n0", "g", "jms.x"))
	staged.Header.Set(DefaultGroupHeader, "g")
	staged.Header.Set(HeaderIngressSeq, "3")
	staged.Header.Set(jetstream.MsgIDHeader, IngressStream+":3")
	ack, err := js.PublishMsg(ctx, staged)
	if err != nil {
		t.Fatal(err)
	}
	sent := nats.NewMsg(QueueSubject("n0", "jms.x"))
	sent.Header.Set(DefaultGroupHeader, "g")
	sent.Header.Set(HeaderIngressSeq, "3")
	epoch := []string{strconv.FormatUint(route.Epoch, 10)}
	if err := r.out.takeLaneLateCopy(ctx, "g", sent, ack.Sequence, epoch); err != nil {
		t.Fatal(err)
	}
	if got := queuedSeqs(t, js, "n0"); fmt.Sprint(got) != "[3]" {
		t.Errorf("n0's queue holds %v, want [3]", got)
	}
	if n := heldOn(t, js, "n0"); n != 0 {
		t.Errorf("n0's held subject still holds %d messages", n)
	}
}

// A catch-up's ingress read ends when its node's connection is closed
// under it (a crash in the integration tests closes it): nats.go's ordered
// consumer recreates its server consumer at every Fetch, by default
// retrying for ever and without a context, so a read begun on a closed
// connection never returned and neither did the node's Run (CI at
// 8ef7507: a crashed node's catch-up held the test's clean-up for 12 min).
func TestIngressReadEndsWhenTheConnectionCloses(t *testing.T) {
	s := natstest.RunServer(t)
	r, _ := testRouterOn(t, s, "n1")
	nc := s.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	r.js = js
	for i := 0; i < 3; i++ {
		if _, err := js.Publish(context.Background(), "jms.x", []byte("m")); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	read := make(chan int, 16)
	done := make(chan error, 1)
	go func() {
		// Through sequence 99: the read waits for messages that never come.
		done <- r.ho.readIngress(ctx, 1, 100, func(seq uint64, _ jetstream.Msg) { read <- int(seq) })
	}()
	for want := 1; want <= 3; want++ {
		if got := <-read; got != want {
			t.Fatalf("read %d, want %d", got, want)
		}
	}
	nc.Close()
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the ingress read did not end 30 s after its connection closed and its context ended")
	}
}

// A catch-up's read ends early only when the ingress holds nothing more
// of its span: a Fetch that brings nothing may also be a slow or changing
// leader, and the read then goes on (ingressEndsBefore tells them apart).
func TestIngressEndsBefore(t *testing.T) {
	r, js := testRouter(t, "n1")
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		if _, err := js.Publish(ctx, "jms.x", []byte("m")); err != nil {
			t.Fatal(err)
		}
	}
	// The ingress denies deletes: what a span can lack is what was never
	// written, or what its age limit removed from the front.
	for _, c := range []struct {
		next, hi uint64
		want     bool
	}{
		{1, 3, false}, // 1 and 2 are there
		{3, 9, false}, // 3 to 5 are
		{5, 6, false}, // 5 is
		{6, 9, true},  // nothing written from 6 on
	} {
		got, err := r.ho.ingressEndsBefore(ctx, c.next, c.hi)
		if err != nil || got != c.want {
			t.Errorf("ingressEndsBefore(%d, %d) = %v, %v; want %v", c.next, c.hi, got, err, c.want)
		}
	}
}

// TestStagingKeptOverNothingStaged: what a staging learned replaces a
// record that the take-over staged nothing (notStaged, written by another
// step of it meanwhile), and is merged into an earlier staging of the same
// take-over. Merging into the empty record panicked, which ends the
// process (the simulation's seed 40433, once it ran the real shell: a
// drain step retried for the record's older revision found the old queue
// empty, and said so, while the take-over's catch-up step, run beside it,
// staged the group).
func TestStagingKeptOverNothingStaged(t *testing.T) {
	q := newDutyQueue()
	q.notStaged("g", 7)
	learned := &stagedSpan{epoch: 7, from: 3, until: 9, whole: true, copies: map[uint64]stagedCopy{4: {at: 40}},
		routed: map[uint64]uint64{5: 50}, rest: map[uint64]*nats.Msg{}}
	q.mu.Lock()
	kept := q.keepStagedLocked("g", learned)
	q.mu.Unlock()
	if kept != learned || q.stagedOf("g", 7) != learned {
		t.Fatalf("kept %+v, want the staging", kept)
	}
	more := &stagedSpan{epoch: 7, from: 9, until: 12, whole: true, copies: map[uint64]stagedCopy{10: {at: 41}},
		routed: map[uint64]uint64{}, rest: map[uint64]*nats.Msg{11: {}}}
	q.mu.Lock()
	kept = q.keepStagedLocked("g", more)
	q.mu.Unlock()
	if kept != learned || len(kept.copies) != 2 || kept.routed[5] != 50 || kept.rest[11] == nil || kept.until != 12 || !kept.whole {
		t.Fatalf("merged %+v, want the two stagings' copies, routed and rest through 12, whole", kept)
	}
}

// An earlier taker of the group staged part of its catch-up on its held
// subject and stopped (its publishes of 3 never landed); the next taker's
// drain lists its queue. The drain leaves those staged copies to the
// catch-up, which moves each in its turn and routes the gap from the
// ingress: the new node's queue holds 1..5 in order. Moved by the drain,
// they went ahead of 3 and, seeming to say that everything before 5 was
// routed, the catch-up started after 5 and deleted its own staged copy of
// 3: lost (the simulation's seed 16419, once it ran the real shell).
func TestAnEarlierTakersPartialStagingIsCaughtUpInOrder(t *testing.T) {
	r, js := testRouter(t, "n1")
	e := newEvacuation(t, r, js, 5)
	e.drain = record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, PrevNode: "n9",
		Step: kvbinding.StepDrain, Drain: []string{"n3", "n9"}, Revision: 9})
	for _, seq := range []uint64{1, 2, 4, 5} {
		m := nats.NewMsg(HeldSubject("n3", "g", "jms.x"))
		m.Header.Set(DefaultGroupHeader, "g")
		m.Header.Set(HeaderIngressSeq, strconv.FormatUint(seq, 10))
		m.Header.Set(jetstream.MsgIDHeader, IngressStream+":"+strconv.FormatUint(seq, 10))
		m.Header.Set(headerStaged, "n3")
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	if s := e.stage(); s == nil || len(s.copies) != 1 || len(s.routed) != 0 || s.whole {
		t.Fatalf("staged %+v, want a copy of 3 alone, nothing routed by the old node, not whole", s)
	}
	e.drainQueues()
	if got := queuedSeqs(t, js, "n1"); len(got) != 0 {
		t.Fatalf("the drain moved %v, want nothing (the staged copies are the catch-up's)", got)
	}
	route := record(t, r, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 1, PrevNode: "n9",
		Step: kvbinding.StepCatchUp, Revision: 10, Epoch: 9})
	if _, err := r.ho.catchUp(context.Background(), map[string]kvbinding.Binding{"g": route}); err != nil {
		t.Fatal(err)
	}
	if got := queuedSeqs(t, js, "n1"); fmt.Sprint(got) != "[1 2 3 4 5]" {
		t.Fatalf("n1's queue holds %v, want [1 2 3 4 5]", got)
	}
	for _, node := range []string{"n1", "n3"} {
		if n := heldOn(t, js, node); n != 0 {
			t.Errorf("%s's held subject still holds %d messages", node, n)
		}
	}
}
