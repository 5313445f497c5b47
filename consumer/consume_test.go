package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/wire"
)

const node = "n1"

// queue is a node's queue as a router sets it up, without a router: the
// tests publish queued messages themselves.
type queue struct {
	t      testing.TB
	nc     *nats.Conn
	js     jetstream.JetStream
	pinned bool
	url    string
}

// newQueue starts a server and creates the queue stream and node's
// consumer as router.ensureQueueConsumer does.
func newQueue(t testing.TB, pinned bool, ackWait time.Duration) *queue {
	t.Helper()
	return newQueueTTL(t, pinned, ackWait, 2*time.Minute)
}

// newQueueTTL is newQueue with the pinned TTL.
func newQueueTTL(t testing.TB, pinned bool, ackWait, pinnedTTL time.Duration) *queue {
	t.Helper()
	s := natstest.RunServer(t)
	nc := s.Connect()
	url := s.URL()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: wire.QueueStream, Subjects: []string{wire.QueueSubjectPrefix + ">"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.ConsumerConfig{
		Durable: wire.QueueConsumer(node), FilterSubject: wire.QueueFilter(node),
		AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000, AckWait: ackWait,
	}
	if pinned {
		cfg.PriorityGroups = []string{wire.PriorityGroup}
		cfg.PriorityPolicy = jetstream.PriorityPolicyPinned
		cfg.PinnedTTL = pinnedTTL
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, wire.QueueStream, cfg); err != nil {
		t.Fatal(err)
	}
	return &queue{t: t, nc: nc, js: js, pinned: pinned, url: url}
}

// put queues a message of group with ingress seq and epoch.
func (q *queue) put(group string, seq, epoch uint64) {
	q.t.Helper()
	m := nats.NewMsg(wire.QueueSubject(node, "orders.x"))
	m.Header.Set("Group-Id", group)
	m.Header.Set(wire.HeaderIngressSeq, strconv.FormatUint(seq, 10))
	m.Header.Set(wire.HeaderEpoch, strconv.FormatUint(epoch, 10))
	m.Data = []byte(group + ":" + strconv.FormatUint(seq, 10))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := q.js.PublishMsg(ctx, m); err != nil {
		q.t.Fatal(err)
	}
}

// left returns how many messages the queue still holds.
func (q *queue) left() uint64 {
	q.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := q.js.Stream(ctx, wire.QueueStream)
	if err != nil {
		q.t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		q.t.Fatal(err)
	}
	return info.State.Msgs
}

// running is a Consume call in the background.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

func start(t testing.TB, q *queue, h consumer.Handler, opts ...consumer.Option) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- consumer.Consume(ctx, q.js, node, h, opts...) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Consume and returns its error.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("Consume did not return within 60s of its cancel")
		return nil
	}
}

// record keeps what handlers saw, per group.
type record struct {
	mu                    sync.Mutex
	seqs                  map[string][]uint64
	redeliv               map[uint64]bool
	busy                  map[string]bool
	overlap               int
	n                     int
	inFlight, maxInFlight int
}

func newRecord() *record {
	return &record{seqs: map[string][]uint64{}, busy: map[string]bool{}, redeliv: map[uint64]bool{}}
}

func (r *record) begin(m *consumer.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.busy[m.Group] {
		r.overlap++
	}
	r.busy[m.Group] = true
	r.inFlight++
	r.maxInFlight = max(r.maxInFlight, r.inFlight)
}

func (r *record) end(m *consumer.Message, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.busy[m.Group] = false
	r.inFlight--
	if ok {
		r.seqs[m.Group] = append(r.seqs[m.Group], m.IngressSeq)
		r.n++
		if m.Redelivered {
			r.redeliv[m.IngressSeq] = true
		}
	}
}

func (r *record) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func (r *record) of(group string) []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seqs[group])
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	natstest.Eventually(t, 30*time.Second, func() error {
		if !cond() {
			return errors.New(what)
		}
		return nil
	})
}

// TestOrderPerGroupWithConcurrency: 20 groups of 30 messages, interleaved,
// 8 handlers: every group in ingress order, never two of a group at once,
// and groups in parallel. In both queue modes.
func TestOrderPerGroupWithConcurrency(t *testing.T) {
	for _, pinned := range []bool{true, false} {
		t.Run(fmt.Sprintf("pinned=%v", pinned), func(t *testing.T) {
			q := newQueue(t, pinned, 30*time.Second)
			const groups, per = 20, 30
			var seq uint64
			want := map[string][]uint64{}
			for range per {
				for g := range groups {
					seq++
					name := "g" + strconv.Itoa(g)
					q.put(name, seq, 1)
					want[name] = append(want[name], seq)
				}
			}
			rec := newRecord()
			r := start(t, q, func(ctx context.Context, m *consumer.Message) error {
				rec.begin(m)
				time.Sleep(time.Millisecond) // lets handlers overlap
				rec.end(m, true)
				return nil
			}, consumer.WithConcurrency(8))
			waitFor(t, "all processed", func() bool { return rec.count() == groups*per })
			if err := r.stop(t); err != nil {
				t.Fatalf("Consume: %v", err)
			}
			for g, w := range want {
				if got := rec.of(g); !slices.Equal(got, w) {
					t.Errorf("group %s: processed %v, want %v", g, got, w)
				}
			}
			if rec.overlap != 0 {
				t.Errorf("%d times a group's handler started while another of it ran", rec.overlap)
			}
			if rec.maxInFlight < 2 {
				t.Errorf("at most %d handlers at once: groups did not run in parallel", rec.maxInFlight)
			}
			if n := q.left(); n != 0 {
				t.Errorf("%d messages left on the queue: not all acked", n)
			}
			if pinned {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				c, err := q.js.Consumer(ctx, wire.QueueStream, wire.QueueConsumer(node))
				if err != nil {
					t.Fatal(err)
				}
				for _, pg := range c.CachedInfo().PriorityGroups {
					if pg.PinnedClientID != "" {
						t.Errorf("still pinned to %s after Consume stopped", pg.PinnedClientID)
					}
				}
			}
		})
	}
}

// TestRedeliveryHeldInOrder: another consumer process took message 1 of a
// group and died without acking it; Consume gets 2 and 3 first, holds
// them until 1 comes back after the ack wait, and runs 1, 2, 3.
func TestRedeliveryHeldInOrder(t *testing.T) {
	q := newQueue(t, false, time.Second)
	q.put("g", 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := q.js.Consumer(ctx, wire.QueueStream, wire.QueueConsumer(node))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(1) // the process that dies holding message 1
	if err != nil {
		t.Fatal(err)
	}
	for range batch.Messages() {
	}
	q.put("g", 2, 1)
	q.put("g", 3, 1)
	q.put("other", 4, 1)

	reg := prometheus.NewRegistry()
	rec := newRecord()
	r := start(t, q, func(ctx context.Context, m *consumer.Message) error {
		rec.begin(m)
		rec.end(m, true)
		return nil
	}, consumer.WithConcurrency(4), consumer.WithRegisterer(reg))
	waitFor(t, "all processed", func() bool { return rec.count() == 4 })
	if err := r.stop(t); err != nil {
		t.Fatalf("Consume: %v", err)
	}
	if got := rec.of("g"); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Errorf("group g processed %v, want [1 2 3]", got)
	}
	if !rec.redeliv[1] {
		t.Error("message 1 was not flagged as redelivered")
	}
	if n := q.left(); n != 0 {
		t.Errorf("%d messages left on the queue", n)
	}
}

// TestRedeliveryWhileHeld: a message held behind a slow one outlives the
// ack wait; Consume keeps it with InProgress, so it is processed once.
func TestRedeliveryWhileHeld(t *testing.T) {
	q := newQueue(t, true, 2*time.Second)
	release := make(chan struct{})
	var calls atomic.Int32
	rec := newRecord()
	r := start(t, q, func(ctx context.Context, m *consumer.Message) error {
		calls.Add(1)
		if m.IngressSeq == 1 {
			<-release
		}
		rec.end(m, true)
		return nil
	}, consumer.WithConcurrency(2))
	q.put("g", 1, 1)
	q.put("g", 2, 1)
	waitFor(t, "message 1 running", func() bool { return calls.Load() == 1 })
	time.Sleep(5 * time.Second) // the fault: 2.5 ack waits
	close(release)
	waitFor(t, "both processed", func() bool { return rec.count() == 2 })
	if err := r.stop(t); err != nil {
		t.Fatalf("Consume: %v", err)
	}
	if got := rec.of("g"); !slices.Equal(got, []uint64{1, 2}) {
		t.Errorf("group g processed %v, want [1 2]", got)
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("handler called %d times, want 2", n)
	}
	if len(rec.redeliv) != 0 {
		t.Errorf("messages %v were redelivered: InProgress did not keep them", rec.redeliv)
	}
}

// TestRetryThenParkInOrder: message 2 of group "bad" always fails. It is
// tried MaxAttempts times, then it and every later message of its group,
// also one queued after the parking, go to the parked stream in order;
// the other groups are all processed meanwhile.
func TestRetryThenParkInOrder(t *testing.T) {
	q := newQueue(t, true, 30*time.Second)
	var seq uint64
	var badSeqs []uint64
	for i := range 5 {
		for _, g := range []string{"bad", "a", "b"} {
			seq++
			q.put(g, seq, 3)
			if g == "bad" && i >= 1 {
				badSeqs = append(badSeqs, seq)
			}
		}
	}
	poison := badSeqs[0]
	var attempts atomic.Int32
	reg := prometheus.NewRegistry()
	rec := newRecord()
	r := start(t, q, func(ctx context.Context, m *consumer.Message) error {
		if m.IngressSeq == poison {
			attempts.Add(1)
			return errors.New("cannot apply")
		}
		rec.end(m, true)
		return nil
	}, consumer.WithConcurrency(4), consumer.WithMaxAttempts(3),
		consumer.WithBackoff(10*time.Millisecond, 50*time.Millisecond), consumer.WithRegisterer(reg))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var kv jetstream.KeyValue
	waitFor(t, "group recorded as parked", func() bool {
		var err error
		if kv, err = q.js.KeyValue(ctx, consumer.ParkedBucket); err != nil {
			return false
		}
		_, err = kv.Get(ctx, "r.bad")
		return err == nil
	})
	waitFor(t, "the parked group's messages acked", func() bool { return q.left() == 0 })
	seq++
	q.put("bad", seq, 3) // arrives after the parking: follows
	badSeqs = append(badSeqs, seq)
	waitFor(t, "the late message parked", func() bool { return q.left() == 0 && parkedCount(t, q) == len(badSeqs) })
	if got := testutil.ToFloat64(counterNamed(t, reg, "grouprouter_consumer_retries_total")); got != 2 {
		t.Errorf("retries_total = %v, want 2", got)
	}
	if got := testutil.ToFloat64(gaugeNamed(t, reg, "grouprouter_consumer_parked_groups")); got != 1 {
		t.Errorf("parked_groups = %v, want 1", got)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Consume: %v", err)
	}

	if n := attempts.Load(); n != 3 {
		t.Errorf("poison message tried %d times, want 3", n)
	}
	for _, g := range []string{"a", "b"} {
		if got := rec.of(g); len(got) != 5 {
			t.Errorf("group %s: %d of 5 processed", g, len(got))
		}
	}
	if got := rec.of("bad"); len(got) != 1 {
		t.Errorf("group bad: processed %v, want only its first message", got)
	}
	var parked []uint64
	cons, err := q.js.OrderedConsumer(ctx, consumer.ParkedStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for len(parked) < len(badSeqs) {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("parked stream: %v after %v", err, parked)
		}
		s, _ := strconv.ParseUint(m.Headers().Get(wire.HeaderIngressSeq), 10, 64)
		parked = append(parked, s)
		if m.Headers().Get(consumer.HeaderParkReason) != "cannot apply" {
			t.Errorf("parked message %d has reason %q", s, m.Headers().Get(consumer.HeaderParkReason))
		}
		if want := wire.QueueSubject(node, "orders.x"); m.Subject() != consumer.ParkedSubjectPrefix+node+".r.bad.orders.x" {
			t.Errorf("parked on %s (queued on %s)", m.Subject(), want)
		}
	}
	if !slices.Equal(parked, badSeqs) {
		t.Errorf("parked %v, want %v in order", parked, badSeqs)
	}
}

func parkedCount(t testing.TB, q *queue) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := q.js.Stream(ctx, consumer.ParkedStream)
	if err != nil {
		return -1
	}
	info, err := s.Info(ctx)
	if err != nil {
		return -1
	}
	return int(info.State.Msgs)
}

// counterNamed returns the value of the metric name in reg as a collector.
func counterNamed(t testing.TB, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			v := mf.GetMetric()[0].GetCounter().GetValue()
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
			g.Set(v)
			return g
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// TestStaleEpochDropped: while message 9 (epoch 5) of a group runs and 10,
// 11 (epoch 5) are held, message 12 of epoch 8 arrives: the group moved.
// 9's handler context ends with ErrStale, 10 and 11 are never processed,
// a later copy of epoch 5 is dropped too, and 12 is processed.
func TestStaleEpochDropped(t *testing.T) {
	q := newQueue(t, true, 30*time.Second)
	reg := prometheus.NewRegistry()
	rec := newRecord()
	var cause atomic.Value
	r := start(t, q, func(ctx context.Context, m *consumer.Message) error {
		if m.IngressSeq == 9 {
			<-ctx.Done()
			cause.Store(context.Cause(ctx))
			return ctx.Err()
		}
		rec.end(m, true)
		return nil
	}, consumer.WithConcurrency(2), consumer.WithRegisterer(reg))
	q.put("g", 9, 5)
	q.put("g", 10, 5)
	q.put("g", 11, 5)
	waitFor(t, "10 and 11 held", func() bool {
		// Consume registers its metrics once it runs: until then, none.
		mfs, err := reg.Gather()
		return err == nil && slices.ContainsFunc(mfs, func(mf *dto.MetricFamily) bool {
			return mf.GetName() == "grouprouter_consumer_held" && mf.GetMetric()[0].GetGauge().GetValue() == 2
		})
	})
	q.put("g", 12, 8)
	q.put("g", 13, 5) // a copy from before the move
	q.put("g", 14, 8)
	waitFor(t, "12 and 14 processed", func() bool { return rec.count() == 2 })
	waitFor(t, "queue empty", func() bool { return q.left() == 0 })
	staleDropped := testutil.ToFloat64(counterNamed(t, reg, "grouprouter_consumer_stale_dropped_total"))
	if err := r.stop(t); err != nil {
		t.Fatalf("Consume: %v", err)
	}
	if got := rec.of("g"); !slices.Equal(got, []uint64{12, 14}) {
		t.Errorf("processed %v, want [12 14]", got)
	}
	if c, _ := cause.Load().(error); !errors.Is(c, consumer.ErrStale) {
		t.Errorf("running handler's context cause = %v, want ErrStale", c)
	}
	if staleDropped != 4 {
		t.Errorf("stale_dropped_total = %v, want 4 (9, 10, 11, 13)", staleDropped)
	}
}

// TestMovedAfterDeliveryIsRedelivered: a copy a move made of a message
// the old node's consumer had been delivered (wire.HeaderDeliveredBefore)
// reaches the handler flagged Redelivered, though this queue delivers it
// for the first time; its neighbours are not flagged.
func TestMovedAfterDeliveryIsRedelivered(t *testing.T) {
	q := newQueue(t, true, 30*time.Second)
	rec := newRecord()
	start(t, q, func(ctx context.Context, m *consumer.Message) error {
		rec.end(m, true)
		return nil
	})
	q.put("g", 1, 5)
	m := nats.NewMsg(wire.QueueSubject(node, "orders.x"))
	m.Header.Set("Group-Id", "g")
	m.Header.Set(wire.HeaderIngressSeq, "2")
	m.Header.Set(wire.HeaderEpoch, "5")
	m.Header.Set(wire.HeaderDeliveredBefore, "n9")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := q.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	q.put("g", 3, 5)
	waitFor(t, "three processed", func() bool { return rec.count() == 3 })
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !rec.redeliv[2] || rec.redeliv[1] || rec.redeliv[3] {
		t.Errorf("flagged Redelivered: %v, want only 2", rec.redeliv)
	}
}

func gaugeNamed(t testing.TB, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
			g.Set(mf.GetMetric()[0].GetGauge().GetValue())
			return g
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// TestStopDrainsWithinBound: on cancel, a running handler finishes and is
// acked, held messages are handed back; a handler that does not return
// is cancelled at the bound and Consume says so.
func TestStopDrainsWithinBound(t *testing.T) {
	t.Run("finishes", func(t *testing.T) {
		q := newQueue(t, true, 30*time.Second)
		started := make(chan struct{}, 1)
		finish := make(chan struct{})
		rec := newRecord()
		r := start(t, q, func(ctx context.Context, m *consumer.Message) error {
			if m.IngressSeq == 1 {
				started <- struct{}{}
				<-finish
			}
			rec.end(m, true)
			return nil
		}, consumer.WithConcurrency(1), consumer.WithDrainTimeout(20*time.Second))
		q.put("g", 1, 1)
		q.put("g", 2, 1)
		<-started
		r.cancel()
		time.AfterFunc(200*time.Millisecond, func() { close(finish) })
		if err := r.stop(t); err != nil {
			t.Fatalf("Consume: %v", err)
		}
		if got := rec.of("g"); !slices.Equal(got, []uint64{1}) {
			t.Errorf("processed %v, want [1] (2 handed back)", got)
		}
		if n := q.left(); n != 1 {
			t.Errorf("%d messages left, want 1 (message 2)", n)
		}
	})
	t.Run("bound", func(t *testing.T) {
		q := newQueue(t, false, 30*time.Second)
		started := make(chan struct{}, 1)
		var cause atomic.Value
		r := start(t, q, func(ctx context.Context, m *consumer.Message) error {
			started <- struct{}{}
			<-ctx.Done()
			cause.Store(context.Cause(ctx))
			return ctx.Err()
		}, consumer.WithDrainTimeout(100*time.Millisecond))
		q.put("g", 1, 1)
		<-started
		if err := r.stop(t); !errors.Is(err, consumer.ErrDrainTimeout) {
			t.Fatalf("Consume returned %v, want ErrDrainTimeout", err)
		}
		if c, _ := cause.Load().(error); !errors.Is(c, consumer.ErrDrainTimeout) {
			t.Errorf("handler context cause %v, want ErrDrainTimeout", c)
		}
		if n := q.left(); n != 1 {
			t.Errorf("%d messages left, want 1: an interrupted message is not acked", n)
		}
	})
}

// TestNoQueue: a node whose router never ran has no queue consumer:
// Consume waits for it until its context ends, and returns nil.
func TestNoQueue(t *testing.T) {
	q := newQueue(t, true, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	err := consumer.Consume(ctx, q.js, "n2", func(context.Context, *consumer.Message) error { return nil })
	if err != nil || ctx.Err() == nil {
		t.Fatalf("Consume of a node without a queue: %v before its context ended, want nil once it did", err)
	}
	if err := consumer.Consume(context.Background(), q.js, node, nil); !errors.Is(err, consumer.ErrConfig) {
		t.Fatalf("nil handler: %v, want ErrConfig", err)
	}
}

// TestPinTakeoverHeldInOrder: Consume waits as the standby of a pinned
// process; that process is given message 2 of a group and dies without
// acking it. Consume, pinned after the TTL, gets 3 and 4 at once and 2
// after the ack wait, and runs 2, 3, 4.
func TestPinTakeoverHeldInOrder(t *testing.T) {
	q := newQueueTTL(t, true, 3*time.Second, time.Second)
	other := natstest.Connect(t, q.url, nats.Name("pinned-other"))
	ojs, err := jetstream.New(other)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	oc, err := ojs.Consumer(ctx, wire.QueueStream, wire.QueueConsumer(node))
	if err != nil {
		t.Fatal(err)
	}
	var otherGot atomic.Int32
	cc, err := oc.Consume(func(m jetstream.Msg) {
		if m.Headers().Get("Group-Id") == "warm" {
			_ = m.Ack()
		}
		otherGot.Add(1) // message 2 of g: held, never acked
	}, jetstream.PullPriorityGroup(wire.PriorityGroup))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	q.put("warm", 1, 1)
	waitFor(t, "the other process pinned", func() bool { return otherGot.Load() == 1 })

	rec := newRecord()
	r := start(t, q, func(ctx context.Context, m *consumer.Message) error {
		rec.end(m, true)
		return nil
	}, consumer.WithConcurrency(4))
	waitFor(t, "Consume waiting as a standby", func() bool {
		info, err := oc.Info(ctx)
		return err == nil && info.NumWaiting >= 2
	})
	q.put("g", 2, 1)
	waitFor(t, "the other process given message 2", func() bool { return otherGot.Load() == 2 })
	other.Close() // it dies holding 2
	q.put("g", 3, 1)
	q.put("g", 4, 1)
	waitFor(t, "2, 3, 4 processed", func() bool { return rec.count() == 3 })
	if err := r.stop(t); err != nil {
		t.Fatalf("Consume: %v", err)
	}
	if got := rec.of("g"); !slices.Equal(got, []uint64{2, 3, 4}) {
		t.Errorf("group g processed %v, want [2 3 4]", got)
	}
	if !rec.redeliv[2] {
		t.Error("message 2 not flagged as redelivered")
	}
}

// TestMalformedAndUngrouped: bytes from the bus are input. A message
// without a valid ingress sequence is parked with its reason, one without
// a group is processed with Group "", one with bad epoch is processed
// unfenced; nothing stalls.
func TestMalformedAndUngrouped(t *testing.T) {
	q := newQueue(t, true, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw := func(hdr map[string]string) {
		m := nats.NewMsg(wire.QueueSubject(node, "raw"))
		for k, v := range hdr {
			m.Header.Set(k, v)
		}
		if _, err := q.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	raw(nil)
	raw(map[string]string{"Group-Id": "g", wire.HeaderIngressSeq: "x12"})
	raw(map[string]string{wire.HeaderIngressSeq: "5"})
	raw(map[string]string{"group-id": "h", wire.HeaderIngressSeq: "6", wire.HeaderEpoch: "-1"})
	rec := newRecord()
	r := start(t, q, func(ctx context.Context, m *consumer.Message) error {
		rec.end(m, true)
		return nil
	})
	waitFor(t, "two processed, two parked", func() bool { return rec.count() == 2 && parkedCount(t, q) == 2 && q.left() == 0 })
	if err := r.stop(t); err != nil {
		t.Fatalf("Consume: %v", err)
	}
	if got := rec.of(""); !slices.Equal(got, []uint64{5}) {
		t.Errorf("ungrouped processed %v, want [5]", got)
	}
	if got := rec.of("h"); !slices.Equal(got, []uint64{6}) {
		t.Errorf("group h (lower-case header, bad epoch) processed %v, want [6]", got)
	}
}

// TestConsumerDeleted: the queue consumer deleted under a running Consume
// ends it with ErrNoQueue instead of a silent stall.
func TestConsumerDeleted(t *testing.T) {
	q := newQueue(t, false, 30*time.Second)
	rec := newRecord()
	r := start(t, q, func(ctx context.Context, m *consumer.Message) error {
		rec.end(m, true)
		return nil
	})
	q.put("g", 1, 1)
	waitFor(t, "processed", func() bool { return rec.count() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := q.js.DeleteConsumer(ctx, wire.QueueStream, wire.QueueConsumer(node)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.done:
		close(r.done)
		if !errors.Is(err, consumer.ErrNoQueue) {
			t.Fatalf("Consume returned %v, want ErrNoQueue", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Consume still running 30s after its consumer was deleted")
	}
}

// TestNoGoroutineOutlivesConsume: once Consume returned, the goroutines it
// started (workers, ticker, watch, acks, backoff timers) are gone.
func TestNoGoroutineOutlivesConsume(t *testing.T) {
	q := newQueue(t, true, 30*time.Second)
	q.put("warm", 1, 1)
	q.put("bad", 2, 1)
	q.put("g", 3, 1)
	rec := newRecord()
	r := start(t, q, func(ctx context.Context, m *consumer.Message) error {
		if m.Group == "bad" {
			return errors.New("always")
		}
		rec.end(m, true)
		return nil
	}, consumer.WithConcurrency(8), consumer.WithMaxAttempts(3), consumer.WithBackoff(time.Millisecond, time.Minute))
	waitFor(t, "processed and parked", func() bool { return rec.count() == 2 && q.left() == 0 })
	if err := r.stop(t); err != nil {
		t.Fatalf("Consume: %v", err)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		if left := packageGoroutines(); len(left) > 0 {
			return fmt.Errorf("%d goroutines of package consumer left:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		return nil
	})
}

// packageGoroutines returns the stacks of the goroutines running code of
// package consumer (not its tests).
func packageGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "github.com/grouprouter/grouprouter/consumer.") && !strings.Contains(g, "consumer_test.") {
			out = append(out, g)
		}
	}
	return out
}

// TestUnconfirmedAcks: with WithUnconfirmedAcks every handled message is
// still acked (the queue empties) and each group's order holds.
func TestUnconfirmedAcks(t *testing.T) {
	q := newQueue(t, true, 30*time.Second)
	for i := range 20 {
		q.put([]string{"a", "b"}[i%2], uint64(i+1), 1)
	}
	rec := newRecord()
	r := start(t, q, func(_ context.Context, m *consumer.Message) error {
		rec.end(m, true)
		return nil
	}, consumer.WithConcurrency(4), consumer.WithUnconfirmedAcks())
	waitFor(t, "all handled and acked", func() bool { return rec.count() == 20 && q.left() == 0 })
	if err := r.stop(t); err != nil {
		t.Fatalf("Consume: %v", err)
	}
	for _, g := range []string{"a", "b"} {
		got := rec.of(g)
		if !slices.IsSorted(got) || len(got) != 10 {
			t.Errorf("group %s handled %v", g, got)
		}
	}
}

// TestStopGivesBackWhatItPulled: messages pulled and not processed when
// Consume stops are handed back at once (not left to their ack wait), so
// that the queue shows none of them unacknowledged afterwards (issue 31:
// consume --count 120 left 61 unacked until they were redelivered).
func TestStopGivesBackWhatItPulled(t *testing.T) {
	q := newQueue(t, true, time.Minute)
	for i := range 100 {
		q.put("g"+strconv.Itoa(i%10), uint64(i+1), 1)
	}
	var mu sync.Mutex
	processed := 0
	var r *running
	r = start(t, q, func(ctx context.Context, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if processed++; processed == 3 {
			r.cancel()
		}
		return nil
	}, consumer.WithConcurrency(1), consumer.WithPullBatch(100))
	if err := r.stop(t); err != nil {
		t.Fatalf("Consume: %v", err)
	}
	cons, err := q.js.Consumer(context.Background(), wire.QueueStream, wire.QueueConsumer(node))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "no message left unacknowledged", func() bool {
		info, err := cons.Info(context.Background())
		return err == nil && info.NumAckPending == 0
	})
}
