package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing/synctest"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/jspub"
	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// The real shells in the simulated world (issue 33). A node of the
// simulation runs the real hand-over shell (handOver: its loop, its drain
// and catch-up steps, its staging, its reports and retries), the real
// publisher (its publishes, batches, dead-letter copies, spilled reads
// and lane duplicates), the real asker (its loop, its requests in
// flight, a fence's look at its node's queue), the real liveness (its
// heartbeat, the consumer's presence, the catch-up with the records
// after a lapse), the engine's real timers (runTimers, woken by actRetry
// only), the real checkpoint loop (runCheckpoints) and the real fair
// shell (fairShell: its rounds and releases of held messages) on stand-ins of
// what Router gives them: msgStore, queueIO and the publisher's sender
// over the simulated queue stream and ingress, a clock over the virtual
// one, the engine's door and views, the binding cache, the handler and
// the registry. The shells run in goroutines; the world stays one loop
// that owns everything simulated, and the two meet as follows:
//
//   - every call of the shell into the world (a request to the servers, a
//     step of the engine, a timer) is queued as a simCall and the calling
//     goroutine waits for its answer;
//   - after each instant of the virtual clock, the loop wakes the
//     goroutines whose answers or timers are due (simWorld.settle), one
//     at a time, each time waiting until every goroutine of the bubble
//     (testing/synctest) is blocked again, then takes the calls they made,
//     in the order of their keys, and again until none is made;
//   - the loop never runs while a shell's goroutine does, and takes each
//     instant's calls in an order their content gives: a seed replays
//     exactly (TestSimulationIsDeterministic).
//
// A request crosses the node's link (simWorld.hop: held while the link is
// cut), fails now and then before or after its effect, and times out
// after 5 s, as the clients' do.

// simCall is a call a shell's goroutine makes into the world.
type simCall struct {
	key simKey // what it asks, with its arguments: the order calls made at one instant are taken in
	run func() // run by the loop
}

// simKey names a call: its words are formatted only when calls made at
// one instant need an order.
type simKey []any

func (k simKey) String() string { return fmt.Sprintf("%+v", []any(k)) }

// call queues a call made by a shell's goroutine.
func (w *simWorld) call(key simKey, run func()) {
	w.callMu.Lock()
	w.calls = append(w.calls, simCall{key: key, run: run})
	w.callMu.Unlock()
}

// wake has the loop run fn at the next settle, as it wakes goroutines:
// fn answers a call, fires a timer or ends a context.
func (w *simWorld) wake(fn func()) { w.wakes = append(w.wakes, fn) }

// settle lets the shells' goroutines run until they are all blocked and
// takes the calls they made, until none is made.
func (w *simWorld) settle() {
	for {
		// One wake at a time, each followed by the goroutines' run: a
		// goroutine woken twice at one instant (a timer and a channel it
		// selects on) sees them in the order they came, not in select's
		// random one.
		for len(w.wakes) > 0 {
			fn := w.wakes[0]
			w.wakes = w.wakes[1:]
			fn()
			synctest.Wait()
		}
		w.callMu.Lock()
		calls, lines := w.calls, w.shellLines
		w.calls, w.shellLines = nil, nil
		w.callMu.Unlock()
		slices.Sort(lines)
		for _, l := range lines {
			w.trace = append(w.trace, l)
		}
		if len(calls) == 0 {
			if len(w.wakes) == 0 {
				return
			}
			continue
		}
		if len(calls) > 1 {
			type keyed struct {
				key string
				c   simCall
			}
			ks := make([]keyed, len(calls))
			for i, c := range calls {
				ks[i] = keyed{c.key.String(), c}
			}
			slices.SortStableFunc(ks, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
			for i := range ks {
				calls[i] = ks[i].c
			}
		}
		for _, c := range calls {
			c.run()
		}
	}
}

// shutdown ends every node's shells at the end of a run, so that no
// goroutine outlives the bubble.
func (w *simWorld) shutdown() {
	for _, n := range w.nodes {
		n.endShells()
	}
	w.settle()
}

// simPending is a call of a node's shell not answered yet.
type simPending struct {
	n    *simNode
	done chan struct{}
	over bool
	err  error
}

// answer wakes the caller (at the next settle); what it gets was set
// before. A second answer (a timeout after the reply) does nothing.
func (p *simPending) answer() {
	if p.over {
		return
	}
	p.over = true
	delete(p.n.pending, p)
	p.n.w.wake(func() { close(p.done) })
}

// fail answers with err.
func (p *simPending) fail(err error) {
	if !p.over {
		p.err = err
	}
	p.answer()
}

// shellCall is a call of n's shells into the world: run, in the loop,
// starts what answers it. It returns the error it was answered with, or
// ctx's once ctx ends first (the answer, when it comes, is dropped).
func (n *simNode) shellCall(ctx context.Context, key simKey, run func(p *simPending)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p := &simPending{n: n, done: make(chan struct{})}
	n.w.call(append(simKey{n.id}, key...), func() {
		if !n.alive() || n.shellCtx.Err() != nil {
			p.over = true
			p.err = context.Canceled
			n.w.wake(func() { close(p.done) })
			return
		}
		n.pending[p] = true
		run(p)
	})
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// roundTrip is one request over n's link to the servers: serve runs
// there, reply (with the answer's values) back here, unless the request
// fails (before serve, or its answer is lost after), or no answer comes
// within the client's 5 s.
func (n *simNode) roundTrip(p *simPending, pFail float64, serve func(), reply func()) {
	w := n.w
	fail := w.chance(pFail)
	lost := fail && w.rng.IntN(2) == 0
	w.after(simPubTimeout, func() { p.fail(errSimTimeout) })
	w.hop(n.id, w.lat(), func() {
		if fail && !lost {
			w.hop(n.id, w.lat(), func() { p.fail(errSimOp) })
			return
		}
		serve()
		w.hop(n.id, w.lat(), func() {
			if lost {
				p.fail(errSimOp)
				return
			}
			if !p.over {
				reply()
			}
			p.answer()
		})
	})
}

// endShells ends n's shells: its context is canceled and every call it
// waits on is answered with an error.
func (n *simNode) endShells() {
	if n.shellEnd == nil {
		return
	}
	end := n.shellEnd
	n.shellEnd = nil
	n.w.wake(end)
	for p := range n.pending { // answered together, at the next settle
		p.fail(context.Canceled)
	}
}

// shellGo runs fn, a part of n's shells the simulated node starts (a
// lane's move of a late copy), in a goroutine of its own, and done with
// its error in the loop once it returns.
func (n *simNode) shellGo(key simKey, fn func(ctx context.Context) error, done func(error)) {
	w, ctx := n.w, n.shellCtx
	w.wake(func() {
		go func() {
			err := fn(ctx)
			w.call(append(simKey{n.id, "returns"}, key...), func() { done(err) })
		}()
	})
}

// simClock is a node's clock in the simulation: the virtual one, whose
// timers are events of the world.
type simClock struct{ n *simNode }

func (c simClock) Now() time.Time { return c.n.w.now() }

func (c simClock) NewTimer(d time.Duration) clockTimer {
	t := &simTimer{w: c.n.w, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

func (c simClock) WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	t := &simTimer{w: c.n.w, fire: cancel}
	t.Reset(d)
	return ctx, func() {
		t.Stop()
		cancel()
	}
}

func (c simClock) Sleep(ctx context.Context, d time.Duration) error {
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

// simTimer is a timer of simClock: Reset queues a call that schedules the
// firing; Stop (or another Reset) makes a scheduled one do nothing.
type simTimer struct {
	w     *simWorld
	ch    chan time.Time
	fire  func() // instead of a send on ch (WithTimeout's cancel)
	mu    sync.Mutex
	gen   uint64
	armed bool
}

func (t *simTimer) C() <-chan time.Time { return t.ch }

func (t *simTimer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.armed
	t.armed = false
	t.gen++
	return was
}

func (t *simTimer) Reset(d time.Duration) bool {
	t.mu.Lock()
	was := t.armed
	t.armed = true
	t.gen++
	gen := t.gen
	t.mu.Unlock()
	w := t.w
	w.call(simKey{"timer", d}, func() {
		w.after(d, func() {
			t.mu.Lock()
			fire := t.armed && t.gen == gen
			t.armed = t.armed && !fire
			t.mu.Unlock()
			switch now := w.now(); {
			case fire && t.fire != nil:
				w.wake(t.fire)
			case fire:
				w.wake(func() {
					select {
					case t.ch <- now:
					default:
					}
				})
			}
		})
	})
	return was
}

// simLogHandler writes a shell's log lines into the step trace (when
// tracing), sorted among those of the same settle.
type simLogHandler struct {
	w     *simWorld
	node  string
	attrs string
}

func (h simLogHandler) Enabled(context.Context, slog.Level) bool { return h.w.tracing }

func (h simLogHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	b.WriteString(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	line := fmt.Sprintf("%9.4fs %-8s %s", h.w.clock.Seconds(), h.node, b.String())
	h.w.callMu.Lock()
	h.w.shellLines = append(h.w.shellLines, line)
	h.w.callMu.Unlock()
	return nil
}

func (h simLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	for _, a := range as {
		h.attrs += fmt.Sprintf(" %s=%v", a.Key, a.Value)
	}
	return h
}

func (h simLogHandler) WithGroup(string) slog.Handler { return h }

// simExpiryCheck is how often a process's live view looks for records
// past their TTL (Registry.Run's expiryCheckEvery).
const simExpiryCheck = 200 * time.Millisecond

// scheduleExpiry arranges n's live view's expiry check at the first tick of
// Registry.Run's ticker past the view's next deadline (one check pending
// at a time: a deadline that moved on is looked at again then).
func (n *simNode) scheduleExpiry() {
	w := n.w
	if n.expiryPending || !n.up() {
		return
	}
	next := n.view.NextDue()
	if next.IsZero() {
		return
	}
	n.expiryPending = true
	w.after(max(next.Sub(w.now()), 0)+w.between(time.Microsecond, simExpiryCheck), func() {
		n.expiryPending = false
		if !n.up() {
			return
		}
		if due := n.view.NextDue(); !due.IsZero() && w.now().After(due) {
			w.wake(func() { wake(n.expiryWake) })
			return
		}
		n.scheduleExpiry()
	})
}

// startShells starts n's real hand-over shell, as Router.Run does.
func (n *simNode) startShells() {
	w := n.w
	ctx, cancel := context.WithCancel(context.Background())
	n.shellCtx, n.shellEnd = ctx, cancel
	n.pending = map[*simPending]bool{}
	log := slog.New(simLogHandler{w: w, node: n.id})
	h := &handOver{
		node: n.id, groupHeader: DefaultGroupHeader, log: log, io: n.queueIO(), clock: simClock{n}, duties: newDutyQueue(),
		step:         n.stepCall,
		fencedNow:    func() bool { return n.eng.fenced(w.now()) },
		takeoverFrom: n.eng.takeoverFrom,
		ungroupedDestination: func() string {
			var dest string
			n.localCall(simKey{"ungrouped destination"}, func() { dest = n.eng.ungroupedDestination() })
			return dest
		},
		// The queue stream takes held subjects: the hand-over stages on
		// them, and in the seeds with a fair share the engine holds
		// groups back on them too.
		holds:   true,
		lookup:  n.cache.Lookup,
		propose: n.proposeCall,
		loadCheckpointAt: func(ctx context.Context, node string, rev uint64) (c kvbinding.Checkpoint, ok bool, err error) {
			err = n.shellCall(ctx, simKey{"checkpoint of", node, rev}, func(p *simPending) {
				var got kvbinding.Checkpoint
				var found bool
				n.roundTrip(p, w.p.pKVFail, func() { got, found = w.reg.checkpointAt(node, rev) }, func() { c, ok = got, found })
			})
			return c, ok, err
		},
		saveCheckpoint: func(ctx context.Context) error { return n.saveCheckpoint(ctx, n.checkpoint()) },
		// The lost book (lost.go) is not simulated: no checkpoint says
		// what an evacuated node could not save.
		lostThrough:  func(context.Context, map[string]kvbinding.Binding) map[string]uint64 { return nil },
		stored:       func(uint64, string) {},
		classify:     decoder{DefaultGroupHeader}.classify,
		toDeadLetter: (&publisher{groupHeader: DefaultGroupHeader}).toDeadLetter,
	}
	h.warn.late = logagg.New(log, "late copy moved", logagg.DefaultEvery)
	h.warn.lapsed = logagg.New(log, "lapsed messages moved", logagg.DefaultEvery)
	n.ho = h
	n.pub = &publisher{
		node: n.id, groupHeader: DefaultGroupHeader, out: &simSender{n: n, parts: map[string][]simPub{}},
		fast: w.p.fastBatches, expect: []string{QueueStream}, stopping: new(atomic.Bool),
		warn:    logagg.New(log, "publish failed", logagg.DefaultEvery),
		spilled: n.sideRead, late: n.sideRead, store: h.io.side,
		// The outcomes reach the engine as a call: from a PubAck's
		// callback in the loop, or from a side read's goroutine. The
		// publisher reuses its batch once step returns.
		step: func(in input) {
			batch := slices.Clone(in.(inOutcomes).batch)
			w.call(simKey{n.id, "outcomes of", batch[0].group, batch[0].ingress}, func() { n.step(inOutcomes{batch: batch}) })
		},
		stored:       func(uint64, string) {},
		lookup:       n.cache.Lookup,
		takeLateCopy: h.takeLateCopy,
	}
	n.askWake, n.timerWake = make(chan struct{}, 1), make(chan struct{}, 1)
	a := &asker{
		wake: n.askWake,
		pull: func(max int) []sentAsk {
			var batch []sentAsk
			n.localCall(simKey{"pull asks", max}, func() {
				batch = n.eng.askBatch(max, w.now())
			})
			return batch
		},
		step:      n.stepCall,
		markClean: h.markClean,
		propose:   n.proposeCall,
		log:       log,
	}
	l := &liveness{reg: simAnnouncer{n}, every: simHeartbeat, clock: simClock{n}, log: log, yielded: new(atomic.Bool),
		warn: logagg.New(log, "announce failed", logagg.DefaultEvery),
		report: func(time.Time) kvbinding.NodeInfo {
			// Router.announcement: the process; what the engine tells is
			// added as the announcement is sent (simAnnouncer), which
			// saves the world a call a heartbeat.
			return kvbinding.NodeInfo{Node: n.id, Instance: n.instance, Started: n.startedAt}
		},
		consumerChanged: func(has bool) { n.stepCall(inConsumer{has: has}) },
		lastRevision: func(ctx context.Context) (last uint64, err error) {
			err = n.shellCall(ctx, simKey{"last revision"}, func(p *simPending) {
				var got uint64
				n.roundTrip(p, w.p.pKVFail, func() { got = uint64(len(w.kv.log.entries)) }, func() { last = got })
			})
			return last, err
		},
		records: func() uint64 { return uint64(n.kvSub.pos) },
		alive: func(until time.Time) {
			n.localCall(simKey{"alive", until}, func() {
				if !n.liveUntil.IsZero() && !w.now().Before(n.liveUntil) {
					n.renewedAt = n.lastAnnounced // renewed after a lapse
				}
				n.liveUntil = until
				n.step(inAlive{until: until})
			})
		},
	}
	n.live = l
	n.fairWake = make(chan struct{}, 1)
	n.expiryWake = make(chan struct{}, 1)
	n.scheduleExpiry()
	fair := &fairShell{
		node: n.id, log: log, io: h.io, clock: simClock{n}, wake: n.fairWake, holds: n.eng.holds(),
		info: func(ctx context.Context) (*jetstream.ConsumerInfo, error) { return h.io.consumer(ctx, n.id) },
		read: func(ackFloor uint64, window int) (rel []releaseTask, checks []checkTask, busy bool) {
			n.localCall(simKey{"fair read", ackFloor, window}, func() {
				rel, checks = n.eng.fairRead(ackFloor, window, w.now())
				busy = n.eng.fairBusy()
				n.performTaken()
			})
			return rel, checks, busy
		},
		step:        n.stepCall,
		fencedNow:   func() bool { return n.eng.fenced(w.now()) },
		lookup:      n.cache.Lookup,
		stored:      func(uint64, string) {},
		warnRelease: logagg.New(log, "held messages not moved", logagg.DefaultEvery),
	}
	cons := simQueueConsumer{n: n}
	// Started as the world wakes goroutines: none runs beside the loop.
	w.wake(func() {
		go h.run(ctx)
		go a.run(ctx)
		go fair.run(ctx)
		go func() {
			// Registry.Run's expiry check, on the view's clock.
			for {
				select {
				case <-ctx.Done():
					return
				case <-n.expiryWake:
				}
				n.view.ExpireDue(ctx, n.liveStored)
				n.localCall(simKey{"expiry checked"}, func() {
					n.liveChanged()
					n.scheduleExpiry()
				})
			}
		}()
		go runChanges(ctx, n.changes, func() uint64 { return uint64(n.kvSub.pos) }, n.stepCall, &n.applied)
		go runTimers(ctx, simClock{n}, n.timerWake, func() time.Time { return n.eng.nextDue() }, func() { n.stepCall(inTick{}) })
		go runCheckpoints(ctx, simClock{n}, simCheckpoint, func() (kvbinding.Checkpoint, bool) { return n.checkpoint(), true },
			n.saveCheckpoint, logagg.New(log, "checkpoint not saved", logagg.DefaultEvery))
		go func() {
			// Router.setup's first announcement, then the heartbeat.
			_ = l.announce(ctx, cons)
			l.run(ctx, cons)
		}()
	})
}

// sideRead runs read, a side read of n's publisher, in a goroutine of its
// own, started as the world wakes goroutines (sideReads.run); false once
// n's shells have ended.
func (n *simNode) sideRead(read func(ctx context.Context)) bool {
	ctx := n.shellCtx
	if n.shellEnd == nil {
		return false
	}
	n.w.wake(func() { go read(ctx) })
	return true
}

// simSender is the publisher's sender on the simulated streams: each
// publish is a call the loop takes (it may come from a side read's
// goroutine), then crosses n's link (send, sendBatch); its PubAck comes
// back through the callback, followed by the publisher's batch end
// (ackBatch), as jspub gives them.
type simSender struct {
	n *simNode
	// parts: an atomic batch's messages sent before its commit, by batch
	// id.
	parts map[string][]simPub
}

// lanePub returns what the publisher sends as m (a lane's publish).
func (s *simSender) lanePub(m *nats.Msg) simPub {
	p := s.n.simPubOf(m)
	p.kind, p.msg = simRouted, nil
	return p
}

func (s *simSender) Publish(m *nats.Msg, cb jspub.Callback) error {
	n := s.n
	p := s.lanePub(m)
	if id := m.Header.Get(headerBatchID); id != "" {
		ps := append(s.parts[id], p) // the commit
		delete(s.parts, id)
		s.batch(ps, false, cb)
		return nil
	}
	n.w.call(simKey{n.id, "publish", p.id}, func() {
		if !n.alive() {
			return
		}
		if n.w.tracing {
			n.logf("publishes seq %d of %q to %q (dlq %v)", p.seq, p.group, p.node, p.dlq)
		}
		n.send(p, func(sseq uint64, dup bool, err error) {
			if n.w.tracing {
				n.logf("publish of seq %d: %v", p.seq, err)
			}
			var ack jspub.Ack
			switch {
			case err == nil && p.dlq:
				ack = jspub.Ack{Stream: DeadLetterStream, Sequence: sseq, Duplicate: dup}
			case err == nil:
				ack = jspub.Ack{Stream: QueueStream, Sequence: sseq, Duplicate: dup}
			}
			cb(ack, err)
			n.pub.ackBatch()
		})
	})
	return nil
}

func (s *simSender) PublishMsg(m *nats.Msg) error {
	id := m.Header.Get(headerBatchID)
	s.parts[id] = append(s.parts[id], s.lanePub(m))
	return nil
}

func (s *simSender) PublishBatch(ms []*nats.Msg, cb jspub.Callback) error {
	ps := make([]simPub, len(ms))
	for i, m := range ms {
		ps[i] = s.lanePub(m)
	}
	s.batch(ps, true, cb)
	return nil
}

// batch sends ps as one batch, fast-ingest or atomic.
func (s *simSender) batch(ps []simPub, fast bool, cb jspub.Callback) {
	n := s.n
	first, last := ps[0].seq, ps[len(ps)-1].seq
	n.w.call(simKey{n.id, "publish batch", first}, func() {
		if !n.alive() {
			return
		}
		if n.w.tracing {
			n.logf("publishes seqs %d..%d of %q to %q as one batch of %d", first, last, ps[0].group, ps[0].node, len(ps))
		}
		n.sendBatch(ps, fast, func(sseq uint64, err error) {
			if n.w.tracing {
				n.logf("batch %d..%d: %v", first, last, err)
			}
			cb(jspub.Ack{Stream: QueueStream, Sequence: sseq}, err)
			n.pub.ackBatch()
		})
	})
}

// simAnnouncer is the registry's Announce for n's liveness.
type simAnnouncer struct{ n *simNode }

func (a simAnnouncer) Announce(ctx context.Context, info kvbinding.NodeInfo, ttl time.Duration) error {
	n, w := a.n, a.n.w
	return n.shellCall(ctx, simKey{"announce", info.HasConsumer}, func(p *simPending) {
		if n.alive() {
			engineReport(n.eng, &info) // Router.announcement's
		}
		if w.clock < n.announceFailUntil {
			w.hop(n.id, w.lat(), func() { p.fail(errSimOp) })
			return
		}
		n.roundTrip(p, w.p.pKVFail, func() {
			w.reg.announce(info, ttl)
			n.lastAnnounced = w.clock
		}, func() {})
	})
}

// simQueueConsumer is n's queue consumer as liveness reads it (Info): it
// has a puller while the simulated consumer is present.
type simQueueConsumer struct {
	jetstream.Consumer // what is not stood in for: not called
	n                  *simNode
}

func (c simQueueConsumer) Info(ctx context.Context) (info *jetstream.ConsumerInfo, err error) {
	n, w := c.n, c.n.w
	err = n.shellCall(ctx, simKey{"queue consumer info"}, func(p *simPending) {
		var got *jetstream.ConsumerInfo
		n.roundTrip(p, w.p.pOpFail, func() {
			got = &jetstream.ConsumerInfo{Stream: QueueStream, Name: QueueConsumer(n.id), Config: jetstream.ConsumerConfig{AckWait: w.p.ackWait}}
			if w.q.consumer(n.id).hasConsumer() {
				got.NumWaiting = 1
			}
		}, func() { info = got })
	})
	return info, err
}

// localCall is a call of n's shells that crosses no link (the engine's
// door under the router's lock): fn runs in the loop, while the process
// lives, even once its shells are stopping.
func (n *simNode) localCall(key simKey, fn func()) {
	p := &simPending{n: n, done: make(chan struct{})}
	n.w.call(append(simKey{n.id}, key...), func() {
		if n.alive() {
			fn()
		}
		p.over = true
		n.w.wake(func() { close(p.done) })
	})
	<-p.done
}

// stepCall is Router.step for n's shells.
func (n *simNode) stepCall(in input) {
	n.localCall(simKey{"step", reflect.TypeOf(in), in}, func() { n.step(in) })
}

// proposeCall is proposals.Client.Propose for n's shells (n.propose).
func (n *simNode) proposeCall(ctx context.Context, ps []proposals.Proposal) (ds []proposals.Decision, err error) {
	err = n.shellCall(ctx, simKey{"propose", ps}, func(p *simPending) {
		if n.w.tracing {
			n.logf("proposes %s", simProposals(ps))
		}
		n.propose(ps, func(got []proposals.Decision, err error) {
			if n.w.tracing {
				n.logf("answers to %s: %s", simProposals(ps), simDecisions(got, err))
			}
			ds = got
			p.fail(err)
		})
	})
	return ds, err
}

// saveCheckpoint is the registry's SaveCheckpoint of n's checkpoint c.
func (n *simNode) saveCheckpoint(ctx context.Context, c kvbinding.Checkpoint) error {
	w := n.w
	return n.shellCall(ctx, simKey{"save checkpoint", c.Next}, func(p *simPending) {
		n.roundTrip(p, w.p.pKVFail, func() { w.reg.saveCheckpoint(n.id, c) }, func() {})
	})
}

// checkpoint is the node's checkpoint: the tracker's, with the
// catch-ups' progress (dutyQueue.addCaught, as Router.checkpoint).
func (n *simNode) checkpoint() kvbinding.Checkpoint {
	c := n.eng.track.checkpoint()
	if n.ho != nil {
		n.ho.duties.addCaught(&c)
	}
	return c
}

// simMsgSize is what an ingress message of the simulation takes
// (msgRec.size): its body fills it up.
const simMsgSize = 100

// ingressMsg returns ingress message seq as the servers deliver it.
func (w *simWorld) ingressMsg(seq uint64) *nats.Msg {
	m := w.ingress[seq-1]
	hdr := nats.Header{}
	if m.group != "" {
		hdr.Set(DefaultGroupHeader, m.group)
	}
	if m.invalid != "" {
		// Two group ids: GroupOf refuses it.
		hdr[DefaultGroupHeader] = []string{"g0", "g1"}
	}
	if m.close {
		hdr.Set(HeaderGroupSeq, "-1")
	}
	const subject = "jms.sim"
	body := make([]byte, max(simMsgSize-len(subject)-headerSize(hdr), 0))
	return &nats.Msg{Subject: subject, Header: hdr, Data: body}
}

// raw returns queue entry e as a stream read returns it: what the
// hand-over published, or, for a lane's publish (whose message the
// simulation does not keep: the publisher reuses it), its headers that
// matter to a reader.
func (e *simEntry) raw() *jetstream.RawStreamMsg {
	m := e.msg
	if m == nil {
		hdr := nats.Header{
			jetstream.MsgIDHeader: []string{e.id},
			HeaderIngressSeq:      []string{strconv.FormatUint(e.seq, 10)},
		}
		if e.group != "" {
			hdr.Set(DefaultGroupHeader, e.group)
		}
		if e.epoch != 0 {
			hdr.Set(HeaderEpoch, strconv.FormatUint(e.epoch, 10))
		}
		m = &nats.Msg{Subject: e.subject(), Header: hdr}
		e.msg = m
	}
	return &jetstream.RawStreamMsg{Subject: m.Subject, Sequence: e.sseq, Header: cloneHeader(m.Header), Data: m.Data}
}

// subject returns entry e's subject.
func (e *simEntry) subject() string {
	if e.msg != nil {
		return e.msg.Subject
	}
	if node, ok := strings.CutPrefix(e.node, simHeld("")); ok {
		return HeldSubject(node, e.group, "jms.sim")
	}
	return QueueSubject(e.node, "jms.sim")
}

// simPubOf returns what n publishes as m, for the simulated stores and the
// checker.
func (n *simNode) simPubOf(m *nats.Msg) simPub {
	w := n.w
	seq, _ := strconv.ParseUint(m.Header.Get(HeaderIngressSeq), 10, 64)
	epoch, _ := strconv.ParseUint(m.Header.Get(HeaderEpoch), 10, 64)
	group, _ := GroupOf(m.Header, DefaultGroupHeader)
	p := simPub{seq: seq, group: group, id: m.Header.Get(jetstream.MsgIDHeader), epoch: epoch, msg: m,
		lapsedMove: m.Header.Get(HeaderDeliveredBefore) != ""}
	if strings.HasPrefix(m.Subject, DeadLetterSubjectPrefix) || m.Subject == DeadLetterTooLong {
		p.dlq, p.reason = true, m.Header.Get(HeaderDeadReason)
		return p
	}
	node, held, _ := queueOwner(m.Subject)
	p.node, p.kind = node, simCaught
	if held {
		p.node, p.kind = simHeld(node), simStaged
	}
	if s, ok := strings.CutPrefix(p.id, "moved:"); ok {
		at, _ := strconv.ParseUint(s, 10, 64)
		if at >= 1 && at <= uint64(len(w.q.all)) {
			p.kind, p.origin = simCopy, w.q.all[at-1]
		}
	}
	return p
}

// queueIO returns the hand-over's queueIO on the simulated streams.
func (n *simNode) queueIO() queueIO {
	w := n.w
	return queueIO{
		publish: func(ctx context.Context, m *nats.Msg) (ack *jetstream.PubAck, err error) {
			err = n.shellCall(ctx, simKey{"publish", m.Subject, m.Header.Get(jetstream.MsgIDHeader)}, func(p *simPending) {
				sp := n.simPubOf(m)
				if sp.kind == simCopy {
					// Should this node crash before the original is
					// deleted, the message may be on two queues (the
					// checker names the window).
					n.moving[sp.seq] = true
				}
				n.send(sp, func(sseq uint64, dup bool, err error) {
					if err == nil {
						stream := QueueStream
						if sp.dlq {
							stream = DeadLetterStream
						}
						ack = &jetstream.PubAck{Stream: stream, Sequence: sseq, Duplicate: dup}
					}
					p.fail(err)
				})
			})
			return ack, err
		},
		pause: func(ctx context.Context, node string, until time.Time) error {
			return n.shellCall(ctx, simKey{"pause", node, until.Sub(simEpoch())}, func(p *simPending) {
				n.roundTrip(p, w.p.pOpFail, func() {
					c := w.q.consumer(node)
					c.pausedUntil = max(c.pausedUntil, until.Sub(simEpoch()))
				}, func() {})
			})
		},
		consumer: func(ctx context.Context, node string) (info *jetstream.ConsumerInfo, err error) {
			err = n.shellCall(ctx, simKey{"consumer info", node}, func(p *simPending) {
				var got *jetstream.ConsumerInfo
				n.roundTrip(p, w.p.pOpFail, func() {
					c := w.q.consumer(node)
					v := c.view()
					left := max(c.pausedUntil-w.clock, 0)
					got = &jetstream.ConsumerInfo{Stream: QueueStream, Name: QueueConsumer(node), TimeStamp: w.now(),
						Delivered: jetstream.SequenceInfo{Stream: v.delivered}, AckFloor: jetstream.SequenceInfo{Stream: v.ackFloor},
						NumAckPending: v.pending, Config: jetstream.ConsumerConfig{AckWait: v.ackWait},
						Paused: left > 0, PauseRemaining: left}
				}, func() { info = got })
			})
			return info, err
		},
		ingress: func(ctx context.Context, seq uint64) (jetstream.Consumer, error) {
			err := n.shellCall(ctx, simKey{"ingress consumer from", seq}, func(p *simPending) {
				n.roundTrip(p, w.p.pOpFail, func() {}, func() {})
			})
			if err != nil {
				return nil, err
			}
			return &simReader{n: n, next: seq}, nil
		},
		queue: func(context.Context) (msgStore, error) { return simStore{n}, nil },
		side: func(_ context.Context, stream string) (msgStore, error) {
			switch stream {
			case IngressStream:
				return simIngressStore{n}, nil
			case QueueStream:
				return simStore{n}, nil // a fence's look at its node's queue (markClean)
			}
			return nil, fmt.Errorf("sim: no side reads of %s", stream)
		},
	}
}

// simStore is msgStore on the simulated queue stream.
type simStore struct{ n *simNode }

func (s simStore) get(ctx context.Context, seq uint64) (m *jetstream.RawStreamMsg, err error) {
	n := s.n
	err = n.shellCall(ctx, simKey{"get", seq}, func(p *simPending) {
		var got *jetstream.RawStreamMsg
		n.roundTrip(p, n.w.p.pOpFail, func() {
			if seq >= 1 && seq <= uint64(len(n.w.q.all)) && !n.w.q.all[seq-1].removed {
				got = n.w.q.all[seq-1].raw()
			}
		}, func() {
			if m = got; got == nil {
				p.err = jetstream.ErrMsgNotFound
			}
		})
	})
	return m, err
}

func (s simStore) next(ctx context.Context, seq uint64, filter string) (m *jetstream.RawStreamMsg, err error) {
	n := s.n
	err = n.shellCall(ctx, simKey{"next", seq, filter}, func(p *simPending) {
		var got *jetstream.RawStreamMsg
		n.roundTrip(p, n.w.p.pOpFail, func() {
			for _, e := range n.w.q.all[min(max(seq, 1)-1, uint64(len(n.w.q.all))):] {
				if !e.removed && server.SubjectMatchesFilter(e.subject(), filter) {
					got = e.raw()
					return
				}
			}
		}, func() {
			if m = got; got == nil {
				p.err = jetstream.ErrMsgNotFound
			}
		})
	})
	return m, err
}

func (s simStore) state(ctx context.Context, filter string) (st jetstream.StreamState, err error) {
	n := s.n
	err = n.shellCall(ctx, simKey{"state", filter}, func(p *simPending) {
		var got jetstream.StreamState
		n.roundTrip(p, n.w.p.pOpFail, func() {
			got.FirstSeq, got.LastSeq = n.w.q.firstLast()
			got.Subjects = n.w.q.subjects(filter)
		}, func() { st = got })
	})
	return st, err
}

func (s simStore) delete(ctx context.Context, seq uint64) error {
	n := s.n
	return n.shellCall(ctx, simKey{"delete", seq}, func(p *simPending) {
		gone := false
		n.roundTrip(p, n.w.p.pOpFail, func() {
			gone = !n.w.q.deleteMsg(seq)
			if !gone {
				delete(n.moving, n.w.q.all[seq-1].seq)
			}
		}, func() {
			if gone {
				p.err = jetstream.ErrMsgNotFound
			}
		})
	})
}

// simIngressStore is msgStore on the simulated ingress, for the side
// reads (next only).
type simIngressStore struct{ n *simNode }

func (s simIngressStore) get(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	return s.next(ctx, seq, ">")
}

func (s simIngressStore) next(ctx context.Context, seq uint64, _ string) (m *jetstream.RawStreamMsg, err error) {
	n := s.n
	err = n.shellCall(ctx, simKey{"ingress next", seq}, func(p *simPending) {
		var got *jetstream.RawStreamMsg
		n.roundTrip(p, n.w.p.pOpFail, func() {
			if seq = max(seq, 1); seq <= uint64(len(n.w.ingress)) {
				msg := n.w.ingressMsg(seq)
				got = &jetstream.RawStreamMsg{Subject: msg.Subject, Sequence: seq, Header: msg.Header}
			}
		}, func() {
			if m = got; got == nil {
				p.err = jetstream.ErrMsgNotFound
			}
		})
	})
	return m, err
}

func (simIngressStore) state(context.Context, string) (jetstream.StreamState, error) {
	return jetstream.StreamState{}, errors.New("sim: not read")
}

func (simIngressStore) delete(context.Context, uint64) error { return errors.New("sim: not deleted") }

// simReader is the ordered consumer of the ingress a catch-up reads: a
// fetch answers with what the ingress holds from next on, or, when it
// holds nothing yet, after the fetch's wait (1 s) with what came.
type simReader struct {
	jetstream.Consumer // what is not stood in for: not called
	n                  *simNode
	next               uint64
}

func (r *simReader) Fetch(limit int, _ ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	n, w := r.n, r.n.w
	b := &hoBatch{ch: make(chan jetstream.Msg, limit)}
	take := func() {
		for ; limit > 0 && r.next <= uint64(len(w.ingress)); limit-- {
			b.ch <- &hoMsg{seq: r.next, msg: w.ingressMsg(r.next)}
			r.next++
		}
	}
	// A fetch takes no context: it ends by its own wait.
	err := n.shellCall(context.Background(), simKey{"fetch", limit, r.next}, func(p *simPending) {
		fail := w.chance(w.p.pOpFail)
		w.after(simPubTimeout, func() { p.fail(errSimTimeout) })
		w.hop(n.id, w.lat(), func() {
			if fail {
				w.hop(n.id, w.lat(), func() { p.fail(errSimOp) })
				return
			}
			serve := func() {
				if p.over {
					return
				}
				take()
				w.hop(n.id, w.lat(), p.answer)
			}
			if r.next > uint64(len(w.ingress)) {
				w.after(time.Second, serve) // the fetch's wait for messages
				return
			}
			serve()
		})
	})
	close(b.ch)
	if err != nil {
		return nil, err
	}
	return b, nil
}
