package kvbinding

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/jsack"
	"github.com/grouprouter/grouprouter/internal/retry"
)

// entryOp is what a bucket record does to its key.
type entryOp uint8

const (
	opPut entryOp = iota
	opDelete
)

// watchHooks receives what watchBucket reads.
type watchHooks struct {
	// start, if not nil, first learns how many initial records there are.
	start func(records uint64)
	// entry receives every record, in stream order.
	entry func(key string, op entryOp, value []byte, rev uint64)
	// ready is called once the initial records are done.
	ready func()
	// rewound, if not nil, turns the rewind check on (every rewindEvery):
	// when the bucket's stream went back below the last record delivered
	// (its servers lost acknowledged writes, and may store new ones under
	// the lost sequences), rewound learns it, with the last sequence
	// delivered and the stream's last now; the watch then starts again
	// from scratch: the latest record of every key (start, entry, ready
	// again), then every change.
	rewound     func(seen, last uint64)
	rewindEvery time.Duration
}

// WatchBucket follows the records of bucket whose keys match filter (a
// KV key filter: "x.*", ">"): first the latest record of every such key,
// then every change, calling entry for each in revision order (deleted for
// a delete or purge, whose value says nothing) and ready once the initial
// records are in. It returns when ctx ends, or with the error that keeps
// it from following the bucket (a missing bucket, a permissions
// violation); a cluster still forming or electing is waited out.
//
// Unlike KeyValue.Watch it needs only a pull consumer's API requests
// (CONSUMER.CREATE, MSG.NEXT, DELETE): it works through a JetStream API
// prefix, where an account reaches the bucket by service imports, which
// carry no push delivery.
func WatchBucket(ctx context.Context, js jetstream.JetStream, bucket, filter string, entry func(key string, deleted bool, value []byte, rev uint64), ready func()) error {
	return watchBucket(ctx, js, bucket, filter, watchHooks{
		entry: func(key string, op entryOp, value []byte, rev uint64) { entry(key, op == opDelete, value, rev) },
		ready: ready,
	})
}

// errRewound stops a watch whose stream went back below what it delivered.
var errRewound = errors.New("kvbinding: the bucket went back below what was read")

// watchBucket follows a KV bucket's stream with an ordered consumer: first
// the latest record of every key matching filter, then every change,
// calling h.entry for each in stream order and h.ready once the initial
// records are done. It returns when ctx ends.
//
// It exists instead of KeyValue.Watch because it resumes right after the
// last record it delivered when its consumer is lost (a server restart):
// measured here, the library watcher stalled ~20 s after a restart and can
// replay the whole bucket, while an ordered pull consumer resets as soon as
// the client reconnects. Resuming after the last record is also why it
// checks for a rewind (h.rewound): a consumer that resumes past the
// stream's end waits there, and never delivers what is stored again under
// the sequences the servers lost.
func watchBucket(ctx context.Context, js jetstream.JetStream, bucket, filter string, h watchHooks) error {
	for {
		seen, last, err := watchOnce(ctx, js, bucket, filter, h)
		if !errors.Is(err, errRewound) {
			return err
		}
		h.rewound(seen, last)
	}
}

// watchOnce is one watch of the bucket from scratch. It returns
// errRewound, with the last sequence delivered and the stream's last, when
// the rewind check found the stream behind.
func watchOnce(ctx context.Context, js jetstream.JetStream, bucket, filter string, h watchHooks) (seen, last uint64, _ error) {
	stream := "KV_" + bucket
	prefix := "$KV." + bucket + "."
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{prefix + filter},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	}
	// A failure to start following the bucket is a cluster still forming
	// or electing, and is retried until ctx ends, unless waiting cannot fix
	// it; a missing bucket is reported (the bucket is created before it is
	// watched, and ScanBindings reports a missing one).
	var cons jetstream.Consumer
	backoff := retry.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for {
		before := js.Conn().LastError()
		var err error
		cons, err = js.OrderedConsumer(ctx, stream, cfg)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		if v := retry.Violation(js.Conn(), before); v != nil {
			return 0, 0, fmt.Errorf("kvbinding: watch %s: %w (%w)", bucket, v, err)
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) || retry.Permanent(err) {
			return 0, 0, fmt.Errorf("kvbinding: watch %s: %w", bucket, err)
		}
		if err := retry.Sleep(ctx, backoff.Next()); err != nil {
			return 0, 0, err
		}
	}
	readyDone := false
	if info := cons.CachedInfo(); info != nil {
		if h.start != nil {
			h.start(info.NumPending)
		}
		if info.NumPending == 0 {
			h.ready()
			readyDone = true
		}
	}
	// The iterator, not Consume: Consume saved a timer per message, but an
	// ordered Consume only reports a re-create that fails, and with it the
	// soak test failed in two of three runs (none in six with Next).
	it, err := cons.Messages(jetstream.PullMaxMessages(4096), jetstream.PullHeartbeat(time.Second), jetstream.PullExpiry(5*time.Second))
	if err != nil {
		return 0, 0, fmt.Errorf("kvbinding: watch %s: %w", bucket, err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	var tail *watchTail
	if h.rewound != nil {
		tail = &watchTail{}
		cctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			tail.checkLoop(cctx, js, stream, h.rewindEvery, it.Stop)
		}()
		defer wg.Wait()
		defer cancel()
	}
	for {
		msg, err := it.Next()
		if err != nil {
			if tail != nil {
				if seen, last, ok := tail.verdict(); ok {
					return seen, last, errRewound
				}
			}
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return 0, 0, ctx.Err()
			}
			continue
		}
		d, ok := jsack.Parse(msg.Reply())
		seq, pending := d.StreamSeq, d.Pending
		if !ok {
			meta, err := msg.Metadata()
			if err != nil {
				continue
			}
			seq, pending = meta.Sequence.Stream, meta.NumPending
		}
		subj := msg.Subject()
		if tail != nil {
			tail.delivered(seq, subj, msg.Data())
		}
		if len(subj) > len(prefix) {
			op := opPut
			if h := msg.Headers(); h != nil && (h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != "") {
				op = opDelete
			}
			h.entry(subj[len(prefix):], op, msg.Data(), seq)
		}
		if !readyDone && pending == 0 {
			h.ready()
			readyDone = true
		}
	}
}

// defaultRewindEvery is how often a watch checks its stream for a rewind.
const defaultRewindEvery = 5 * time.Second

// watchTail is the last record a watch delivered, for the rewind check.
type watchTail struct {
	mu   sync.Mutex
	seq  uint64
	subj string
	data []byte // the delivered message's own slice: never written to

	found      bool // a rewind was found: seen and last
	seen, last uint64
}

func (t *watchTail) delivered(seq uint64, subj string, data []byte) {
	t.mu.Lock()
	t.seq, t.subj, t.data = seq, subj, data
	t.mu.Unlock()
}

func (t *watchTail) verdict() (seen, last uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.seen, t.last, t.found
}

// checkLoop checks every period whether the stream went back below the
// last record delivered, and stops the watch (stop) when it did. A failed
// check (a server down, an election) is tried again at the next tick.
func (t *watchTail) checkLoop(ctx context.Context, js jetstream.JetStream, stream string, every time.Duration, stop func()) {
	if every <= 0 {
		every = defaultRewindEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		t.mu.Lock()
		seq, subj, data := t.seq, t.subj, t.data
		t.mu.Unlock()
		if seq == 0 {
			continue
		}
		last, rewound, err := checkTail(ctx, js, stream, seq, subj, data)
		if err != nil {
			continue
		}
		if rewound {
			t.mu.Lock()
			t.found, t.seen, t.last = true, seq, last
			t.mu.Unlock()
			stop()
			return
		}
	}
}

// A stream's end read below what a watch delivered is not a loss by
// itself. STREAM.INFO is answered from the answering server's store: the
// stream leader's, which stores a record when it applies it, and may apply
// later than a follower, where the watch's consumer (one replica, placed
// on any member) delivered it from; or, while the group has no leader,
// any member's. With no fault at all, on 3 servers under load, the
// leader's answer was seen 2,067 records behind a consumer on a follower,
// and a default bench run without faults logged a rewind 2,498 behind.
// A real rewind lasts: the end stays below until new writes reuse the lost
// sequences, and then the sequence holds another record. So checkTail
// decides only from a leader's answer, and reads again while the end is
// below, until it reaches the sequence or rewindConfirm passes.
const (
	rewindConfirm     = 2 * time.Second
	rewindConfirmPoll = 100 * time.Millisecond
)

// errNoLeader is checkTail's answer when only members of a group without a
// leader answered: their state may be behind; no verdict.
var errNoLeader = errors.New("kvbinding: stream info answered without a stream leader")

// checkTail decides whether stream lost the record a watch delivered at
// seq with subj and data, reading it until tailVerdict decides or
// rewindConfirm passes. It returns the stream's last sequence read, or an
// error when it cannot tell now (errNoLeader: no leader answered).
func checkTail(ctx context.Context, js jetstream.JetStream, stream string, seq uint64, subj string, data []byte) (last uint64, rewound bool, err error) {
	deadline := time.Now().Add(rewindConfirm)
	for {
		last, at, leader, err := readTail(ctx, js, stream, seq)
		if err != nil {
			return 0, false, err
		}
		final := !time.Now().Before(deadline)
		if rewound, decided := tailVerdict(seq, subj, data, last, at, leader, final); decided {
			return last, rewound, nil
		}
		if final {
			return 0, false, errNoLeader
		}
		select {
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-time.After(rewindConfirmPoll):
		}
	}
}

// tailVerdict decides from one read of the stream (tailRewound's last and
// at; leader: a stream leader answered) whether it lost what a watch read
// at seq, or that it cannot tell yet (decided false): only a leader's
// answer counts, and one that ends below seq only when it is final (the
// last read before rewindConfirm passed).
func tailVerdict(seq uint64, subj string, data []byte, last uint64, at *storedMsg, leader, final bool) (rewound, decided bool) {
	if !leader || (last < seq && !final) {
		return false, false
	}
	return tailRewound(seq, subj, data, last, at), true
}

// storedMsg is what a stream holds at a sequence (nil: nothing).
type storedMsg struct {
	subj string
	seq  uint64
	data []byte
}

// readTail reads the stream's last sequence and, if it reaches seq, what
// it holds at seq; leader is false when the answer came from a member of
// a group without a leader.
func readTail(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (last uint64, at *storedMsg, leader bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, nil, false, err
	}
	info := s.CachedInfo()
	last, leader = info.State.LastSeq, info.Cluster == nil || info.Cluster.Leader != ""
	if last < seq {
		return last, nil, leader, nil
	}
	m, err := msgGet(ctx, js, stream, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return last, nil, leader, nil
	case err != nil:
		return 0, nil, false, err
	}
	return last, m, leader, nil
}

// msgGet reads the message at seq of stream with a STREAM.MSG.GET request,
// never a direct get, whatever the stream allows: its answer is JSON around
// the message, not the stored message itself, so that a reply subject aimed
// at a bucket key (a requester may name any) stores no copy of a record
// there. Node users are given this request on the bindings bucket, not the
// direct get.
func msgGet(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (*storedMsg, error) {
	return leaderGet(ctx, js, stream, `{"seq":`+strconv.FormatUint(seq, 10)+`}`, "message "+strconv.FormatUint(seq, 10))
}

// lastMsg reads the last message of stream on subject (wildcards allowed)
// from the stream's leader.
func lastMsg(ctx context.Context, js jetstream.JetStream, stream, subject string) (*storedMsg, error) {
	req, _ := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{subject})
	return leaderGet(ctx, js, stream, string(req), "the last message on "+subject)
}

// leaderGet asks stream's leader for one message (STREAM.MSG.GET with
// req); what names it in errors.
func leaderGet(ctx context.Context, js jetstream.JetStream, stream, req, what string) (*storedMsg, error) {
	o := js.Options()
	prefix := jetstream.DefaultAPIPrefix
	switch {
	case o.Domain != "":
		prefix = "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		prefix = strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	resp, err := js.Conn().RequestWithContext(ctx, prefix+"STREAM.MSG.GET."+stream, []byte(req))
	if err != nil {
		return nil, err
	}
	var r struct {
		Message *struct {
			Subject string `json:"subject"`
			Seq     uint64 `json:"seq"`
			Data    []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return nil, fmt.Errorf("kvbinding: get %s of %s: %w", what, stream, err)
	}
	switch {
	case r.Error != nil && r.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case r.Error != nil:
		return nil, fmt.Errorf("kvbinding: get %s of %s: %w", what, stream, r.Error)
	case r.Message == nil:
		return nil, fmt.Errorf("kvbinding: get %s of %s: an answer without a message", what, stream)
	}
	return &storedMsg{subj: r.Message.Subject, seq: r.Message.Seq, data: r.Message.Data}, nil
}

// tailRewound decides whether a stream lost what a watch read: the watch
// delivered subj with data at seq; the stream's last sequence is now last,
// and it holds at (nil: nothing) at seq. The stream went back if its end is
// below seq, or if seq holds another record now (the sequence was lost and
// used again). Nothing at seq is no verdict: a newer record of the same key
// replaced it (the watch gets that one next).
func tailRewound(seq uint64, subj string, data []byte, last uint64, at *storedMsg) bool {
	switch {
	case last < seq:
		return true
	case at == nil:
		return false
	default:
		return at.subj != subj || !bytes.Equal(at.data, data)
	}
}
