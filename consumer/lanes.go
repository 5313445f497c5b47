package consumer

import (
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// This file is the pure core of Consume: per-group lanes, with no I/O and
// no clock (time comes in as an argument). Consume's shell calls it under
// one mutex and does what it returns (acks, handler runs, parking).

// delivery is one delivered queue message in a lane.
type delivery struct {
	seq       uint64 // Grouping-Ingress-Seq
	epoch     uint64 // Grouping-Epoch, 0 when absent (not fenced)
	streamSeq uint64 // the queue stream's sequence
	msg       jetstream.Msg
	touched   time.Time // delivered or last sent InProgress
	replaced  bool      // a newer delivery of the same message took its place
}

// barrier is a message of a group that was delivered to another consumer
// process (an earlier one, or the pinned one while this one waited) and
// not acknowledged: JetStream delivers it again after its ack wait, and
// the lane holds later messages until it arrives or is gone.
type barrier struct {
	seq       uint64
	streamSeq uint64
	since     time.Time
}

// lane is a group's state.
type lane struct {
	group     string
	done      uint64 // done mark: the last ingress seq processed or parked
	epoch     uint64 // the highest epoch seen
	pending   []*delivery
	running   *delivery
	stale     bool // running's group showed a newer epoch while it ran
	attempts  int  // failed attempts of the head
	notBefore time.Time
	parked    bool
	reason    string // why it parked (the last error)
	// hold: the group's parked record asks for a replay; its arrivals wait
	// in the lane (they are neither run nor parked) until the replay ends.
	hold bool
	// replayMine: the replay is for this node; claimUntil: until when
	// another process's claim on it stands.
	replayMine bool
	claimUntil time.Time
	replayDue  bool // take the replay job next
	replaying  bool // the replay job runs
	// recState and recRev: the state of the group's parked record as
	// last set (by the watch or this process's own write), and the
	// record's revision as the watch brought it. A read of the record
	// older than recRev is stale (a replica behind answered it).
	recState parkState
	recRev   uint64

	barriers []barrier // sorted by seq
	queued   bool      // in laneSet.ready
	lastUsed time.Time
}

// verdict is what to do with an arriving delivery.
type verdict int

const (
	// held: the delivery waits in its lane.
	held verdict = iota
	// dropDone: at or below the group's done mark; ack it, count it.
	dropDone
	// dropStale: of an older epoch than the group showed; ack it, count it.
	dropStale
	// tookOver: a delivery of a message the lane already holds (a
	// redelivery after the ack wait); the newer one replaced it.
	tookOver
)

// laneSet holds every lane. It is not safe for concurrent use.
type laneSet struct {
	lanes    map[string]*lane
	ready    []*lane // runnable lanes, FIFO
	stopping bool

	// counts for metrics
	held, running int
}

func newLaneSet() *laneSet { return &laneSet{lanes: make(map[string]*lane)} }

func (s *laneSet) lane(group string, now time.Time) *lane {
	l := s.lanes[group]
	if l == nil {
		l = &lane{group: group, lastUsed: now}
		s.lanes[group] = l
	}
	return l
}

// addBarrier records a message of group delivered elsewhere and not acked.
func (s *laneSet) addBarrier(group string, b barrier, now time.Time) {
	l := s.lane(group, now)
	if b.seq <= l.done || (l.running != nil && l.running.seq == b.seq) {
		return // done, or it is this process's own delivery
	}
	if _, held := slices.BinarySearchFunc(l.pending, b.seq, func(x *delivery, seq uint64) int { return cmpU(x.seq, seq) }); held {
		return
	}
	i, found := slices.BinarySearchFunc(l.barriers, b.seq, func(x barrier, seq uint64) int { return cmpU(x.seq, seq) })
	if !found {
		l.barriers = slices.Insert(l.barriers, i, b)
	}
}

// liftBarrier removes the barrier of queue stream message streamSeq (gone
// from the stream: acked by its consumer or moved away) and returns
// whether the lane may now run.
func (s *laneSet) liftBarrier(group string, streamSeq uint64, now time.Time) {
	l := s.lanes[group]
	if l == nil {
		return
	}
	l.barriers = slices.DeleteFunc(l.barriers, func(b barrier) bool { return b.streamSeq == streamSeq })
	s.kick(l, now)
}

// barriersDue returns the barriers waited on for longer than wait, for the
// shell to check whether their messages still exist.
func (s *laneSet) barriersDue(now time.Time, wait time.Duration) map[string][]barrier {
	var out map[string][]barrier
	for g, l := range s.lanes {
		for _, b := range l.barriers {
			if now.Sub(b.since) >= wait {
				if out == nil {
					out = make(map[string][]barrier)
				}
				out[g] = append(out[g], b)
			}
		}
	}
	return out
}

// arrive puts d in its group's lane. It returns the verdict and the
// deliveries the lane dropped as stale because d showed a newer epoch
// (to be acked and counted), and whether the running handler of the
// group became stale.
func (s *laneSet) arrive(group string, d *delivery, now time.Time) (v verdict, stale []*delivery, staleRunning bool) {
	l := s.lane(group, now)
	l.lastUsed = now
	if d.seq <= l.done {
		return dropDone, nil, false
	}
	if d.epoch != 0 && d.epoch < l.epoch {
		// A copy from before a move: never processed as current.
		s.dropBarrier(l, d.seq)
		return dropStale, nil, false
	}
	if d.epoch > l.epoch {
		if l.epoch != 0 {
			keep := l.pending[:0]
			for _, p := range l.pending {
				if p.epoch != 0 && p.epoch < d.epoch {
					stale = append(stale, p)
					s.held--
					continue
				}
				keep = append(keep, p)
			}
			clear(l.pending[len(keep):])
			l.pending = keep
			if l.running != nil && l.running.epoch != 0 && l.running.epoch < d.epoch && !l.stale {
				l.stale, staleRunning = true, true
			}
		}
		l.epoch = d.epoch
	}
	s.dropBarrier(l, d.seq)
	if l.running != nil && l.running.seq == d.seq {
		// Redelivered while its handler runs: ack with the newest token.
		l.running.replaced = true
		l.running = d
		return tookOver, stale, staleRunning
	}
	i, found := slices.BinarySearchFunc(l.pending, d.seq, func(x *delivery, seq uint64) int { return cmpU(x.seq, seq) })
	if found {
		l.pending[i].replaced = true
		l.pending[i] = d
		return tookOver, stale, staleRunning
	}
	l.pending = slices.Insert(l.pending, i, d)
	s.held++
	s.kick(l, now)
	return held, stale, staleRunning
}

func (s *laneSet) dropBarrier(l *lane, seq uint64) {
	if len(l.barriers) == 0 {
		return
	}
	l.barriers = slices.DeleteFunc(l.barriers, func(b barrier) bool { return b.seq == seq })
}

// active counts the lanes holding or running a message (for metrics, at
// scrape time).
func (s *laneSet) active() int {
	n := 0
	for _, l := range s.lanes {
		if l.running != nil || len(l.pending) > 0 {
			n++
		}
	}
	return n
}

// runnable reports whether l's head may start now.
func (s *laneSet) runnable(l *lane, now time.Time) bool {
	if s.stopping || l.running != nil || l.replaying {
		return false
	}
	if l.replayDue {
		return true
	}
	if l.hold || len(l.pending) == 0 || now.Before(l.notBefore) {
		return false
	}
	return len(l.barriers) == 0 || l.pending[0].seq < l.barriers[0].seq
}

// kick queues l if it may run now.
func (s *laneSet) kick(l *lane, now time.Time) {
	if !l.queued && s.runnable(l, now) {
		l.queued = true
		s.ready = append(s.ready, l)
	}
}

// kickAll queues every lane that may run now (after a backoff ends).
func (s *laneSet) kickAll(now time.Time) {
	for _, l := range s.lanes {
		s.kick(l, now)
	}
}

// next takes the head of the first runnable lane, marking it running. It
// returns nil when none may run. park says the head goes to the parked
// stream instead of the handler. A lane with a nil d is the replay job of
// a parked group (see endReplay).
func (s *laneSet) next(now time.Time) (l *lane, d *delivery, park bool) {
	for len(s.ready) > 0 {
		l = s.ready[0]
		s.ready[0] = nil
		s.ready = s.ready[1:]
		l.queued = false
		if !s.runnable(l, now) {
			continue
		}
		if l.replayDue {
			l.replayDue, l.replaying = false, true
			s.running++
			l.lastUsed = now
			return l, nil, false
		}
		d = l.pending[0]
		l.pending[0] = nil
		l.pending = l.pending[1:]
		s.held--
		l.running = d
		l.stale = false
		s.running++
		l.lastUsed = now
		return l, d, l.parked
	}
	return nil, nil, false
}

// outcome is how the run of a lane's head ended.
type outcome int

const (
	// succeeded: processed (or parked) and acked.
	succeeded outcome = iota
	// failed: the handler failed; retry after backoff, or park.
	failed
	// failedTerminal: the handler returned a terminal error: park.
	failedTerminal
	// interrupted: not done (a park that failed to publish, a stop); run
	// it again later without counting an attempt.
	interrupted
)

// finish ends the run of l's head. For failed it returns whether the
// lane is now parked (attempts reached maxAttempts) and otherwise sets the
// backoff until retryAt.
func (s *laneSet) finish(l *lane, o outcome, maxAttempts int, backoff func(attempt int) time.Duration, now time.Time) (parkedNow bool, retryAt time.Time) {
	d := l.running
	l.running = nil
	s.running--
	l.lastUsed = now
	switch o {
	case succeeded:
		l.done = max(l.done, d.seq)
		l.attempts = 0
		l.notBefore = time.Time{}
	case failed, failedTerminal:
		l.attempts++
		if o == failedTerminal || l.attempts >= maxAttempts {
			l.parked, parkedNow = true, !l.parked
			l.notBefore = time.Time{}
		} else {
			retryAt = now.Add(backoff(l.attempts))
			l.notBefore = retryAt
		}
		s.requeue(l, d)
	case interrupted:
		retryAt = now.Add(backoff(1))
		l.notBefore = retryAt
		s.requeue(l, d)
	}
	if l.running == nil && len(l.pending) == 0 && len(l.group) > 0 && l.group[0] == 0 && (o == succeeded) {
		// A lane of one ungrouped or malformed message: nothing to keep.
		delete(s.lanes, l.group)
		return parkedNow, retryAt
	}
	s.kick(l, now)
	return parkedNow, retryAt
}

// requeue puts d back at the head of its lane (unless a newer epoch made
// it stale meanwhile, which the caller learns from l.stale).
func (s *laneSet) requeue(l *lane, d *delivery) {
	l.pending = slices.Insert(l.pending, 0, d)
	s.held++
}

// dropHead removes the requeued head of l after a stale run; returns it.
func (s *laneSet) dropHead(l *lane, now time.Time) *delivery {
	if len(l.pending) == 0 {
		return nil
	}
	d := l.pending[0]
	l.pending = l.pending[1:]
	s.held--
	l.attempts = 0
	l.notBefore = time.Time{}
	s.kick(l, now)
	return d
}

// setParked marks group parked or not (a record without a replay).
func (s *laneSet) setParked(group string, parked bool, now time.Time) {
	st := notParked
	if parked {
		st = parkedState
	}
	s.setRecord(group, st, false, time.Time{}, now)
}

// parkState is what a group's parked record says.
type parkState int

const (
	// notParked: no record; the group runs.
	notParked parkState = iota
	// parkedState: recorded as parked; its messages go to the parked stream.
	parkedState
	// replayState: an operator asked for its parked messages to be
	// replayed; its arrivals wait.
	replayState
)

// setRecord applies a change of group's parked record: its state, whether
// a replay is for this node, and until when another process's claim on
// the replay stands.
func (s *laneSet) setRecord(group string, st parkState, mine bool, claimUntil, now time.Time) {
	l := s.lanes[group]
	if l == nil {
		if st == notParked {
			return
		}
		l = s.lane(group, now)
	}
	l.recState = st
	switch st {
	case notParked:
		l.parked, l.hold, l.replayMine = false, false, false
		if !l.replaying {
			l.attempts = 0
		}
	case parkedState:
		l.parked, l.hold, l.replayMine = true, false, false
	case replayState:
		l.parked, l.hold, l.replayMine, l.claimUntil = true, true, mine, claimUntil
		if mine && !l.replaying && !now.Before(claimUntil) {
			l.replayDue = true
		}
	}
	if st != replayState || !mine {
		l.replayDue = false
	}
	s.kick(l, now)
}

// replaysDue marks the replays of this node whose other claim ran out as
// due (a process that claimed one died), and returns how many.
func (s *laneSet) replaysDue(now time.Time) int {
	n := 0
	for _, l := range s.lanes {
		if l.hold && l.replayMine && !l.replaying && !l.replayDue && !now.Before(l.claimUntil) {
			l.replayDue = true
			s.kick(l, now)
			n++
		}
	}
	return n
}

// endReplay ends the replay job of l: st is the group's state after it
// (notParked: all replayed, the record deleted; parkedState: a message
// failed again and the group is parked at it; replayState: not done, to
// be tried again from retryAt), done the highest ingress seq it handled.
func (s *laneSet) endReplay(l *lane, st parkState, done uint64, retryAt, now time.Time) {
	l.replaying = false
	s.running--
	l.done = max(l.done, done)
	l.lastUsed = now
	switch st {
	case notParked:
		l.parked, l.hold, l.replayMine = false, false, false
		l.attempts = 0
		l.notBefore = time.Time{}
	case parkedState:
		l.parked, l.hold = true, false
	case replayState:
		// To be tried again, unless the record changed meanwhile to say
		// otherwise (the watch's setRecord since).
		l.parked, l.hold, l.claimUntil = true, l.recState == replayState, retryAt
	}
	s.kick(l, now)
}

// progressDue returns the held and running deliveries whose last
// delivery or InProgress is older than every, and marks them touched now.
func (s *laneSet) progressDue(now time.Time, every time.Duration) []*delivery {
	var out []*delivery
	touch := func(d *delivery) {
		if d != nil && now.Sub(d.touched) >= every {
			d.touched = now
			out = append(out, d)
		}
	}
	for _, l := range s.lanes {
		touch(l.running)
		for _, d := range l.pending {
			touch(d)
		}
	}
	return out
}

// sweep forgets idle lanes (nothing held or running, not parked, no
// barrier) unused for idle, bounding memory to the groups seen recently.
// It returns how many it forgot.
func (s *laneSet) sweep(now time.Time, idle time.Duration) int {
	n := 0
	for g, l := range s.lanes {
		if l.running == nil && len(l.pending) == 0 && !l.parked && len(l.barriers) == 0 && !l.queued && now.Sub(l.lastUsed) >= idle {
			delete(s.lanes, g)
			n++
		}
	}
	return n
}

// drainHeld empties every lane for a stop and returns what was held.
func (s *laneSet) drainHeld() []*delivery {
	var out []*delivery
	for _, l := range s.lanes {
		out = append(out, l.pending...)
		s.held -= len(l.pending)
		l.pending = nil
	}
	s.ready = nil
	return out
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
