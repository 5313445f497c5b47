package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/wire"
)

// ParkRecord is the value of a parked group's key in ParkedBucket.
type ParkRecord struct {
	// Node is the node whose consumer parked the group.
	Node string `json:"node"`
	// IngressSeq is the first parked message of the group.
	IngressSeq uint64 `json:"ingress_seq"`
	// Reason is the handler's last error.
	Reason string `json:"reason"`
	// Attempts is how many times the handler failed on it.
	Attempts int `json:"attempts"`
	// At is when the group was parked.
	At time.Time `json:"at"`
	// State is "" while the group is parked, StateReplay once an operator
	// asked for its parked messages to be replayed (Replay).
	State string `json:"state,omitempty"`
	// Mode is the replay asked for (ReplayRetry, ReplaySkip, ReplayRelease).
	Mode ReplayMode `json:"mode,omitempty"`
	// SkipSeq: the replay drops the parked messages up to this ingress
	// seq unhandled (set by ReplaySkip to the head's).
	SkipSeq uint64 `json:"skip_seq,omitempty"`
	// Replayer is the Consume process running the replay, ClaimedAt when
	// it last renewed its claim, Claims how many processes claimed it
	// (more than one: a replay resumed after a crash).
	Replayer  string    `json:"replayer,omitempty"`
	ClaimedAt time.Time `json:"claimed_at,omitzero"`
	Claims    int       `json:"claims,omitempty"`
}

// StateReplay is ParkRecord.State of a group whose replay was asked for.
const StateReplay = "replay"

// parkedKeyTokens is the part of a parked subject that names the lane: the
// group's kvbinding.FullKey (two tokens), "u._" for a message without a group
// and "m._" for one without a valid ingress sequence.
func parkedKeyTokens(laneKey string) string {
	switch {
	case strings.HasPrefix(laneKey, ungroupedPrefix):
		return "u._"
	case strings.HasPrefix(laneKey, "\x00"):
		return "m._"
	}
	key, err := kvbinding.FullKey(laneKey)
	if err != nil {
		return "m._"
	}
	return key
}

// ParkedFilter returns the subject filter of group's messages in
// ParkedStream: ParkedSubjectPrefix + <node> + "." + <group key> + "." +
// <ingress subject>, the group key being kvbinding.FullKey(group).
func ParkedFilter(group string) (string, error) {
	key, err := kvbinding.FullKey(group)
	if err != nil {
		return "", err
	}
	return ParkedSubjectPrefix + "*." + key + ".>", nil
}

// parkedSubjectParts splits a parked subject into its node, group key and
// ingress subject.
func parkedSubjectParts(subject string) (node, key, ingress string, ok bool) {
	rest, found := strings.CutPrefix(subject, ParkedSubjectPrefix)
	if !found {
		return "", "", "", false
	}
	t := strings.SplitN(rest, ".", 4)
	if len(t) != 4 {
		return "", "", "", false
	}
	return t[0], t[1] + "." + t[2], t[3], true
}

// setupParking creates the parked stream and bucket if missing and
// watches the bucket, so that a group parked by any node (or released by
// deleting its key) is known before the first message is taken. It
// returns the function that stops the watch.
func (r *runner) setupParking(ctx context.Context) (func(), error) {
	for logged, err := false, r.tryParking(ctx); err != nil; logged, err = true, r.tryParking(ctx) {
		switch {
		case ctx.Err() != nil:
			return func() {}, nil
		case !isTransient(err) && !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, jetstream.ErrBucketNotFound):
			return func() {}, err
		}
		if !logged {
			// Where a consumer may not create them, it waits for a LOCAL
			// router node to.
			r.log.Info("consumer: waiting for the parked stream and bucket; retrying every second", "err", err)
		} else {
			r.log.Debug("consumer: the parked stream and bucket are not ready; retrying", "err", err)
		}
		if !sleep(ctx, time.Second) {
			return func() {}, nil
		}
	}
	// The watch runs until the returned function stops it; the initial
	// records are in before it returns (ready), so that a group parked
	// before the start is known before its first message is taken.
	wctx, cancel := context.WithCancel(ctx)
	ready, done := make(chan struct{}), make(chan struct{})
	var werr error
	go func() {
		defer close(done)
		werr = kvbinding.WatchBucket(wctx, r.js, ParkedBucket, ">", r.applyParked, func() { close(ready) })
	}()
	select {
	case <-ready:
	case <-done:
		cancel()
		if ctx.Err() != nil {
			return func() {}, nil
		}
		return func() {}, fmt.Errorf("consumer: watch bucket %s: %w", ParkedBucket, werr)
	case <-ctx.Done():
		cancel()
		<-done
		return func() {}, nil
	}
	return func() {
		cancel()
		<-done
	}, nil
}

func (r *runner) tryParking(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if p := r.js.Options().APIPrefix; p != "" && p != jetstream.DefaultAPIPrefix {
		// Through an API prefix, in an account of its own: the router's
		// account holds the stream and the bucket, and a LOCAL node
		// creates them there; the consumer may only look them up.
		if _, err := r.js.Stream(cctx, ParkedStream); err != nil {
			return fmt.Errorf("consumer: stream %s (a LOCAL router node creates it): %w", ParkedStream, err)
		}
		kv, err := r.js.KeyValue(cctx, ParkedBucket)
		if err != nil {
			return fmt.Errorf("consumer: bucket %s (a LOCAL router node creates it): %w", ParkedBucket, err)
		}
		r.parkedKV = kv
		return nil
	}
	kv, err := wire.EnsureParking(cctx, r.js, r.o.replicas)
	if err != nil {
		return fmt.Errorf("consumer: the parked stream and bucket (a LOCAL router node creates them): %w", err)
	}
	r.parkedKV = kv
	return nil
}

// applyParked applies a change of ParkedBucket (the record of key, or its
// deletion).
func (r *runner) applyParked(key string, deleted bool, value []byte, rev uint64) {
	group, err := kvbinding.GroupFromKey(key)
	if err != nil {
		r.log.Debug("consumer: ignoring a key of the parked bucket", "key", key, "err", err)
		return
	}
	st, mine, claimUntil := notParked, false, time.Time{}
	if !deleted {
		st = parkedState
		var rec ParkRecord
		if err := json.Unmarshal(value, &rec); err != nil {
			r.log.Debug("consumer: unreadable parked record; taken as parked", "group", group, "err", err)
		} else if rec.State == StateReplay {
			st, mine = replayState, rec.Node == r.node
			if rec.Replayer != "" && rec.Replayer != r.id {
				claimUntil = rec.ClaimedAt.Add(replayLease)
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if ahead, ok := r.parkedAhead[group]; ok {
		if rev < ahead {
			r.log.Debug("consumer: a parked record change older than one applied; ignored", "group", group, "revision", rev, "applied", ahead)
			return
		}
		delete(r.parkedAhead, group)
	}
	if st == notParked {
		delete(r.parkedSet, group)
	} else {
		r.parkedSet[group] = true
	}
	r.lanes.setRecord(group, st, mine, claimUntil, time.Now())
	if l := r.lanes.lanes[group]; l != nil {
		l.recRev = max(l.recRev, rev)
	}
	r.cond.Signal()
	r.log.Debug("consumer: parked record changed", "group", group, "state", st, "replay_here", mine)
}

// park moves d, the head of parked lane l, to the parked stream, then
// acks it. A failure leaves it at the head, tried again after a backoff.
func (r *runner) park(ctx context.Context, l *lane, d *delivery) {
	r.mu.Lock()
	group, reason, attempts := l.group, l.reason, l.attempts
	recorded := r.parkedSet[group]
	r.mu.Unlock()
	if reason == "" {
		reason = "its group is parked (" + ParkedBucket + ")" // by another process or node
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	if !recorded && !strings.HasPrefix(group, "\x00") {
		created, err := r.record(pctx, group, ParkRecord{Node: r.node, IngressSeq: d.seq, Reason: reason, Attempts: attempts, At: time.Now().UTC()}, false)
		if err != nil {
			r.warn("record", "consumer: could not record a parked group; trying again", "group", group, "err", err)
			r.finish(l, interrupted)
			return
		}
		if created {
			r.event(proposals.EventPark, group, d.seq, reason, attempts, 0)
		}
	}
	subject := strings.TrimPrefix(d.msg.Subject(), r.queuePrefix)
	out := nats.NewMsg(ParkedSubjectPrefix + r.node + "." + parkedKeyTokens(group) + "." + subject)
	for k, v := range d.msg.Headers() {
		if len(k) > 5 && strings.EqualFold(k[:5], "Nats-") {
			continue // the queue's delivery and dedup headers
		}
		out.Header[k] = v
	}
	out.Data = d.msg.Data()
	out.Header.Set(HeaderParkReason, reason)
	out.Header.Set(HeaderParkAttempts, strconv.Itoa(attempts))
	out.Header.Set(jetstream.MsgIDHeader, strconv.FormatUint(d.seq, 10))
	out.Header.Set(jetstream.ExpectedStreamHeader, ParkedStream)
	if _, err := r.js.PublishMsg(pctx, out); err != nil {
		r.warn("park", "consumer: could not park a message; trying again", "group", group, "ingress_seq", d.seq, "err", err)
		r.finish(l, interrupted)
		return
	}
	if parkedHook != nil {
		parkedHook(group, d.seq)
	}
	if !strings.HasPrefix(group, "\x00") {
		if err := r.touchParked(pctx, group, d.seq, reason, attempts); err != nil {
			// Published (a second publish is deduplicated), not acked:
			// tried again after a backoff.
			r.warn("record", "consumer: could not record a parked message; trying again", "group", group, "ingress_seq", d.seq, "err", err)
			r.finish(l, interrupted)
			return
		}
	}
	r.mu.Lock()
	cur := l.running
	r.mu.Unlock()
	if err := cur.msg.DoubleAck(pctx); err != nil {
		r.log.Debug("consumer: ack of a parked message not confirmed", "group", group, "ingress_seq", d.seq, "err", err)
	}
	r.m.parkedMsgs.Inc()
	r.log.Debug("consumer: parked a message", "group", group, "ingress_seq", d.seq, "reason", reason)
	r.finish(l, succeeded)
}

// parkedHook, if set (by tests only), runs after a message was published
// to the parked stream, before touchParked.
var parkedHook func(group string, seq uint64)

// touchParked tells a replay of group that a message was just parked: it
// writes the record again as it is, conditionally, so that a replay that
// has read the parked stream up to before this message fails to delete the
// record and reads on. Should the record be gone (a replay ended before the
// message landed: the process parked it on a view of the record that was
// already old), it records the group parked again, at this message, so
// that the group's later messages follow it rather than pass it; the
// operator's next retry replays it.
func (r *runner) touchParked(ctx context.Context, group string, seq uint64, reason string, attempts int) error {
	key, err := kvbinding.FullKey(group)
	if err != nil {
		return err
	}
	for range 5 {
		e, err := r.parkedKV.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			rec := ParkRecord{Node: r.node, IngressSeq: seq, Reason: "parked as a replay ended: " + reason, Attempts: attempts, At: time.Now().UTC()}
			created, err := r.record(ctx, group, rec, true)
			if err != nil {
				return err
			}
			if created {
				r.event(proposals.EventPark, group, seq, rec.Reason, attempts, 0)
				r.log.Warn("consumer: a message was parked as its group's replay ended; the group is parked again (retry replays it)",
					"group", group, "ingress_seq", seq)
				return nil
			}
			continue // recorded by another process meanwhile: touch that
		}
		if err != nil {
			return err
		}
		if _, err := r.parkedKV.Update(ctx, key, e.Value(), e.Revision()); err == nil || !casConflict(err) {
			return err
		}
	}
	return errors.New("consumer: the parked record kept changing")
}

// record writes group's parked record (first writer wins) and reports
// whether this call created it. With ahead, a record it created applies to
// the group's lane at once.
func (r *runner) record(ctx context.Context, group string, rec ParkRecord, ahead bool) (bool, error) {
	key, err := kvbinding.FullKey(group)
	if err != nil {
		return false, err
	}
	val, err := json.Marshal(rec)
	if err != nil {
		return false, err
	}
	created := true
	rev, err := r.parkedKV.Create(ctx, key, val)
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return false, err
		}
		created = false
	}
	r.mu.Lock()
	r.parkedSet[group] = true
	if created && ahead {
		// Parked again at once, not when the watch brings it (it may
		// first bring the delete before it): the group's next message must
		// not pass the one just parked.
		r.parkedAhead[group] = rev
		r.lanes.setRecord(group, parkedState, false, time.Time{}, time.Now())
		r.cond.Signal()
	}
	r.mu.Unlock()
	return created, nil
}

// event publishes an event about group (fire and forget, as the router's).
func (r *runner) event(kind, group string, seq uint64, reason string, attempts, count int) {
	proposals.Event{Kind: kind, Group: group, Node: r.node, FromSeq: seq, By: r.node, Reason: reason, Attempt: attempts, Count: count}.Publish(r.js.Conn())
}

// scanBarriers finds the node's queue messages delivered (to another
// process, or an earlier one) and not acked when Consume starts, so that
// their groups' lanes wait for their redelivery: a queue stream with work
// queue retention keeps exactly the unacknowledged ones.
func (r *runner) scanBarriers(ctx context.Context, info *jetstream.ConsumerInfo) {
	if info.NumAckPending == 0 {
		return
	}
	stream, err := r.js.Stream(ctx, wire.QueueStream)
	if err != nil {
		r.warn("scan", "consumer: cannot look for messages pending elsewhere; order across a restart is not guarded", "err", err)
		return
	}
	now := time.Now()
	found := 0
	for seq := info.AckFloor.Stream + 1; found < info.NumAckPending && seq <= info.Delivered.Stream; {
		gctx, cancel := context.WithTimeout(ctx, opTimeout)
		raw, err := stream.GetMsg(gctx, seq, jetstream.WithGetMsgSubject(wire.QueueFilter(r.node)))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			r.warn("scan", "consumer: cannot look for messages pending elsewhere; order across a restart is not guarded", "err", err)
			return
		}
		if raw.Sequence > info.Delivered.Stream {
			break
		}
		found++
		seq = raw.Sequence + 1
		is, err := strconv.ParseUint(raw.Header.Get(wire.HeaderIngressSeq), 10, 64)
		group, _ := wire.GroupOf(raw.Header, r.o.groupHeader)
		if err != nil || group == "" {
			continue
		}
		r.mu.Lock()
		r.lanes.addBarrier(group, barrier{seq: is, streamSeq: raw.Sequence, since: now}, now)
		r.mu.Unlock()
	}
	r.log.Debug("consumer: messages pending elsewhere at start", "count", found)
}

// rescan looks again for messages pending elsewhere (see scanBarriers).
func (r *runner) rescan() {
	ctx, cancel := context.WithTimeout(r.scanCtx, opTimeout)
	info, err := r.cons.Info(ctx)
	cancel()
	if err != nil {
		r.warn("scan", "consumer: cannot look for the deliveries this process missed; order with them is not guarded", "err", err)
		return
	}
	r.scanBarriers(r.scanCtx, info)
}

// checkBarriers lifts the barriers whose message is gone from the queue
// (acked by the other process, or moved away by a hand-over).
func (r *runner) checkBarriers(ctx context.Context, due map[string][]barrier) {
	if len(due) == 0 {
		return
	}
	stream, err := r.js.Stream(ctx, wire.QueueStream)
	if err != nil {
		return
	}
	for group, bs := range due {
		for _, b := range bs {
			gctx, cancel := context.WithTimeout(ctx, opTimeout)
			_, err := stream.GetMsg(gctx, b.streamSeq)
			cancel()
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				r.mu.Lock()
				r.lanes.liftBarrier(group, b.streamSeq, time.Now())
				r.cond.Signal()
				r.mu.Unlock()
				r.log.Debug("consumer: a message pending elsewhere is gone; its group goes on", "group", group, "ingress_seq", b.seq)
			}
		}
	}
}

// unpin releases this process's pin so that a standby gets the queue at
// once rather than after the pinned TTL; another client's pin is left.
func (r *runner) unpin(ctx context.Context, pinID string) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	info, err := r.cons.Info(uctx)
	if err != nil {
		r.log.Debug("consumer: unpin: consumer info", "err", err)
		return
	}
	for _, g := range info.PriorityGroups {
		if g.Group != wire.PriorityGroup || g.PinnedClientID != pinID {
			continue
		}
		s, err := r.js.Stream(uctx, wire.QueueStream)
		if err == nil {
			err = s.UnpinConsumer(uctx, info.Name, g.Group)
		}
		if err != nil {
			r.log.Warn("consumer: could not unpin; a standby gets the queue after the pinned TTL", "err", err, "ttl", info.Config.PinnedTTL)
			return
		}
		r.log.Debug("consumer: unpinned", "pin", pinID)
	}
}
