package kvbinding

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/jspub"
)

// DefaultBucket is the bindings bucket name.
const DefaultBucket = "grouping-bindings"

// StoreConfig configures the bindings bucket.
type StoreConfig struct {
	// Bucket defaults to DefaultBucket.
	Bucket string
	// Replicas of the bucket's stream; 0 means 1.
	Replicas int
	// MaxBytes bounds the bucket (0: no bound); past it new bindings are
	// refused (and retried by the nodes) until ended records expire.
	MaxBytes int64
}

// MaxBindingSize bounds one binding record: a group id of MaxGroupIDLen
// bytes escaped at worst (6 bytes a byte), with the other fields.
const MaxBindingSize = 8 << 10

func orUnlimited(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// Store reads and writes bindings in a JetStream KV bucket. Writes are
// create or compare-and-set only, so concurrent writers converge on one
// binding per group. It is safe for concurrent use.
type Store struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	bucket string

	pubOnce sync.Once
	pub     *jspub.Publisher
	pubErr  error

	// legacy says under which legacy full key a group's record stands,
	// if it does (see UseLegacyKeys).
	legacy atomic.Pointer[func(group string) (string, bool)]
}

// UseLegacyKeys makes the store read and write a group's record under the
// key fn names, when fn says so, instead of Key(group). fn is the binding
// cache's LegacyKey: a record of a long id written before digest keys
// stays under its full key ("r."/"b.", longer than MaxKeyLen) for as long
// as it stands, and only a group without such a record gets a digest key.
// Safe to call while the store is in use.
func (s *Store) UseLegacyKeys(fn func(group string) (string, bool)) {
	s.legacy.Store(&fn)
}

// keyFor returns the key of group's record: Key(group), or the legacy key
// its record stands under.
func (s *Store) keyFor(group string) (string, error) {
	key, err := KeyOf(group)
	if err != nil || len(key) != digestKeyLen {
		return key, err
	}
	if fn := s.legacy.Load(); fn != nil {
		if lk, ok := (*fn)(group); ok {
			return lk, nil
		}
	}
	return key, nil
}

// OpenStore creates the bindings bucket if it is missing and returns a
// Store on it. An existing bucket is used as it is.
func OpenStore(ctx context.Context, js jetstream.JetStream, cfg StoreConfig) (*Store, error) {
	if cfg.Bucket == "" {
		cfg.Bucket = DefaultBucket
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	kv, err := openBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "grouprouter: group id -> node bindings",
		History:     1,
		Replicas:    cfg.Replicas,
		Storage:     jetstream.FileStorage,
		// Ended records (released, dead-lettered) carry a per-message TTL;
		// their expiry leaves a marker for this long so watchers see it.
		LimitMarkerTTL: time.Minute,
		MaxValueSize:   MaxBindingSize,
		MaxBytes:       orUnlimited(cfg.MaxBytes),
	})
	if err != nil {
		return nil, err
	}
	return &Store{js: js, kv: kv, bucket: cfg.Bucket}, nil
}

// openBucket binds to a bucket, creating it when it does not exist yet.
func openBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("kvbinding: open bucket %s: %w", cfg.Bucket, err)
	}
	kv, err = js.CreateKeyValue(ctx, cfg)
	if err != nil {
		// Another node may have created it between the two calls.
		if kv2, err2 := js.KeyValue(ctx, cfg.Bucket); err2 == nil {
			return kv2, nil
		}
		return nil, fmt.Errorf("kvbinding: create bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// LastRevision returns the sequence of the last record of the bucket (0:
// the bucket holds none). The stream's leader answers (not a direct get,
// which any replica may answer from what it has), so the answer is as
// recent as the servers' quorum, but for a leader cut off from it that has
// not stepped down yet.
func (s *Store) LastRevision(ctx context.Context) (uint64, error) {
	m, err := lastMsg(ctx, s.js, "KV_"+s.bucket, "$KV."+s.bucket+".>")
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	}
	return m.seq, nil
}

// KV returns the underlying bucket.
func (s *Store) KV() jetstream.KeyValue { return s.kv }

// Bucket returns the bucket name.
func (s *Store) Bucket() string { return s.bucket }

// Create writes b if the group has no binding (or only a deleted one) and
// returns it with its revision. If a binding exists it returns that binding
// and an error wrapping ErrExists.
func (s *Store) Create(ctx context.Context, b Binding) (Binding, error) {
	key, val, err := s.encode(b)
	if err != nil {
		return Binding{}, err
	}
	rev, err := s.kv.Create(ctx, key, val)
	if err == nil {
		b.Revision = rev
		return b, nil
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		cur, gerr := s.Get(ctx, b.Group)
		if gerr != nil {
			if errors.Is(gerr, ErrNotFound) {
				// Deleted between the two calls: let the caller retry.
				return Binding{}, fmt.Errorf("%w: %v", ErrConflict, err)
			}
			return Binding{}, gerr
		}
		return cur, fmt.Errorf("%w: group %q bound to %q", ErrExists, shortID(b.Group), cur.Node)
	}
	return Binding{}, fmt.Errorf("kvbinding: create %q: %w", shortID(b.Group), err)
}

// CreateResult is the outcome of one create of CreateMany.
type CreateResult struct {
	Binding Binding
	Err     error
}

// CreateMany is Create for many groups at once, pipelined (WriteMany
// with no expected revision). Results are in the order of bs; a group that
// has a record gets that record and an error wrapping ErrExists.
func (s *Store) CreateMany(ctx context.Context, bs []Binding) []CreateResult {
	ws := make([]Write, len(bs))
	for i, b := range bs {
		ws[i] = Write{Binding: b}
	}
	return s.WriteMany(ctx, ws)
}

// Write is one record write of WriteMany.
type Write struct {
	Binding Binding
	// Rev is the revision the write expects the key to be at; 0 means the
	// key must have no record (a create).
	Rev uint64
	// TTL, when > 0, makes the record expire (an ended record).
	TTL time.Duration
}

// WriteMany writes many records at once, each a compare-and-set on its
// Rev (a create for 0), pipelined instead of one round trip each. Results
// are in the order of ws: the written record, or the record that stands
// and an error wrapping ErrConflict (ErrExists for a create).
func (s *Store) WriteMany(ctx context.Context, ws []Write) []CreateResult {
	return s.WriteManyThen(ctx, ws, nil)
}

// WriteManyThen is WriteMany, calling stored (when not nil) for each
// write stored by its first attempt as soon as its PubAck comes, with the
// written record, from the publisher's goroutine: the caller can count it
// before the rest of the batch is acknowledged.
func (s *Store) WriteManyThen(ctx context.Context, ws []Write, stored func(i int, b Binding)) []CreateResult {
	out := make([]CreateResult, len(ws))
	pub, err := s.publisher()
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	var wg sync.WaitGroup
	prefix := "$KV." + s.bucket + "."
	for i := range ws {
		key, val, err := s.encode(ws[i].Binding)
		if err != nil {
			out[i].Err = err
			continue
		}
		hdr := nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(ws[i].Rev, 10)}}
		if ws[i].TTL > 0 {
			hdr[jetstream.MsgTTLHeader] = []string{ttlHeader(ws[i].TTL)}
		}
		msg := &nats.Msg{Subject: prefix + key, Header: hdr, Data: val}
		wg.Add(1)
		err = pub.Publish(msg, func(ack jspub.Ack, err error) {
			defer wg.Done()
			if err != nil {
				out[i].Err = err
				return
			}
			out[i].Binding = ws[i].Binding
			out[i].Binding.Revision = ack.Sequence
			if stored != nil {
				stored(i, out[i].Binding)
			}
		})
		if err != nil {
			out[i].Err = err
			wg.Done()
		}
	}
	wg.Wait()
	for i := range out {
		if out[i].Err == nil {
			continue
		}
		if errors.Is(out[i].Err, ErrInvalidGroupID) || errors.Is(out[i].Err, ErrInvalidBinding) {
			continue
		}
		// Changed meanwhile (or the ack was lost): settle it with a plain
		// write, which reports what stands.
		w := ws[i]
		switch {
		case w.TTL > 0:
			out[i].Binding, out[i].Err = s.ReplaceTTL(ctx, w.Binding, w.Rev, w.TTL)
		case w.Rev == 0:
			out[i].Binding, out[i].Err = s.Create(ctx, w.Binding)
		default:
			out[i].Binding, out[i].Err = s.Replace(ctx, w.Binding, w.Rev)
		}
	}
	return out
}

// FillKey is the key Advance writes: no group's (the cache and List skip
// it), it holds one empty value, and only its revisions matter.
const FillKey = "fill"

// advanceWindow bounds the fill writes Advance has in flight.
const advanceWindow = 1024

// Advance writes FillKey until the bucket's last revision is at least
// through, and returns the last revision written (0 when it wrote none).
// After the bucket went back below revisions that nodes had read, it
// keeps the next records from reusing them (Cache.RewoundThrough). It
// writes as many values as the bucket is behind, in pipelined rounds;
// stopped by ctx or an error, it can be called again and goes on from
// where the bucket is.
func (s *Store) Advance(ctx context.Context, through uint64) (uint64, error) {
	pub, err := s.publisher()
	if err != nil {
		return 0, err
	}
	subject := "$KV." + s.bucket + "." + FillKey
	var last uint64
	for n := uint64(1); ; {
		var mu sync.Mutex
		var first error
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			perr := pub.Publish(&nats.Msg{Subject: subject}, func(ack jspub.Ack, err error) {
				defer wg.Done()
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					first = cmp.Or(first, err)
					return
				}
				last = max(last, ack.Sequence)
			})
			if perr != nil {
				wg.Done()
				mu.Lock()
				first = cmp.Or(first, perr)
				mu.Unlock()
				break
			}
		}
		wg.Wait()
		if first != nil {
			return last, fmt.Errorf("kvbinding: advance bucket %s to revision %d: %w", s.bucket, through, first)
		}
		if last >= through {
			return last, nil
		}
		if err := ctx.Err(); err != nil {
			return last, fmt.Errorf("kvbinding: advance bucket %s to revision %d: at %d: %w", s.bucket, through, last, err)
		}
		n = min(through-last, advanceWindow)
	}
}

func (s *Store) publisher() (*jspub.Publisher, error) {
	s.pubOnce.Do(func() { s.pub, s.pubErr = jspub.New(s.js.Conn(), 5*time.Second) })
	return s.pub, s.pubErr
}

// Close releases what the store started for CreateMany.
func (s *Store) Close() {
	s.pubOnce.Do(func() {}) // no publisher may start after Close
	if s.pub != nil {
		s.pub.Close()
	}
}

// Replace writes b over the record at revision rev. If the record changed
// since, it returns the current one and an error wrapping ErrConflict.
func (s *Store) Replace(ctx context.Context, b Binding, rev uint64) (Binding, error) {
	key, val, err := s.encode(b)
	if err != nil {
		return Binding{}, err
	}
	nrev, err := s.kv.Update(ctx, key, val, rev)
	if err == nil {
		b.Revision = nrev
		return b, nil
	}
	// A revision mismatch also matches ErrKeyExists: test it first.
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		cur, gerr := s.Get(ctx, b.Group)
		if gerr != nil && !errors.Is(gerr, ErrNotFound) {
			return Binding{}, gerr
		}
		return cur, fmt.Errorf("%w: group %q", ErrConflict, shortID(b.Group))
	}
	return Binding{}, fmt.Errorf("kvbinding: replace %q: %w", shortID(b.Group), err)
}

// ReplaceTTL is Replace for a record that should disappear by itself after
// ttl (ended records: released, dead-lettered). rev 0 means the group must
// have no record. The TTL is rounded up to whole seconds.
func (s *Store) ReplaceTTL(ctx context.Context, b Binding, rev uint64, ttl time.Duration) (Binding, error) {
	key, val, err := s.encode(b)
	if err != nil {
		return Binding{}, err
	}
	msg := nats.NewMsg("$KV." + s.bucket + "." + key)
	msg.Header.Set(jetstream.MsgTTLHeader, ttlHeader(ttl))
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	msg.Data = val
	ack, err := s.js.PublishMsg(ctx, msg)
	if err == nil {
		b.Revision = ack.Sequence
		return b, nil
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == 10164) {
		cur, gerr := s.Get(ctx, b.Group)
		if gerr != nil && !errors.Is(gerr, ErrNotFound) {
			return Binding{}, gerr
		}
		if rev == 0 {
			if gerr == nil {
				return cur, fmt.Errorf("%w: group %q has a record", ErrExists, shortID(b.Group))
			}
			// Only a delete or expiry marker stands: write over it.
			if last, lerr := s.lastRevision(ctx, key); lerr == nil && last > 0 {
				return s.ReplaceTTL(ctx, b, last, ttl)
			}
		}
		return cur, fmt.Errorf("%w: group %q", ErrConflict, shortID(b.Group))
	}
	return Binding{}, fmt.Errorf("kvbinding: replace %q: %w", shortID(b.Group), err)
}

// encode returns the key and value of a binding record.
func (s *Store) encode(b Binding) (key string, val []byte, err error) {
	if key, err = s.keyFor(b.Group); err != nil {
		return "", nil, err
	}
	val, err = b.Marshal()
	return key, val, err
}

// lastRevision returns the stream sequence of the key's last message,
// whatever its operation (a value, a delete or an expiry marker).
func (s *Store) lastRevision(ctx context.Context, key string) (uint64, error) {
	st, err := s.js.Stream(ctx, "KV_"+s.bucket)
	if err != nil {
		return 0, err
	}
	m, err := st.GetLastMsgForSubject(ctx, "$KV."+s.bucket+"."+key)
	if err != nil {
		return 0, err
	}
	return m.Sequence, nil
}

// Delete removes the group's binding if it is still at revision rev.
func (s *Store) Delete(ctx context.Context, group string, rev uint64) error {
	key, err := s.keyFor(group)
	if err != nil {
		return err
	}
	err = s.kv.Delete(ctx, key, jetstream.LastRevision(rev))
	if err == nil {
		return nil
	}
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("%w: group %q", ErrConflict, shortID(group))
	}
	return fmt.Errorf("kvbinding: delete %q: %w", shortID(group), err)
}

// Get returns the group's binding, or an error wrapping ErrNotFound. The
// record under the group's key must be the group's: another group's there
// (a digest key collision, or a forged record) is an error wrapping
// ErrKeyCollision.
func (s *Store) Get(ctx context.Context, group string) (Binding, error) {
	key, err := s.keyFor(group)
	if err != nil {
		return Binding{}, err
	}
	e, err := s.kv.Get(ctx, key)
	if lk, long := LegacyKey(group); long && key != lk && errors.Is(err, jetstream.ErrKeyNotFound) {
		// A record written before digest keys, which a store without the
		// cache's LegacyKey does not know of.
		e, err = s.kv.Get(ctx, lk)
	}
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return Binding{}, fmt.Errorf("%w: %q", ErrNotFound, shortID(group))
		}
		return Binding{}, fmt.Errorf("kvbinding: get %q: %w", shortID(group), err)
	}
	b, err := UnmarshalBinding(e.Value())
	if err == nil && b.Group != group {
		return Binding{}, fmt.Errorf("%w: key %q, asked for group %q, holds group %q", ErrKeyCollision, key, shortID(group), shortID(b.Group))
	}
	return decodeEntry(e)
}

// shortID cuts a group id for an error message or a log line: at most 64
// bytes (on a rune boundary) and how many were left out.
func shortID(id string) string {
	const max = 64
	if len(id) <= max {
		return id
	}
	cut := max
	for cut > 0 && id[cut]&0xC0 == 0x80 {
		cut--
	}
	return id[:cut] + "...(+" + strconv.Itoa(len(id)-cut) + " bytes)"
}

// List returns every binding in the bucket, in key order of the stream.
func (s *Store) List(ctx context.Context) ([]Binding, error) {
	w, err := s.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("kvbinding: list: %w", err)
	}
	defer w.Stop()
	var out []Binding
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return out, nil
			}
			if e == nil {
				return out, nil
			}
			b, err := decodeEntry(e)
			if err != nil {
				continue // not ours (foreign key): skip rather than fail the listing
			}
			out = append(out, b)
		}
	}
}

func decodeEntry(e jetstream.KeyValueEntry) (Binding, error) {
	b, err := UnmarshalBinding(e.Value())
	if err != nil {
		return Binding{}, fmt.Errorf("key %q: %w", e.Key(), err)
	}
	if !KeyHolds(e.Key(), b.Group) {
		return Binding{}, fmt.Errorf("%w: key %q holds group %q", ErrInvalidBinding, e.Key(), shortID(b.Group))
	}
	b.Revision = e.Revision()
	return b, nil
}
