package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// The hand-over world runs the real hand-over shell (handOver: its loop,
// its steps, its reports and retries) on in-memory stand-ins of what it
// is given (msgStore, queueIO, the binding cache, the handler), inside a
// testing/synctest bubble: its pauses, timers and retries run on the
// bubble's virtual clock, so a seed's whole take-over, faults and all,
// takes milliseconds. The simulation runs the same shell among its other
// faults (sim_shell_test.go); this world fails its calls after their
// effect too, and loses the queue stream's duplicate window in half its
// seeds.
//
// One seed: node n9 routed the first k of n ingress messages, of one to
// three groups, onto its queue, whose consumer processes them meanwhile;
// the handler (played by propose) pauses n9's queue and hands the groups
// to n1 at once, as an evacuation does (a drain, then a catch-up, each). Every stand-in call fails now and then, before
// or after it took effect (a lost reply). Checked: every ingress message
// is processed by n9's consumer or stored on n1's queue, never both and
// never twice, and n1's queue holds each group's in ingress order.

// hoWorld is the streams and consumers the hand-over works on.
type hoWorld struct {
	mu    sync.Mutex
	rnd   *rand.Rand
	pFail float64
	fails int

	ingress []*nats.Msg // ingress sequence i+1
	queue   []*hoEntry  // queue stream sequence i+1
	ids     map[string]uint64
	cons    map[string]*hoConsumer
}

type hoEntry struct {
	msg     *jetstream.RawStreamMsg
	deleted bool
}

// hoConsumer is a node's queue consumer (a work queue's: an ack deletes).
type hoConsumer struct {
	node        string
	cursor      uint64 // the stream sequence looked at last
	delivered   uint64
	ackFloor    uint64
	pending     map[uint64]bool
	pausedUntil time.Time
	processed   []uint64 // ingress sequences, in the order processed
}

var errInjected = errors.New("injected failure")

func cloneHeader(h nats.Header) nats.Header {
	out := make(nats.Header, len(h))
	for k, v := range h {
		out[k] = slices.Clone(v)
	}
	return out
}

// fail reports whether the call about to be made fails (w.mu held).
func (w *hoWorld) fail() bool {
	if w.rnd.Float64() < w.pFail {
		w.fails++
		return true
	}
	return false
}

// enter starts a call: its latency passes, then it takes w.mu (the
// caller unlocks) and draws whether the call fails.
func (w *hoWorld) enter() bool {
	w.hop()
	w.mu.Lock()
	return w.fail()
}

// hop is the latency of one call.
func (w *hoWorld) hop() {
	w.mu.Lock()
	d := time.Duration(w.rnd.IntN(500)+50) * time.Microsecond
	w.mu.Unlock()
	time.Sleep(d)
}

func (w *hoWorld) store(subject string, hdr nats.Header, data []byte) uint64 {
	seq := uint64(len(w.queue) + 1)
	w.queue = append(w.queue, &hoEntry{msg: &jetstream.RawStreamMsg{Subject: subject, Sequence: seq, Header: hdr, Data: data, Time: time.Now()}})
	if id := hdr.Get(jetstream.MsgIDHeader); id != "" {
		w.ids[id] = seq
	}
	return seq
}

// hoQueue is msgStore on the world's queue stream.
type hoQueue struct{ w *hoWorld }

func (q hoQueue) get(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	w := q.w
	failed := w.enter()
	defer w.mu.Unlock()
	if failed {
		return nil, errInjected
	}
	if seq == 0 || seq > uint64(len(w.queue)) || w.queue[seq-1].deleted {
		return nil, jetstream.ErrMsgNotFound
	}
	return w.queue[seq-1].msg, nil
}

func (q hoQueue) next(ctx context.Context, seq uint64, filter string) (*jetstream.RawStreamMsg, error) {
	w := q.w
	failed := w.enter()
	defer w.mu.Unlock()
	if failed {
		return nil, errInjected
	}
	for i := max(seq, 1); i <= uint64(len(w.queue)); i++ {
		if e := w.queue[i-1]; !e.deleted && server.SubjectMatchesFilter(e.msg.Subject, filter) {
			return e.msg, nil
		}
	}
	return nil, jetstream.ErrMsgNotFound
}

func (q hoQueue) state(ctx context.Context, filter string) (jetstream.StreamState, error) {
	w := q.w
	failed := w.enter()
	defer w.mu.Unlock()
	if failed {
		return jetstream.StreamState{}, errInjected
	}
	st := jetstream.StreamState{Subjects: map[string]uint64{}}
	for _, e := range w.queue {
		if e.deleted {
			continue
		}
		if st.FirstSeq == 0 {
			st.FirstSeq = e.msg.Sequence
		}
		st.LastSeq = e.msg.Sequence
		st.Msgs++
		if server.SubjectMatchesFilter(e.msg.Subject, filter) {
			st.Subjects[e.msg.Subject]++
		}
	}
	return st, nil
}

func (q hoQueue) delete(ctx context.Context, seq uint64) error {
	w := q.w
	failed := w.enter()
	defer w.mu.Unlock()
	if failed {
		return errInjected
	}
	if seq == 0 || seq > uint64(len(w.queue)) || w.queue[seq-1].deleted {
		return jetstream.ErrMsgNotFound
	}
	w.queue[seq-1].deleted = true
	if w.fail() {
		return errInjected // done, its reply lost
	}
	return nil
}

// hoIngress is msgStore on the world's ingress, for the side reads.
type hoIngress struct{ w *hoWorld }

func (s hoIngress) get(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	return s.next(ctx, seq, ">")
}

func (s hoIngress) next(ctx context.Context, seq uint64, filter string) (*jetstream.RawStreamMsg, error) {
	w := s.w
	failed := w.enter()
	defer w.mu.Unlock()
	if failed {
		return nil, errInjected
	}
	if seq == 0 || seq > uint64(len(w.ingress)) {
		return nil, jetstream.ErrMsgNotFound
	}
	m := w.ingress[seq-1]
	return &jetstream.RawStreamMsg{Subject: m.Subject, Sequence: seq, Header: m.Header, Data: m.Data}, nil
}

func (s hoIngress) state(context.Context, string) (jetstream.StreamState, error) {
	return jetstream.StreamState{}, errors.New("not used")
}

func (s hoIngress) delete(context.Context, uint64) error { return errors.New("not used") }

// hoReader is the ordered consumer of the ingress a catch-up reads.
type hoReader struct {
	jetstream.Consumer // what is not stood in for: not called
	w                  *hoWorld
	next               uint64
}

func (r *hoReader) Fetch(n int, _ ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	w := r.w
	failed := w.enter()
	defer w.mu.Unlock()
	if failed {
		return nil, errInjected
	}
	b := &hoBatch{ch: make(chan jetstream.Msg, n)}
	for ; n > 0 && r.next <= uint64(len(w.ingress)); n-- {
		m := w.ingress[r.next-1]
		b.ch <- &hoMsg{seq: r.next, msg: &nats.Msg{Subject: m.Subject, Header: cloneHeader(m.Header), Data: m.Data}}
		r.next++
	}
	close(b.ch)
	return b, nil
}

type hoBatch struct{ ch chan jetstream.Msg }

func (b *hoBatch) Messages() <-chan jetstream.Msg { return b.ch }
func (b *hoBatch) Error() error                   { return nil }

type hoMsg struct {
	jetstream.Msg
	seq uint64
	msg *nats.Msg
}

func (m *hoMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: m.seq}}, nil
}
func (m *hoMsg) Data() []byte         { return m.msg.Data }
func (m *hoMsg) Headers() nats.Header { return m.msg.Header }
func (m *hoMsg) Subject() string      { return m.msg.Subject }
func (m *hoMsg) Reply() string        { return "" }

// io returns the hand-over's queueIO on the world.
func (w *hoWorld) io() queueIO {
	return queueIO{
		publish: func(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
			failed := w.enter()
			defer w.mu.Unlock()
			if failed {
				return nil, errInjected
			}
			id := m.Header.Get(jetstream.MsgIDHeader)
			if seq, ok := w.ids[id]; ok && id != "" {
				return &jetstream.PubAck{Stream: QueueStream, Sequence: seq, Duplicate: true}, nil
			}
			seq := w.store(m.Subject, cloneHeader(m.Header), m.Data)
			if w.fail() {
				return nil, errInjected // stored, its ack lost
			}
			return &jetstream.PubAck{Stream: QueueStream, Sequence: seq}, nil
		},
		pause: func(ctx context.Context, node string, until time.Time) error {
			failed := w.enter()
			defer w.mu.Unlock()
			if failed {
				return errInjected
			}
			if c := w.cons[node]; c != nil {
				c.pausedUntil = until
			}
			return nil
		},
		consumer: func(ctx context.Context, node string) (*jetstream.ConsumerInfo, error) {
			failed := w.enter()
			defer w.mu.Unlock()
			if failed {
				return nil, errInjected
			}
			c := w.cons[node]
			if c == nil {
				return nil, jetstream.ErrConsumerNotFound
			}
			now := time.Now()
			left := max(c.pausedUntil.Sub(now), 0)
			return &jetstream.ConsumerInfo{Stream: QueueStream, Name: QueueConsumer(node), TimeStamp: now,
				Delivered: jetstream.SequenceInfo{Stream: c.delivered}, AckFloor: jetstream.SequenceInfo{Stream: c.ackFloor},
				NumAckPending: len(c.pending), Config: jetstream.ConsumerConfig{AckWait: 30 * time.Second},
				Paused: left > 0, PauseRemaining: left}, nil
		},
		ingress: func(ctx context.Context, seq uint64) (jetstream.Consumer, error) {
			failed := w.enter()
			defer w.mu.Unlock()
			if failed {
				return nil, errInjected
			}
			return &hoReader{w: w, next: seq}, nil
		},
		queue: func(context.Context) (msgStore, error) { return hoQueue{w}, nil },
		side:  func(context.Context, string) (msgStore, error) { return hoIngress{w}, nil },
	}
}

// consume runs node's queue consumer until ctx ends: it takes the node's
// next message when not paused, and acks it a little later.
func (w *hoWorld) consume(ctx context.Context, c *hoConsumer) {
	var acks sync.WaitGroup
	defer acks.Wait()
	for ctx.Err() == nil {
		w.mu.Lock()
		wait := time.Duration(w.rnd.IntN(3000)+200) * time.Microsecond
		var e *hoEntry
		if !time.Now().Before(c.pausedUntil) && len(c.pending) == 0 { // one group: in order, one at a time
			for _, q := range w.queue[c.cursor:] {
				c.cursor = q.msg.Sequence
				if !q.deleted && server.SubjectMatchesFilter(q.msg.Subject, QueueFilter(c.node)) {
					e = q
					c.delivered = q.msg.Sequence
					break
				}
			}
		}
		var took time.Duration
		if e != nil {
			c.pending[e.msg.Sequence] = true
			took = time.Duration(w.rnd.IntN(8000)+500) * time.Microsecond
		}
		w.mu.Unlock()
		if e != nil {
			acks.Go(func() {
				time.Sleep(took)
				w.mu.Lock()
				defer w.mu.Unlock()
				delete(c.pending, e.msg.Sequence)
				is, _ := strconv.ParseUint(e.msg.Header.Get(HeaderIngressSeq), 10, 64)
				c.processed = append(c.processed, is)
				e.deleted = true // a work queue's ack
				c.ackFloor = c.delivered
				for seq := range c.pending {
					c.ackFloor = min(c.ackFloor, seq-1)
				}
			})
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// hoRun is one seed of the world; it returns what went wrong.
func hoRun(seed uint64) (problems []string, fails, excused int) {
	rnd := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	w := &hoWorld{rnd: rnd, pFail: []float64{0, 0.003, 0.01, 0.03, 0.1}[rnd.IntN(5)], ids: map[string]uint64{}, cons: map[string]*hoConsumer{}}
	if p, err := strconv.ParseFloat(os.Getenv("GROUPROUTER_HO_FAIL"), 64); err == nil {
		w.pFail = p // every call fails at this rate instead
	}
	groups := []string{"g0", "g1", "g2"}[:rnd.IntN(3)+1]
	n := rnd.IntN(60) + 1
	k := rnd.IntN(n + 1) // routed by n9 before the move
	// The record's FromSeq: k+1 for a fence (n9 routed up to it), lower for
	// an evacuation from n9's checkpoint, lag messages behind.
	lag := rnd.IntN(k + 1)
	from := uint64(k + 1 - lag)
	// A server restart loses the queue stream's duplicate window but for
	// what the stream still stores (nats-server #3272; docs/protocol.md,
	// "Remaining windows").
	loseWindow := rnd.IntN(2) == 0
	lossAt := time.Duration(rnd.IntN(300)) * time.Millisecond
	moveAt := time.Duration(rnd.IntN(20)) * time.Millisecond
	groupOf := make([]string, n+1) // by ingress sequence
	for seq := 1; seq <= n; seq++ {
		groupOf[seq] = groups[rnd.IntN(len(groups))]
		w.ingress = append(w.ingress, &nats.Msg{Subject: "jms.x", Header: nats.Header{DefaultGroupHeader: {groupOf[seq]}}, Data: []byte(strconv.Itoa(seq))})
	}
	for seq := 1; seq <= k; seq++ {
		m := w.ingress[seq-1]
		out := &nats.Msg{Subject: m.Subject, Header: cloneHeader(m.Header), Data: m.Data}
		prepareInPlace(uint64(seq), out)
		w.store(QueueSubject("n9", m.Subject), out.Header, out.Data)
	}
	for _, node := range []string{"n9", "n1"} {
		w.cons[node] = &hoConsumer{node: node, pending: map[uint64]bool{}}
	}
	windowLost := false

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var bg sync.WaitGroup
	defer bg.Wait()
	bg.Go(func() { w.consume(ctx, w.cons["n9"]) })
	if loseWindow {
		bg.Go(func() {
			time.Sleep(lossAt)
			w.mu.Lock()
			defer w.mu.Unlock()
			windowLost = true
			clear(w.ids)
			for _, e := range w.queue {
				if id := e.msg.Header.Get(jetstream.MsgIDHeader); !e.deleted && id != "" {
					w.ids[id] = e.msg.Sequence
				}
			}
		})
	}

	log := slog.New(slog.DiscardHandler)
	if os.Getenv("GROUPROUTER_HO_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cache := kvbinding.NewCache(kvbinding.CacheConfig{})
	settled := make(chan struct{})
	var reports []string
	drained := map[string]int{} // per group, its drain's report's count
	var hmu sync.Mutex
	rev := map[string]uint64{} // per group, its record's revision
	left := len(groups)        // groups not settled yet
	apply := func(g string, b kvbinding.Binding) {
		b.Group, b.Revision, b.Epoch = g, rev[g], 5
		cache.Apply(b)
	}
	h := &handOver{node: "n1", groupHeader: DefaultGroupHeader, log: log, io: w.io(), clock: sysClock{}, duties: newDutyQueue(),
		fencedNow:            func() bool { return false },
		takeoverFrom:         func(string) uint64 { return uint64(n + 1) },
		ungroupedDestination: func() string { return "n1" },
		lookup:               cache.Lookup,
		saveCheckpoint:       func(context.Context) error { return nil },
		lostThrough:          func(context.Context, map[string]kvbinding.Binding) map[string]uint64 { return nil },
		stored:               func(uint64, string) {},
		classify: func(hdr nats.Header, subject string) (string, string) {
			return GroupOf(hdr, DefaultGroupHeader)
		},
		toDeadLetter: func(out *nats.Msg, _ string, _ uint64, reason string, _ bool) *nats.Msg {
			problems = append(problems, "dead-lettered: "+reason)
			return out
		},
	}
	h.warn.late = logagg.New(log, "late", time.Second)
	h.warn.lapsed = logagg.New(log, "lapsed", time.Second)
	defer h.warn.late.Close()
	defer h.warn.lapsed.Close()
	// The handler: it takes a step's report (failing now and then, as a
	// record write can) and writes the next record, whose step it hands.
	h.step = func(in input) {}
	h.propose = func(ctx context.Context, ps []proposals.Proposal) ([]proposals.Decision, error) {
		failed := w.enter()
		w.mu.Unlock()
		hmu.Lock()
		defer hmu.Unlock()
		if failed {
			return nil, errInjected
		}
		ds := make([]proposals.Decision, len(ps))
		for i, p := range ps {
			g := p.Group
			ds[i] = proposals.Decision{Group: g, Outcome: proposals.Refused, Revision: rev[g]}
			if p.Rev != rev[g] {
				continue
			}
			reports = append(reports, fmt.Sprintf("%s %s@%d:%d", g, p.Op, p.Rev, p.Count))
			if p.Op == proposals.OpDrained {
				drained[g] = p.Count
			}
			ds[i].Outcome = proposals.Accepted
			rev[g]++
			ds[i].Revision = rev[g]
			switch p.Op {
			case proposals.OpDrained:
				apply(g, kvbinding.Binding{State: kvbinding.StateBound, Node: "n1", PrevNode: "n9", Step: kvbinding.StepCatchUp, FromSeq: from})
				h.duties.add(g, proposals.DutyCatchUp, rev[g])
			case proposals.OpCaughtUp:
				apply(g, kvbinding.Binding{State: kvbinding.StateBound, Node: "n1", PrevNode: "n9", FromSeq: from})
				if left--; left == 0 {
					close(settled)
				}
			}
		}
		return ds, nil
	}

	// The handler paused n9's queue, then wrote the records handing the
	// groups to n1 (an evacuation's burst).
	time.Sleep(moveAt)
	w.mu.Lock()
	w.cons["n9"].pausedUntil = time.Now().Add(drainPause)
	w.mu.Unlock()
	for _, g := range groups {
		rev[g], drained[g] = 5, -1
		apply(g, kvbinding.Binding{State: kvbinding.StateBound, Node: "n1", PrevNode: "n9", Step: kvbinding.StepDrain, Drain: []string{"n9"}, FromSeq: from})
	}
	runCtx, stopRun := context.WithCancel(ctx)
	// The handler renews the pause while the record says the group is
	// drained from n9 (proposals.Handler keeps the queues of drain
	// records paused).
	bg.Go(func() {
		for {
			select {
			case <-runCtx.Done():
				return
			case <-time.After(drainPause / 3):
			}
			if !slices.ContainsFunc(groups, func(g string) bool { b, _ := cache.Lookup(g); return b.Step == kvbinding.StepDrain }) {
				return
			}
			w.mu.Lock()
			w.cons["n9"].pausedUntil = time.Now().Add(drainPause)
			w.mu.Unlock()
		}
	})
	bg.Go(func() { h.run(runCtx) })
	for _, g := range groups {
		h.duties.add(g, proposals.DutyDrain, rev[g])
	}
	select {
	case <-settled:
	case <-time.After(10 * time.Minute):
		problems = append(problems, fmt.Sprintf("not settled within 10 min (virtual); reports: %v", reports))
	}
	stopRun()
	// n9's consumer goes on after the pause (nothing of the group is
	// left on its queue to process).
	time.Sleep(drainPause + time.Second)
	stop()
	bg.Wait()

	w.mu.Lock()
	defer w.mu.Unlock()
	var onN1 []uint64
	for _, e := range w.queue {
		if !e.deleted && server.SubjectMatchesFilter(e.msg.Subject, QueueFilter("n1")) {
			is, _ := strconv.ParseUint(e.msg.Header.Get(HeaderIngressSeq), 10, 64)
			onN1 = append(onN1, is)
		}
		if !e.deleted && server.SubjectMatchesFilter(e.msg.Subject, QueueFilter("n9")) {
			problems = append(problems, fmt.Sprintf("n9's queue still holds %s", e.msg.Header.Get(HeaderIngressSeq)))
		}
	}
	for _, g := range groups {
		var of []uint64
		for _, is := range onN1 {
			if groupOf[is] == g {
				of = append(of, is)
			}
		}
		if !slices.IsSorted(of) {
			problems = append(problems, fmt.Sprintf("n1's queue holds %s out of ingress order: %v", g, of))
		}
	}
	seen := map[uint64]string{}
	for _, is := range w.cons["n9"].processed {
		if seen[is] != "" {
			problems = append(problems, fmt.Sprintf("message %d processed twice by n9", is))
		}
		seen[is] = "n9"
	}
	excused = 0
	for _, is := range onN1 {
		if seen[is] == "n9" && windowLost && drained[groupOf[is]] == 0 && is >= from && is <= uint64(k) {
			// The drain found nothing of the group on n9's queue (n9 had
			// processed it all): the catch-up routes again from the
			// record's FromSeq, and only the duplicate window, lost, would
			// have dropped what n9 processed. The remaining window
			// docs/protocol.md names; the pinned checkpoint narrows it.
			excused++
			seen[is] = "n1"
			continue
		}
		if seen[is] != "" {
			problems = append(problems, fmt.Sprintf("message %d on n1's queue, and %s", is, map[string]string{"n9": "processed by n9", "n1": "twice"}[seen[is]]))
		}
		seen[is] = "n1"
	}
	for is := uint64(1); is <= uint64(n); is++ {
		if seen[is] == "" {
			problems = append(problems, fmt.Sprintf("message %d lost", is))
		}
	}
	if !slices.IsSorted(w.cons["n9"].processed) {
		problems = append(problems, fmt.Sprintf("n9 processed out of ingress order: %v", w.cons["n9"].processed))
	}
	if len(problems) > 0 {
		problems = append(problems, fmt.Sprintf("(n=%d, k=%d, from=%d, window lost %v, drained %v, pFail=%.2f, %d failures; n9 processed %v; n1 holds %v; reports %v)",
			n, k, from, windowLost, drained, w.pFail, w.fails, w.cons["n9"].processed, onN1, reports))
	}
	return problems, w.fails, excused
}

// TestHandOverWorld runs the real hand-over shell over many seeds of the
// hand-over world (GROUPROUTER_HO_SEEDS, default 1,000; GROUPROUTER_HO_SEED
// runs one, with GROUPROUTER_HO_LOG=1 for the shell's log;
// GROUPROUTER_HO_FAIL sets the rate at which every call fails). A seed fixes
// the world and the virtual clock, not the order in which goroutines
// runnable at the same instant draw their faults: a replay may take
// another path, so replay a failing seed in a loop (go test -c, then run
// the binary until it fails), unlike the simulation's, which replays
// exactly.
func TestHandOverWorld(t *testing.T) {
	first, count := uint64(1), uint64(1000)
	if s := os.Getenv("GROUPROUTER_HO_SEEDS"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		count = v
	}
	if s := os.Getenv("GROUPROUTER_HO_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		first, count = v, 1
	}
	fails, failed, excused := 0, 0, 0
	for seed := first; seed < first+count; seed++ {
		synctest.Test(t, func(t *testing.T) {
			problems, f, e := hoRun(seed)
			fails, excused = fails+f, excused+e
			if len(problems) > 0 {
				failed++
				t.Errorf("seed %d: %v\n  replay: GROUPROUTER_HO_SEED=%d GROUPROUTER_HO_LOG=1 go test -run 'TestHandOverWorld$' -v ./router/", seed, problems, seed)
			}
		})
		if failed >= 5 {
			t.Fatalf("stopping after %d failing seeds", failed)
		}
	}
	t.Logf("%d seeds, %d injected failures; %d messages routed again in the remaining window of a lost duplicate window", count, fails, excused)
}
