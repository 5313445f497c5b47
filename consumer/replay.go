package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/wire"
)

// replayLease is how long a replay claim stands without being renewed;
// the replaying process renews it every replayLease/3. Another process of
// the node takes over a replay whose claim ran out.
const replayLease = 30 * time.Second

// replayRetry is how soon a replay that could not go on is tried again.
const replayRetry = 5 * time.Second

// errClaimLost: the record changed under the replay (an operator, or
// another process took the claim).
var errClaimLost = errors.New("consumer: the replay's claim was lost")

// replayJob is the replay of one parked group: its record and revision.
type replayJob struct {
	r   *runner
	key string
	rec ParkRecord
	rev uint64
}

// load reads the record; jetstream.ErrKeyNotFound when it is gone.
func (j *replayJob) load(ctx context.Context) error {
	gctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	e, err := j.r.parkedKV.Get(gctx, j.key)
	if err != nil {
		return err
	}
	var rec ParkRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return fmt.Errorf("consumer: parked record %s: %w", j.key, err)
	}
	j.rec, j.rev = rec, e.Revision()
	return nil
}

// put writes the record if it is unchanged since load or the last put.
// On a conflict it reloads it and returns errClaimLost unless this
// process still holds the replay (then put it again).
func (j *replayJob) put(ctx context.Context) error {
	for {
		val, err := json.Marshal(j.rec)
		if err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, opTimeout)
		rev, err := j.r.parkedKV.Update(pctx, j.key, val, j.rev)
		cancel()
		if err == nil {
			j.rev = rev
			return nil
		}
		if !casConflict(err) {
			return err
		}
		want := j.rec
		if err := j.load(ctx); err != nil {
			return err
		}
		if j.rec.State != StateReplay || j.rec.Replayer != j.r.id {
			return errClaimLost
		}
		j.rec = want
	}
}

// casConflict reports a revision mismatch of a conditional KV write.
func casConflict(err error) bool {
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// replay runs the replay job of parked group l (its record asks for one,
// on this node) and ends it in the lane.
func (r *runner) replay(ctx context.Context, l *lane) {
	st, done := r.replayGroup(ctx, l)
	r.mu.Lock()
	r.lanes.endReplay(l, st, done, time.Now().Add(replayRetry), time.Now())
	r.cond.Broadcast()
	r.mu.Unlock()
}

// replayGroup claims the replay of l's group, runs the handler on its
// parked messages in order, deleting each from ParkedStream once handled,
// and deletes the record when none is left. It returns the group's state
// after it and the highest ingress seq handled.
//
// A crash leaves the record in replay state with a claim that runs out:
// the next process resumes with the messages not deleted yet (the first
// flagged Redelivered, as its handler may have run). Nothing else parks
// the group's arrivals meanwhile: every Consume holds them in their lane.
func (r *runner) replayGroup(ctx context.Context, l *lane) (parkState, uint64) {
	group := l.group
	key, err := kvbinding.FullKey(group)
	if err != nil {
		return notParked, 0
	}
	j := &replayJob{r: r, key: key}
	if err := j.load(ctx); err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return notParked, 0
		}
		r.warn("replay", "consumer: cannot read a parked record; trying again", "group", group, "err", err)
		return replayState, 0
	}
	r.mu.Lock()
	watched := l.recRev
	r.mu.Unlock()
	if j.rev < watched {
		// The bucket allows direct gets, which any replica answers: one
		// behind gave a record older than the watch's. Acting on it (a
		// group merely parked) would drop the replay for good.
		r.log.Debug("consumer: a parked record read older than the watch's; reading again shortly", "group", group,
			"read_revision", j.rev, "watched_revision", watched)
		return replayState, 0
	}
	now := time.Now()
	switch {
	case j.rec.State != StateReplay:
		return parkedState, 0
	case j.rec.Node != r.node:
		return replayState, 0 // the watch says it is not this node's
	case j.rec.Replayer != "" && j.rec.Replayer != r.id && now.Before(j.rec.ClaimedAt.Add(replayLease)):
		return replayState, 0
	case !r.mayReplay(ctx):
		r.log.Debug("consumer: a replay is asked for, but another process has the queue's pin", "group", group)
		return replayState, 0
	}
	j.rec.Replayer, j.rec.ClaimedAt = r.id, now.UTC()
	j.rec.Claims++
	if err := j.put(ctx); err != nil {
		r.log.Debug("consumer: could not claim a replay", "group", group, "err", err)
		return replayState, 0
	}
	resumed := j.rec.Claims > 1
	r.log.Debug("consumer: replaying a parked group", "group", group, "mode", j.rec.Mode, "skip_seq", j.rec.SkipSeq, "resumed", resumed)

	filter := ParkedSubjectPrefix + "*." + key + ".>"
	var (
		next     uint64 = 1
		done     uint64
		replayed int
	)
	for {
		if r.stopping() || ctx.Err() != nil {
			j.unclaim(ctx)
			return replayState, done
		}
		if time.Since(j.rec.ClaimedAt) > replayLease/3 {
			j.rec.ClaimedAt = time.Now().UTC()
			if err := j.put(ctx); err != nil {
				r.log.Debug("consumer: replay claim not renewed; leaving it", "group", group, "err", err)
				return replayState, done
			}
		}
		raw, err := r.parkedMsg(ctx, next, filter)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			// All replayed: the record goes if nobody changed it meanwhile.
			dctx, cancel := context.WithTimeout(ctx, opTimeout)
			err = r.parkedKV.Delete(dctx, key, jetstream.LastRevision(j.rev))
			cancel()
			if err == nil {
				r.event(proposals.EventRelease, group, j.rec.IngressSeq, string(j.rec.Mode), 0, replayed)
				r.log.Info("consumer: parked group replayed; it runs again", "group", group, "mode", j.rec.Mode, "replayed", replayed)
				return notParked, done
			}
			if casConflict(err) {
				if lerr := j.load(ctx); lerr == nil && j.rec.State == StateReplay && j.rec.Replayer == r.id {
					continue // renewed by this process meanwhile; look again
				}
				return replayState, done
			}
			r.warn("replay", "consumer: cannot end a replay; trying again", "group", group, "err", err)
			return replayState, done
		}
		if err != nil {
			r.warn("replay", "consumer: cannot read the parked stream; trying again", "group", group, "err", err)
			if !sleep(ctx, time.Second) {
				continue
			}
			continue
		}
		next = raw.Sequence + 1
		seq, _ := strconv.ParseUint(raw.Header.Get(wire.HeaderIngressSeq), 10, 64)
		// The lane's done mark counts parked messages as done (so that a
		// redelivery from the queue is not parked twice): only a copy of one
		// this replay handled is dropped.
		switch {
		case seq != 0 && seq <= done:
			r.log.Debug("consumer: a second parked copy of a replayed message; dropping it", "group", group, "ingress_seq", seq)
			r.dropParked(ctx, raw.Sequence)
			continue
		case j.rec.SkipSeq != 0 && seq <= j.rec.SkipSeq:
			r.event(proposals.EventSkip, group, seq, "skipped by an operator", 0, 0)
			r.log.Warn("consumer: skipped a parked message unhandled", "group", group, "ingress_seq", seq, "by", "operator")
			r.dropParked(ctx, raw.Sequence)
			continue
		}
		msg := r.replayedMessage(group, raw, seq, resumed && replayed == 0)
		o, attempts, reason := r.replayOne(ctx, l, msg)
		switch o {
		case succeeded:
			r.m.processed.Inc()
			replayed++
			done = max(done, seq)
			r.dropParked(ctx, raw.Sequence)
			continue
		case interrupted:
			j.unclaim(ctx)
			return replayState, done
		}
		if j.rec.Mode == ReplayRelease {
			r.event(proposals.EventSkip, group, seq, "failed during a release: "+reason, attempts, 0)
			r.log.Warn("consumer: a released group's message failed again; dropped unhandled", "group", group, "ingress_seq", seq, "attempts", attempts, "err", reason)
			done = max(done, seq)
			r.dropParked(ctx, raw.Sequence)
			continue
		}
		// Parked again, at this message; the rest stay behind it.
		j.rec = ParkRecord{Node: r.node, IngressSeq: seq, Reason: reason, Attempts: attempts, At: time.Now().UTC()}
		if err := j.put(ctx); err != nil {
			r.warn("replay", "consumer: could not record a group parked again; trying again", "group", group, "err", err)
			return replayState, done
		}
		r.mu.Lock()
		l.reason = reason
		r.mu.Unlock()
		r.event(proposals.EventPark, group, seq, reason, attempts, 0)
		r.warn("parking", "consumer: a replayed message failed again; the group stays parked", "group", group, "ingress_seq", seq, "attempts", attempts, "err", reason)
		return parkedState, done
	}
}

// unclaim gives the replay up (the process stops), so that another
// process may take it at once.
func (j *replayJob) unclaim(ctx context.Context) {
	j.rec.Replayer, j.rec.ClaimedAt = "", time.Time{}
	if err := j.put(context.WithoutCancel(ctx)); err != nil {
		j.r.log.Debug("consumer: could not give a replay up; it is taken over after its claim runs out", "key", j.key, "err", err)
	}
}

// mayReplay reports whether this process may run a replay: in pinned
// mode only the process with the pin, or any when none has it, so that
// the group's arrivals and its replay meet in one process's lane.
func (r *runner) mayReplay(ctx context.Context) bool {
	if !r.pinned {
		return true
	}
	r.mu.Lock()
	pin := r.pinID
	r.mu.Unlock()
	if pin != "" {
		return true
	}
	ictx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	info, err := r.cons.Info(ictx)
	if err != nil {
		return false
	}
	for _, g := range info.PriorityGroups {
		if g.Group == wire.PriorityGroup && g.PinnedClientID != "" {
			return false
		}
	}
	return true
}

func (r *runner) stopping() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lanes.stopping
}

// parkedMsg returns the first message of ParkedStream at or after seq on
// filter.
func (r *runner) parkedMsg(ctx context.Context, seq uint64, filter string) (*jetstream.RawStreamMsg, error) {
	gctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	s, err := r.js.Stream(gctx, ParkedStream)
	if err != nil {
		return nil, err
	}
	return s.GetMsg(gctx, seq, jetstream.WithGetMsgSubject(filter))
}

// dropParked deletes a handled or skipped message from ParkedStream,
// retrying until it is gone or the process stops (a message left there
// would be replayed again).
func (r *runner) dropParked(ctx context.Context, seq uint64) {
	for {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
		s, err := r.js.Stream(dctx, ParkedStream)
		if err == nil {
			err = s.DeleteMsg(dctx, seq)
		}
		cancel()
		var apiErr *jetstream.APIError
		if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeMessageNotFound) {
			return
		}
		r.warn("replay-delete", "consumer: cannot delete a replayed message from the parked stream; trying again", "stream_seq", seq, "err", err)
		if r.stopping() || !sleep(ctx, time.Second) {
			return
		}
	}
}

// replayedMessage builds what the handler sees of a parked message.
func (r *runner) replayedMessage(group string, raw *jetstream.RawStreamMsg, seq uint64, redelivered bool) *Message {
	_, _, subject, _ := parkedSubjectParts(raw.Subject)
	epoch, _ := strconv.ParseUint(raw.Header.Get(wire.HeaderEpoch), 10, 64)
	return &Message{
		Subject:     subject,
		Header:      raw.Header,
		Data:        raw.Data,
		Group:       group,
		IngressSeq:  seq,
		Epoch:       epoch,
		Fence:       Fence{Epoch: epoch, IngressSeq: seq},
		Redelivered: redelivered || parkAttempts(raw) > 0,
		Closing:     raw.Header.Get(wire.HeaderGroupSeq) == "-1",
		Replayed:    true,
	}
}

// replayOne runs the handler on a replayed message with the usual
// attempts and backoff. It returns succeeded, failed (after the last
// attempt or a terminal error) or interrupted (the drain bound cut it).
func (r *runner) replayOne(ctx context.Context, l *lane, msg *Message) (outcome, int, string) {
	for attempt := 1; ; attempt++ {
		msg.Attempt = attempt
		err := r.call(ctx, msg)
		if err == nil {
			return succeeded, attempt, ""
		}
		if context.Cause(ctx) == ErrDrainTimeout || ctx.Err() != nil {
			return interrupted, attempt, err.Error()
		}
		if errors.Is(err, ErrTerminal) || attempt >= r.o.maxAttempts {
			return failed, attempt, err.Error()
		}
		r.m.retries.Inc()
		r.log.Debug("consumer: replayed message failed; retrying after backoff", "group", l.group, "ingress_seq", msg.IngressSeq, "attempt", attempt, "err", err)
		if !sleep(ctx, r.o.backoff(attempt)) || r.stopping() {
			return interrupted, attempt, err.Error()
		}
	}
}

// parkAttempts is how many times a parked message's handler failed
// before it was parked (0 for the ones parked behind it).
func parkAttempts(raw *jetstream.RawStreamMsg) int {
	n, _ := strconv.Atoi(raw.Header.Get(HeaderParkAttempts))
	return n
}
