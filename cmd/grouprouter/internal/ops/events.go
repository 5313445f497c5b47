package ops

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// eventV is one event as the page lists it.
type eventV struct {
	proposals.Event
}

// rawEvent is an event as read from the stream; it is decoded only when
// listed (a bind storm delivers tens of thousands a second).
type rawEvent struct {
	kind string
	data []byte
}

// ring keeps the last len(buf) events added.
type ring struct {
	buf  []rawEvent
	next int
	n    int
}

func (r *ring) add(e rawEvent) {
	r.buf[r.next] = e
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

// newest returns the events, newest first.
func (r *ring) newest() []rawEvent {
	out := make([]rawEvent, 0, r.n)
	for i := 1; i <= r.n; i++ {
		out = append(out, r.buf[(r.next-i+len(r.buf))%len(r.buf)])
	}
	return out
}

// eventRings are the latest events of every kind and the latest moves
// (kinds move, handoff, unbind: rare, so kept apart from the binds that
// would push them out), and the latest progress of each hand-over step.
// Progress events are not among the latest events: a long takeover
// reports every second, and would push everything else out.
type eventRings struct {
	mu        sync.Mutex
	all       ring
	moves     ring
	steps     []stepProgress // newest first, at most maxSteps
	following bool
	// loaded is closed once the follower has read the events stored when
	// it started (the page waits for it before saying "none"); a new one
	// replaces it when a follower starts after a closed one.
	loaded   chan struct{}
	isLoaded bool
}

// stepProgress is the latest progress event of one step: a node's drain or
// catch-up of one group (or of a batch of groups).
type stepProgress struct {
	key string
	ev  rawEvent
}

// maxSteps bounds the steps listed.
const maxSteps = 32

func newEventRings(n int) eventRings {
	return eventRings{all: ring{buf: make([]rawEvent, n)}, moves: ring{buf: make([]rawEvent, n)}, loaded: make(chan struct{})}
}

// stepKey names the step a progress event reports on; ok is false for an
// event that does not decode.
func stepKey(data []byte) (string, bool) {
	var ev proposals.Event
	if json.Unmarshal(data, &ev) != nil {
		return "", false
	}
	return ev.Node + "\x00" + ev.Step + "\x00" + ev.Group + "\x00" + ev.PrevNode, true
}

// addStep keeps ev as the latest progress of its step.
func (e *eventRings) addStep(key string, ev rawEvent) {
	i := 0
	for i < len(e.steps) && e.steps[i].key != key {
		i++
	}
	if i == len(e.steps) {
		if len(e.steps) < maxSteps {
			e.steps = append(e.steps, stepProgress{})
		}
		i = len(e.steps) - 1 // the oldest goes when full
	}
	copy(e.steps[1:i+1], e.steps[:i])
	e.steps[0] = stepProgress{key: key, ev: ev}
}

// isMove reports whether an event of kind belongs to a move.
func isMove(kind string) bool {
	return kind == proposals.EventMove || kind == proposals.EventHandoff || kind == proposals.EventUnbind
}

func (e *eventRings) add(subject string, data []byte) {
	kind := strings.TrimPrefix(subject, proposals.SubjectEventsPrefix)
	ev := rawEvent{kind: kind, data: data}
	if kind == proposals.EventProgress {
		if key, ok := stepKey(data); ok {
			e.mu.Lock()
			e.addStep(key, ev)
			e.mu.Unlock()
			return
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all.add(ev)
	if isMove(kind) {
		e.moves.add(ev)
	}
}

// start empties the rings as the follower (re)starts reading.
func (e *eventRings) start() {
	e.mu.Lock()
	defer e.mu.Unlock()
	clear(e.all.buf)
	clear(e.moves.buf)
	e.all.next, e.all.n, e.moves.next, e.moves.n = 0, 0, 0, 0
	e.steps = nil
	e.following = true
	if e.isLoaded {
		e.loaded, e.isLoaded = make(chan struct{}), false
	}
}

// markLoaded records that the events stored when the follower started
// have been read.
func (e *eventRings) markLoaded() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.isLoaded {
		close(e.loaded)
		e.isLoaded = true
	}
}

// loadedChan is closed once the current (or next) follower has read what
// was stored when it started.
func (e *eventRings) loadedChan() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.loaded
}

func (e *eventRings) stop() {
	e.mu.Lock()
	e.following = false
	e.mu.Unlock()
}

// latest returns the events, moves and steps kept, newest first, decoded,
// and whether the follower runs and has read what was stored when it
// started.
func (e *eventRings) latest() (all, moves, steps []eventV, following, loaded bool) {
	e.mu.Lock()
	rawAll, rawMoves, following, loaded := e.all.newest(), e.moves.newest(), e.following, e.isLoaded
	rawSteps := make([]rawEvent, len(e.steps))
	for i, st := range e.steps {
		rawSteps[i] = st.ev
	}
	e.mu.Unlock()
	return decodeEvents(rawAll), decodeEvents(rawMoves), decodeEvents(rawSteps), following, loaded && following
}

func decodeEvents(raw []rawEvent) []eventV {
	out := make([]eventV, 0, len(raw))
	for _, r := range raw {
		var ev proposals.Event
		if err := json.Unmarshal(r.data, &ev); err != nil {
			ev = proposals.Event{Kind: r.kind, Reason: "undecodable event: " + err.Error()}
		}
		out = append(out, eventV{ev})
	}
	return out
}

// history is how many stored events the follower reads back when it
// starts: enough to find the latest moves among the binds.
func (s *Server) history() uint64 { return uint64(max(1000, 10*s.cfg.Events)) }

// Run samples the node's status for the page's charts every HistoryEvery
// and follows the events stream for the page while status requests come
// (see the package doc), until ctx ends; then it returns nil. Without
// Config.Conn it only samples.
func (s *Server) Run(ctx context.Context) error {
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		s.sampleHistory(sctx)
	}()
	defer func() {
		stopSampling()
		<-sampled
	}()
	if s.cfg.Conn == nil {
		<-ctx.Done()
		return nil
	}
	js, err := jetstream.New(s.cfg.Conn)
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.wanted:
		}
		if time.Since(time.Unix(0, s.lastWanted.Load())) > s.cfg.Idle {
			continue // a request from before the follower's last idle stop
		}
		s.follow(ctx, js)
	}
}

// follow reads the events stream, from the last history events on, until
// ctx ends or no status request came for Config.Idle.
func (s *Server) follow(ctx context.Context, js jetstream.JetStream) {
	fctx, cancel := context.WithCancel(ctx)
	idleDone := make(chan struct{})
	go func() {
		defer close(idleDone)
		s.untilIdle(fctx, cancel)
	}()
	defer func() {
		cancel()
		<-idleDone
	}()
	cons, last := s.eventsConsumer(fctx, js)
	if cons == nil {
		return
	}
	it, err := cons.Messages(jetstream.PullHeartbeat(time.Second), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		s.log.Warn("events stream not read", "err", err)
		return
	}
	stop := context.AfterFunc(fctx, it.Stop)
	defer stop()
	s.events.start()
	defer s.events.stop()
	s.log.Debug("following the events stream for the status page", "last_seq", last)
	if last == 0 {
		s.events.markLoaded()
	}
	for {
		m, err := it.Next()
		if err != nil {
			if fctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			select { // the ordered consumer recovers by itself
			case <-fctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		s.events.add(m.Subject(), m.Data())
		if md, err := m.Metadata(); err != nil || md.Sequence.Stream >= last {
			s.events.markLoaded()
		}
	}
}

// untilIdle cancels the follower once no status request came for Idle.
func (s *Server) untilIdle(ctx context.Context, cancel context.CancelFunc) {
	t := time.NewTicker(max(s.cfg.Idle/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if time.Since(time.Unix(0, s.lastWanted.Load())) > s.cfg.Idle {
				s.log.Debug("no status request lately: the events stream is not followed any more")
				cancel()
				return
			}
		}
	}
}

// eventsConsumer creates an ordered consumer of the events stream from its
// last history events, retrying until it exists (the router creates the
// stream) or ctx ends (nil). It returns the stream's last sequence then.
func (s *Server) eventsConsumer(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, uint64) {
	for attempt := 1; ; attempt++ {
		st, err := js.Stream(ctx, router.EventsStream)
		if err == nil {
			cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
			if last := st.CachedInfo().State.LastSeq; last > s.history() {
				cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, last-s.history()+1
			}
			var cons jetstream.Consumer
			if cons, err = js.OrderedConsumer(ctx, router.EventsStream, cfg); err == nil {
				return cons, st.CachedInfo().State.LastSeq
			}
		}
		if ctx.Err() != nil {
			return nil, 0
		}
		if attempt&(attempt-1) == 0 {
			s.log.Warn("events stream not readable yet; retrying", "err", err, "attempt", attempt)
		}
		select {
		case <-ctx.Done():
			return nil, 0
		case <-time.After(time.Second):
		}
	}
}
