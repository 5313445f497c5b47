package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/wire"
)

// ReplayMode says what Replay does with a parked group's messages.
type ReplayMode string

const (
	// ReplayRetry replays every parked message in order; one that fails
	// its attempts again parks the group again at it.
	ReplayRetry ReplayMode = "retry"
	// ReplaySkip drops the first parked message unhandled (an event and a
	// warning with its ingress seq), then replays the rest as ReplayRetry.
	ReplaySkip ReplayMode = "skip"
	// ReplayRelease replays every parked message in order and releases the
	// group whatever happens: a message that fails its attempts again is
	// dropped (an event and a warning) instead of parking the group.
	ReplayRelease ReplayMode = "release"
)

// ParkedGroup is a parked group as ListParked and GetParked report it.
type ParkedGroup struct {
	Group  string
	Record ParkRecord
	// Messages is how many of its messages ParkedStream holds.
	Messages uint64
	// Head is the ingress seq of its first parked message (0: none).
	Head uint64
	// Revision is the record's revision in ParkedBucket.
	Revision uint64
}

// ListParked returns the parked groups, sorted by group. No bucket or
// stream yet gives none.
func ListParked(ctx context.Context, js jetstream.JetStream) ([]ParkedGroup, error) {
	out, _, err := ListParkedFirst(ctx, js, -1)
	return out, err
}

// ListParkedFirst returns the first n parked groups by group id (every
// one when n < 0) and how many groups are parked in all: a status page
// shows some of many at the cost of one record read each. No bucket or
// stream yet gives none.
func ListParkedFirst(ctx context.Context, js jetstream.JetStream, n int) ([]ParkedGroup, int, error) {
	kv, err := js.KeyValue(ctx, ParkedBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("consumer: bucket %s: %w", ParkedBucket, err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("consumer: bucket %s: %w", ParkedBucket, err)
	}
	type keyed struct{ group, key string }
	var keys []keyed
	for k := range lister.Keys() {
		if group, err := kvbinding.GroupFromKey(k); err == nil {
			keys = append(keys, keyed{group, k})
		}
	}
	slices.SortFunc(keys, func(a, b keyed) int { return strings.Compare(a.group, b.group) })
	total := len(keys)
	if n >= 0 && len(keys) > n {
		keys = keys[:n]
	}
	counts, err := parkedCounts(ctx, js)
	if err != nil {
		return nil, 0, err
	}
	var out []ParkedGroup
	for _, k := range keys {
		pg, err := getParked(ctx, js, kv, k.group, k.key)
		if errors.Is(err, ErrNotParked) {
			total--
			continue // released meanwhile
		}
		if err != nil {
			return nil, 0, err
		}
		pg.Messages = counts[k.key]
		out = append(out, pg)
	}
	return out, total, nil
}

// openParked reads group's parked record and messages, with the bucket
// and the group's key in it, or returns ErrNotParked.
func openParked(ctx context.Context, js jetstream.JetStream, group string) (ParkedGroup, jetstream.KeyValue, string, error) {
	key, err := kvbinding.FullKey(group)
	if err != nil {
		return ParkedGroup{}, nil, "", fmt.Errorf("%w: %v", ErrConfig, err)
	}
	kv, err := js.KeyValue(ctx, ParkedBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return ParkedGroup{}, nil, "", ErrNotParked
	}
	if err != nil {
		return ParkedGroup{}, nil, "", fmt.Errorf("consumer: bucket %s: %w", ParkedBucket, err)
	}
	pg, err := getParked(ctx, js, kv, group, key)
	return pg, kv, key, err
}

// GetParked returns group's parked record and messages, or ErrNotParked.
func GetParked(ctx context.Context, js jetstream.JetStream, group string) (ParkedGroup, error) {
	pg, _, key, err := openParked(ctx, js, group)
	if err != nil {
		return pg, err
	}
	counts, err := parkedCounts(ctx, js)
	if err != nil {
		return pg, err
	}
	pg.Messages = counts[key]
	return pg, nil
}

func getParked(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, group, key string) (ParkedGroup, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ParkedGroup{}, ErrNotParked
	}
	if err != nil {
		return ParkedGroup{}, fmt.Errorf("consumer: parked record of %q: %w", group, err)
	}
	pg := ParkedGroup{Group: group, Revision: e.Revision()}
	if err := json.Unmarshal(e.Value(), &pg.Record); err != nil {
		return pg, fmt.Errorf("consumer: parked record of %q: %w", group, err)
	}
	if pg.Head, err = parkedHead(ctx, js, key, pg.Record.SkipSeq); err != nil {
		return pg, err
	}
	return pg, nil
}

// parkedHead returns the ingress seq of the group's first parked message
// above after (0: none).
func parkedHead(ctx context.Context, js jetstream.JetStream, key string, after uint64) (uint64, error) {
	s, err := js.Stream(ctx, ParkedStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("consumer: stream %s: %w", ParkedStream, err)
	}
	filter := ParkedSubjectPrefix + "*." + key + ".>"
	for seq := uint64(1); ; {
		raw, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("consumer: stream %s: %w", ParkedStream, err)
		}
		is, _ := strconv.ParseUint(raw.Header.Get(wire.HeaderIngressSeq), 10, 64)
		if is > after {
			return is, nil
		}
		seq = raw.Sequence + 1
	}
}

// parkedCounts returns the number of parked messages per group key.
func parkedCounts(ctx context.Context, js jetstream.JetStream) (map[string]uint64, error) {
	s, err := js.Stream(ctx, ParkedStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("consumer: stream %s: %w", ParkedStream, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(ParkedSubjectPrefix+">"))
	if err != nil {
		return nil, fmt.Errorf("consumer: stream %s: %w", ParkedStream, err)
	}
	out := make(map[string]uint64)
	for subj, n := range info.State.Subjects {
		if _, key, _, ok := parkedSubjectParts(subj); ok {
			out[key] += n
		}
	}
	return out, nil
}

// Replay asks for group's parked messages to be replayed in mode: the
// Consume of node (the record's node when node is "") handles them in
// ingress order before any later message of the group, then deletes the
// record (see docs/consuming.md, "Replay"). It returns the group as it
// was asked, Messages counting its parked messages (for ReplaySkip, Head
// is the message to be skipped, counted in Messages). It
// returns ErrNotParked, ErrReplaying when a replay claimed by a live
// process runs, ErrNothingToSkip, or ErrConfig for a bad group or mode.
func Replay(ctx context.Context, js jetstream.JetStream, group string, mode ReplayMode, node string) (ParkedGroup, error) {
	switch mode {
	case ReplayRetry, ReplaySkip, ReplayRelease:
	default:
		return ParkedGroup{}, fmt.Errorf("%w: replay mode %q", ErrConfig, mode)
	}
	if node != "" {
		if err := kvbinding.ValidateNodeID(node); err != nil {
			return ParkedGroup{}, fmt.Errorf("%w: node: %v", ErrConfig, err)
		}
	}
	// A conditional write: a process parking one more message of the
	// group writes the record again as it is (touchParked), so a conflict
	// reads the record again, a few times, before it gives up.
	var pg ParkedGroup
	for range 5 {
		var (
			kv  jetstream.KeyValue
			key string
			err error
		)
		pg, kv, key, err = openParked(ctx, js, group)
		if err != nil {
			return pg, err
		}
		rec := pg.Record
		if rec.State == StateReplay && rec.Replayer != "" && time.Now().Before(rec.ClaimedAt.Add(replayLease)) {
			return pg, fmt.Errorf("%w: by %s on node %s since %s", ErrReplaying, rec.Replayer, rec.Node, rec.ClaimedAt.Format(time.RFC3339))
		}
		if mode == ReplaySkip {
			if pg.Head == 0 {
				return pg, ErrNothingToSkip
			}
			rec.SkipSeq = pg.Head
		}
		rec.State, rec.Mode = StateReplay, mode
		rec.Replayer, rec.ClaimedAt, rec.Claims = "", time.Time{}, 0
		if node != "" {
			rec.Node = node
		}
		// How many it replays, counted before the replay job can drop
		// any: a message parked after the count rewrote the record, so
		// the update below conflicts and counts again.
		counts, err := parkedCounts(ctx, js)
		if err != nil {
			return pg, err
		}
		pg.Messages = counts[key]
		val, err := json.Marshal(rec)
		if err != nil {
			return pg, err
		}
		rev, err := kv.Update(ctx, key, val, pg.Revision)
		if casConflict(err) {
			continue
		}
		if err != nil {
			return pg, fmt.Errorf("consumer: parked record of %q: %w", group, err)
		}
		pg.Record, pg.Revision = rec, rev
		return pg, nil
	}
	return pg, fmt.Errorf("%w: the record kept changing; look again", ErrReplaying)
}
