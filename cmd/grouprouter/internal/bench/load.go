package bench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// benchAddress is the grouping-handler address; producers publish on
// benchSubject, inside it.
const (
	benchAddress = "jms"
	benchSubject = benchAddress + ".bench"
)

// Payload layout: the producer writes the publish time and the run id at
// the start of the body; the consumer (same host clock) computes latency.
const (
	offTime  = 0  // int64 unix nanoseconds at publish
	offRun   = 8  // uint32 run id
	offFlags = 12 // flagFirst: first message of its group
	minBody  = 13

	flagFirst = 1
)

// run collects what the consumers and the event subscription see during
// one measured run.
type run struct {
	id        uint32
	want      int64
	keepLat   bool
	groupPref string // bind events of groups with this prefix are counted

	count    atomic.Int64
	lastNano atomic.Int64 // when the last counted message was consumed
	done     chan struct{}
	doneOnce sync.Once

	mu       sync.Mutex
	lat      []time.Duration // publish -> consume, every message
	firstLat []time.Duration // publish -> consume, first message of a new group

	binds    atomic.Int64
	lastBind atomic.Int64
}

func newRun(id uint32, want int, keepLat bool, groupPrefix string) *run {
	r := &run{id: id, want: int64(want), keepLat: keepLat, groupPref: groupPrefix, done: make(chan struct{})}
	if keepLat {
		r.lat = make([]time.Duration, 0, want)
	}
	return r
}

func (r *run) observe(now int64, body []byte) {
	if r.keepLat {
		d := time.Duration(now - int64(binary.LittleEndian.Uint64(body[offTime:])))
		r.mu.Lock()
		r.lat = append(r.lat, d)
		if body[offFlags]&flagFirst != 0 {
			r.firstLat = append(r.firstLat, d)
		}
		r.mu.Unlock()
	}
	r.lastNano.Store(now)
	if r.count.Add(1) == r.want {
		r.doneOnce.Do(func() { close(r.done) })
	}
}

// The sink is not package consumer: measured with it (one Consume per
// node, unconfirmed acks), the bench process spent 98 µs of CPU per message
// against 72 µs with this loop, and the relay and the router alike routed a
// quarter less (14.3k and 12.3k msgs/s against 18.6k and 16.1k, 1 server,
// same hour): the bench would measure its sink. Package consumer is
// measured on its own (consumer/bench_test.go).
//
// sink consumes the node queues, as an application would: one consumer
// per node, pulling the node's durable consumer with the priority group,
// acking every message. Consumers live as long as the sink (a pinned
// puller that went away would hold the pin for PinnedTTL), and hand what
// they receive to the current run.
type sink struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	cur atomic.Pointer[run]
	// probe is a run measured beside cur (the flood workload's bound
	// group), or nil.
	probe atomic.Pointer[run]

	mu    sync.Mutex
	nodes map[string]jetstream.ConsumeContext
	stray atomic.Int64 // messages of no current run

	bindSub *nats.Subscription // while a run counts bindings
}

func newSink(nc *nats.Conn) (*sink, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &sink{nc: nc, js: js, nodes: map[string]jetstream.ConsumeContext{}}, nil
}

// countBinds counts bindings as the LOCAL handler announces them, until
// the returned function is called. Only runs that count bindings
// subscribe: an observer of every bind event would otherwise be measured
// as part of the decision service and the KV baselines, which have none.
func (s *sink) countBinds() (func(), error) {
	sub, err := s.nc.Subscribe(proposals.SubjectEventsPrefix+proposals.EventBind, s.onBind)
	if err != nil {
		return nil, err
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := s.nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	s.mu.Lock()
	s.bindSub = sub
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.bindSub == sub {
			s.bindSub = nil
		}
		_ = sub.Unsubscribe()
	}, nil
}

func (s *sink) onBind(m *nats.Msg) {
	r := s.cur.Load()
	if r == nil {
		return
	}
	var ev struct {
		Group string `json:"group"`
	}
	if json.Unmarshal(m.Data, &ev) != nil || !strings.HasPrefix(ev.Group, r.groupPref) {
		return
	}
	r.lastBind.Store(time.Now().UnixNano())
	r.binds.Add(1)
}

// consume starts consuming node's queue if it is not consumed yet. The
// node's durable consumer must exist (a router node creates it).
func (s *sink) consume(ctx context.Context, node string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes[node] != nil {
		return nil
	}
	cons, err := s.js.Consumer(ctx, router.QueueStream, router.QueueConsumer(node))
	if err != nil {
		return fmt.Errorf("bench: queue consumer of %s: %w", node, err)
	}
	cc, err := cons.Consume(s.handle, jetstream.PullPriorityGroup(router.PriorityGroup))
	if err != nil {
		return fmt.Errorf("bench: consume %s: %w", node, err)
	}
	s.nodes[node] = cc
	return nil
}

func (s *sink) handle(m jetstream.Msg) {
	now := time.Now().UnixNano()
	body := m.Data()
	id := uint32(0)
	if len(body) >= minBody {
		id = binary.LittleEndian.Uint32(body[offRun:])
	}
	if r := s.cur.Load(); r != nil && id != 0 && id == r.id {
		r.observe(now, body)
	} else if p := s.probe.Load(); p != nil && id != 0 && id == p.id {
		p.observe(now, body)
	} else {
		s.stray.Add(1)
	}
	_ = m.Ack()
}

// forget stops consuming every queue (their consumers are about to go).
func (s *sink) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cc := range s.nodes {
		cc.Stop()
	}
	s.nodes = map[string]jetstream.ConsumeContext{}
}

func (s *sink) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cc := range s.nodes {
		cc.Stop()
	}
	s.nodes = map[string]jetstream.ConsumeContext{}
	if s.bindSub != nil {
		_ = s.bindSub.Unsubscribe()
		s.bindSub = nil
	}
}

// groupFunc returns the group id of message i and whether it is the first
// message of its group.
type groupFunc func(i int) (group string, first bool)

// producer publishes the load into the ingress as several independent
// producers would: one connection each (spread over the servers), each
// PublishMsgAsync with the Group-Id header and up to 4,000 PubAcks
// outstanding; message i goes out on connection i mod len.
type producer struct {
	js      []jetstream.JetStream
	payload int
	errs    atomic.Int64
}

func newProducer(conns []*nats.Conn, payload int) (*producer, error) {
	p := &producer{payload: max(payload, minBody)}
	for _, nc := range conns {
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) {
			p.errs.Add(1)
		}))
		if err != nil {
			return nil, err
		}
		p.js = append(p.js, js)
	}
	return p, nil
}

// publish sends n messages of run id on subject, at rate messages/s (0: as
// fast as the async windows allow), and returns when it started and once
// every PubAck is in (or after a minute).
func (p *producer) publish(ctx context.Context, subject string, id uint32, n int, rate float64, group groupFunc) (time.Time, error) {
	var interval time.Duration
	if rate > 0 {
		interval = time.Duration(float64(time.Second) / rate)
	}
	start := time.Now()
	errs := make(chan error, len(p.js))
	var wg sync.WaitGroup
	for k, js := range p.js {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- p.send(ctx, js, subject, id, k, len(p.js), n, start, interval, group)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return start, err
		}
	}
	if e := p.errs.Swap(0); e > 0 {
		return start, fmt.Errorf("bench: %d publishes failed", e)
	}
	return start, nil
}

// send publishes messages k, k+step, ... of n on js, message i not before
// start + i*interval, and waits for their PubAcks.
func (p *producer) send(ctx context.Context, js jetstream.JetStream, subject string, id uint32, k, step, n int, start time.Time, interval time.Duration, group groupFunc) error {
	for i := k; i < n; i += step {
		if interval > 0 {
			// Pace in steps of at least a millisecond.
			if ahead := time.Until(start.Add(time.Duration(i) * interval)); ahead > time.Millisecond {
				time.Sleep(ahead)
			}
		}
		g, first := group(i)
		body := make([]byte, p.payload)
		binary.LittleEndian.PutUint32(body[offRun:], id)
		if first {
			body[offFlags] = flagFirst
		}
		msg := &nats.Msg{Subject: subject, Header: nats.Header{router.DefaultGroupHeader: []string{g}}, Data: body}
		for {
			binary.LittleEndian.PutUint64(body[offTime:], uint64(time.Now().UnixNano()))
			_, err := js.PublishMsgAsync(msg)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Stalled: too many PubAcks outstanding. Try again.
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("bench: %d publishes still unacknowledged after a minute", js.PublishAsyncPending())
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitRun waits until r saw everything it wants, failing when nothing new
// arrived for idle.
func waitRun(ctx context.Context, r *run, idle time.Duration, progress func() string) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastCount, lastChange := r.count.Load(), time.Now()
	for {
		select {
		case <-r.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if c := r.count.Load(); c != lastCount {
				lastCount, lastChange = c, time.Now()
			} else if time.Since(lastChange) > idle {
				extra := ""
				if progress != nil {
					extra = "; " + progress()
				}
				return fmt.Errorf("bench: run %d stalled at %d of %d messages for %v%s", r.id, c, r.want, idle, extra)
			}
		}
	}
}

// percentiles of a latency sample.
type percentiles struct {
	N                 int
	P50, P99, P999, M time.Duration // M is the maximum
}

func percentilesOf(ds []time.Duration) percentiles {
	if len(ds) == 0 {
		return percentiles{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration {
		i := int(q*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return percentiles{N: len(s), P50: at(0.50), P99: at(0.99), P999: at(0.999), M: s[len(s)-1]}
}
