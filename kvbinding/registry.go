package kvbinding

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/retry"
)

// DefaultNodesBucket is the node registry bucket name.
const DefaultNodesBucket = "grouping-nodes"

// Key prefixes inside the node registry bucket.
const (
	livePrefix  = "live."
	leasePrefix = "lease."
	ckptPrefix  = "ckpt."
)

// LiveKey returns the key of node's liveness record in the registry bucket.
func LiveKey(node string) string { return livePrefix + node }

// LeaseKey returns the key of the named handler lease.
func LeaseKey(name string) string { return leasePrefix + name }

// CheckpointKey returns the key of node's checkpoint.
func CheckpointKey(node string) string { return ckptPrefix + node }

// FloorKey is the key of the routing floor (see Floor).
const FloorKey = "floor"

// NodeInfo is what a node announces about itself while it is alive.
type NodeInfo struct {
	Node string `json:"node"`
	// Instance identifies the process announcing (a UUID drawn at its
	// start): two processes under one node id announce different ones.
	// Host and PID say where that process runs.
	Instance string `json:"instance,omitempty"`
	Host     string `json:"host,omitempty"`
	PID      int    `json:"pid,omitempty"`
	// Type is LOCAL or REMOTE.
	Type string `json:"type"`
	// Handler is the grouping-handler name the node runs.
	Handler string `json:"handler"`
	// HasConsumer is true while the node's queue consumer has an active puller.
	HasConsumer bool      `json:"has_consumer"`
	Started     time.Time `json:"started"`
	Heartbeat   time.Time `json:"heartbeat"`
	// Every is how often the node announces itself.
	Every time.Duration `json:"every,omitempty"`
	// Position is the next ingress sequence the node will read.
	Position uint64 `json:"position"`
	// Held is the number of messages waiting for a decision.
	Held int `json:"held"`
	// Routed counts messages republished onto the node's queue since start.
	Routed uint64 `json:"routed"`
	// DecisionErrors counts failed proposal attempts since start.
	DecisionErrors uint64 `json:"decision_errors"`
	// DeadLettered counts messages sent to the dead-letter stream since start.
	DeadLettered uint64 `json:"dead_lettered"`
	// Waiting lists groups whose messages the node holds undecided (no
	// binding yet for them), at most MaxWaitingListed, the most messages
	// first; WaitingGroups counts all such groups. Every node reads the
	// whole ingress, so every node holds the same undecided messages.
	Waiting       []HeldGroup `json:"waiting,omitempty"`
	WaitingGroups int         `json:"waiting_groups,omitempty"`
	// QueuePending and QueueUnacked are the node's queue consumer's
	// messages not yet delivered, and delivered but not yet acked, as the
	// consumer info read for this announcement said.
	QueuePending uint64 `json:"queue_pending,omitempty"`
	QueueUnacked uint64 `json:"queue_unacked,omitempty"`
	// Busy lists groups bound to the node that had a message routed
	// recently or have messages held, at most MaxBusyListed; BusyMore is
	// set when there were more (then every group of the node may be
	// busy). Rebalancing moves the other groups first.
	Busy     []string `json:"busy,omitempty"`
	BusyMore bool     `json:"busy_more,omitempty"`
	// Retrying lists groups bound to the node with a publish that failed
	// and is being sent again, at most MaxBusyListed: rebalancing moves
	// none of them (their old node keeps their order only by finishing
	// that publish first).
	Retrying []string `json:"retrying,omitempty"`
	// HeldBack lists the groups held back for their share of the node's
	// queue window (router: Config.GroupShare), the most messages held
	// first, at most MaxWaitingListed (Count: messages waiting on the
	// node's held subject; Since: when it started; OldestSeq unset);
	// HeldBackGroups counts all of them.
	HeldBack       []HeldGroup `json:"held_back,omitempty"`
	HeldBackGroups int         `json:"held_back_groups,omitempty"`
	// TTL is how long the record lives on the server unless announced
	// again (set by Announce, in whole seconds as the server counts). A
	// reader expires the node by it: the registry bucket leaves no marker
	// when a record expires (see OpenRegistry). Empty in records of
	// earlier releases, which rely on the marker.
	TTL time.Duration `json:"ttl,omitempty"`
}

// MaxBusyListed bounds NodeInfo.Busy.
const MaxBusyListed = 100

// MaxWaitingListed bounds NodeInfo.Waiting.
const MaxWaitingListed = 100

// HeldGroup is a group whose messages a node holds undecided.
type HeldGroup struct {
	Group string `json:"group"`
	// Count is the number of the group's messages held.
	Count int `json:"count"`
	// OldestSeq is the ingress sequence of the first of them.
	OldestSeq uint64 `json:"oldest_seq"`
	// Since is when the node first announced the group held undecided
	// from OldestSeq (to within one heartbeat).
	Since time.Time `json:"since"`
}

// Lease is the record of a handler lease.
type Lease struct {
	Holder   string    `json:"holder"`
	Since    time.Time `json:"since"`
	Revision uint64    `json:"-"`
}

// Checkpoint is how far a node has routed the ingress stream: every
// sequence below Next is done except those listed in Pending.
type Checkpoint struct {
	// Node is the node whose checkpoint it is (set by SaveCheckpoint): a
	// copy of one node's checkpoint under another's key is refused (a node
	// user reads its own with a direct get, which answers with the record
	// itself, to whatever reply subject it names). Empty in checkpoints of
	// earlier releases.
	Node    string      `json:"node,omitempty"`
	Next    uint64      `json:"next"`
	Pending [][2]uint64 `json:"pending,omitempty"` // inclusive ranges still to route
	// Caught holds, for each group this node is taking over, the last
	// ingress sequence its catch-up routed: saved before the node reports
	// the catch-up done, so that a successor (the node is gone before the
	// record says so) does not route those messages again.
	Caught map[string]uint64 `json:"caught,omitempty"`
	// Lost holds, for each group taken from this node while it could not
	// save its checkpoint (an evacuation), how far it had routed it: the
	// ingress sequence of the group's last message it stored, that
	// message's sequence in the queue stream, and the group's epoch under
	// the record that took it (Binding.Epoch). A take-over whose pinned
	// checkpoint this node saved over reads it instead (see LostPos).
	Lost map[string]LostPos `json:"lost,omitempty"`
	// Seen is the last revision of the bindings bucket this node had
	// applied when it took the checkpoint: Lost names every group taken
	// from it by a record up to there (of those it routed lately).
	Seen uint64 `json:"seen,omitempty"`
}

// LostPos is how far a node routed a group taken from it (Checkpoint.Lost):
// [ingress sequence, queue stream sequence, epoch].
type LostPos [3]uint64

// Seq is the ingress sequence of the last message of the group the node
// stored on its queue.
func (p LostPos) Seq() uint64 { return p[0] }

// At is that message's sequence in the queue stream.
func (p LostPos) At() uint64 { return p[1] }

// Epoch is the group's epoch under the record that took it from the node.
func (p LostPos) Epoch() uint64 { return p[2] }

// Registry is the node registry: live node announcements (with a TTL, so a
// dead node disappears by itself), handler leases and checkpoints. It is
// safe for concurrent use.
type Registry struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	bucket string
	log    *slog.Logger

	// The live nodes as this process sees them (Live, Seen, ...), kept by
	// Run.
	*LiveView
}

// MaxRegistryValueSize bounds one registry record (a checkpoint with its
// pending ranges is the largest).
const MaxRegistryValueSize = 1 << 20

// RegistryConfig configures the node registry bucket.
type RegistryConfig struct {
	// Bucket defaults to DefaultNodesBucket.
	Bucket string
	// Replicas of the bucket's stream; 0 means 1.
	Replicas int
	// Logger receives, at debug level, each node joining or leaving the
	// live set and why. Default: discard.
	Logger *slog.Logger
}

// OpenRegistry creates the registry bucket if it is missing and returns a
// Registry on it; an existing bucket is used as it is. onChange, if not
// nil, is called after the set of live nodes changed.
//
// The bucket is created hardened (RegistryStreamConfig): records carry
// per-key TTLs, but their expiry leaves no marker, and the stream denies
// roll-ups and purges. Every node may publish its own liveness record and
// checkpoint, and on a stream that allows roll-ups a Nats-Rollup: all
// header on such a publish purges the bucket (the lease, every liveness
// record and checkpoint); nats-server allows no expiry markers without
// roll-ups. Readers therefore expire a node themselves (Run); the lease is
// taken over by a standby's periodic create, which succeeds once the
// record expired. A bucket of an earlier release (markers, roll-ups) is
// hardened by Harden.
func OpenRegistry(ctx context.Context, js jetstream.JetStream, cfg RegistryConfig, onChange func()) (*Registry, error) {
	if cfg.Bucket == "" {
		cfg.Bucket = DefaultNodesBucket
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	kv, err := OpenHardenedBucket(ctx, js, RegistryStreamConfig(cfg.Bucket, cfg.Replicas))
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registry{js: js, kv: kv, bucket: cfg.Bucket, log: log,
		LiveView: NewLiveView(LiveViewConfig{OnChange: onChange, Logger: log})}, nil
}

// RegistryStreamConfig is the configuration of a hardened registry
// bucket's stream: records may carry per-key TTLs, with no expiry markers,
// no roll-ups and no purges (see OpenRegistry).
func RegistryStreamConfig(bucket string, replicas int) jetstream.StreamConfig {
	return HardenedBucketConfig(bucket, "grouprouter: live nodes, handler leases, checkpoints", replicas, MaxRegistryValueSize, true)
}

// Hardened reports whether the registry bucket denies roll-ups and purges.
func (r *Registry) Hardened(ctx context.Context) (bool, error) {
	return BucketHardened(ctx, r.js, r.bucket)
}

// Harden updates a registry bucket of an earlier release (expiry markers,
// roll-ups allowed) to deny roll-ups and purges; it reports whether it
// changed the bucket. Nodes of releases before per-record TTLs
// (NodeInfo.TTL) see a node's record expire only by its marker: harden
// once no such node runs (the handler does, once every live node announces
// a TTL).
func (r *Registry) Harden(ctx context.Context) (bool, error) {
	return HardenBucket(ctx, r.js, r.bucket)
}

func (r *Registry) subject(key string) string { return "$KV." + r.bucket + "." + key }

// ttlHeader formats a per-message TTL; the server counts whole seconds, at least one.
func ttlHeader(ttl time.Duration) string {
	return strconv.FormatInt(int64(roundUpTTL(ttl)/time.Second), 10) + "s"
}

// roundUpTTL is ttl as the server counts it: whole seconds, at least one.
func roundUpTTL(ttl time.Duration) time.Duration {
	return max((ttl+time.Second-1)/time.Second, 1) * time.Second
}

// NodeTTL is how long the liveness record of a node that announces
// itself every heartbeat lives: three heartbeats, at least a second. A
// handler counts on a node no longer than that after it last heard of it.
func NodeTTL(heartbeat time.Duration) time.Duration {
	return max(3*heartbeat, time.Second)
}

// LiveValue returns the value Announce stores for info, a record living
// ttl (its TTL as the server counts it: whole seconds, at least one).
func LiveValue(info NodeInfo, ttl time.Duration) ([]byte, error) {
	info.TTL = roundUpTTL(ttl)
	return encodeRecord(recordLive, &info)
}

// Announce publishes info as the node's liveness record, expiring after ttl
// unless announced again.
func (r *Registry) Announce(ctx context.Context, info NodeInfo, ttl time.Duration) error {
	data, err := LiveValue(info, ttl)
	if err != nil {
		return err
	}
	msg := nats.NewMsg(r.subject(livePrefix + info.Node))
	msg.Header.Set(jetstream.MsgTTLHeader, ttlHeader(ttl))
	msg.Data = data
	if _, err := r.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("kvbinding: announce %s: %w", info.Node, err)
	}
	return nil
}

// Withdraw removes the node's liveness record (a clean shutdown).
func (r *Registry) Withdraw(ctx context.Context, node string) error {
	if err := r.kv.Delete(ctx, livePrefix+node); err != nil {
		return fmt.Errorf("kvbinding: withdraw %s: %w", node, err)
	}
	return nil
}

// Run watches the liveness records until ctx ends. A record that says
// how long it lives (NodeInfo.TTL) and is not announced again within that
// is looked up: once the bucket no longer holds it, the node is gone. The
// server's expiry decides, never this process's clock alone: a watch that
// lags (a paused process) finds the record still there and waits on.
func (r *Registry) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(expiryCheckEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				r.ExpireDue(ctx, r.liveStored)
			}
		}
	}()
	feed := r.Feed()
	err := watchBucket(ctx, r.js, r.bucket, livePrefix+">", watchHooks{entry: func(key string, op entryOp, value []byte, rev uint64) {
		if op == opPut {
			feed.Put(key, value, rev)
		} else {
			feed.Delete(key, rev)
		}
	}, ready: feed.Ready})
	cancel()
	wg.Wait()
	return err
}

// expiryCheckEvery is how often Run looks for records past their TTL.
const expiryCheckEvery = 200 * time.Millisecond

// liveStored reports whether the bucket holds node's liveness record.
func (r *Registry) liveStored(ctx context.Context, node string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := r.kv.Get(ctx, livePrefix+node)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// LiveRecord reads node's liveness record from the bucket, with its
// revision; found is false if there is none (never announced, withdrawn
// or expired). A value that does not decode, or names another node, is
// returned with found true and an error wrapping ErrInvalidNodeInfo.
func (r *Registry) LiveRecord(ctx context.Context, node string) (info NodeInfo, rev uint64, found bool, err error) {
	e, err := r.kv.Get(ctx, livePrefix+node)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return NodeInfo{}, 0, false, nil
		}
		return NodeInfo{}, 0, false, fmt.Errorf("kvbinding: read liveness of %s: %w", node, err)
	}
	if err := decodeRecord(e.Value(), recordLive, &info); err != nil {
		return NodeInfo{}, e.Revision(), true, fmt.Errorf("%w: %s: %v", ErrInvalidNodeInfo, node, err)
	}
	if info.Node != node {
		return NodeInfo{}, e.Revision(), true, fmt.Errorf("%w: %s: the record names node %q", ErrInvalidNodeInfo, node, info.Node)
	}
	return info, e.Revision(), true, nil
}

// ListNodes reads the liveness records directly from the bucket.
func (r *Registry) ListNodes(ctx context.Context) ([]NodeInfo, error) {
	w, err := r.kv.Watch(ctx, livePrefix+">", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var out []NodeInfo
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e := <-w.Updates():
			if e == nil {
				return out, nil
			}
			var info NodeInfo
			if decodeRecord(e.Value(), recordLive, &info) == nil {
				out = append(out, info)
			}
		}
	}
}

// AcquireLease takes the named lease for holder if nobody holds it. It
// returns the lease, or an error wrapping ErrLeaseHeld with the current one.
func (r *Registry) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (Lease, error) {
	l := Lease{Holder: holder, Since: time.Now().UTC()}
	data, _ := encodeRecord(recordLease, &l)
	rev, err := r.kv.Create(ctx, leasePrefix+name, data, jetstream.KeyTTL(roundTTL(ttl)))
	if err == nil {
		l.Revision = rev
		return l, nil
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		cur, gerr := r.GetLease(ctx, name)
		if errors.Is(gerr, ErrInvalidLease) {
			// Nobody can hold a record without a holder (and one written
			// without a TTL would never expire): clear it and try again.
			if derr := r.kv.Delete(ctx, leasePrefix+name, jetstream.LastRevision(cur.Revision)); derr != nil {
				return Lease{}, fmt.Errorf("kvbinding: acquire lease %s: clear invalid record: %w", name, derr)
			}
			rev, err := r.kv.Create(ctx, leasePrefix+name, data, jetstream.KeyTTL(roundTTL(ttl)))
			if err != nil {
				return Lease{}, fmt.Errorf("kvbinding: acquire lease %s: %w", name, err)
			}
			l.Revision = rev
			return l, nil
		}
		if gerr == nil && cur.Holder == holder {
			// Ours from an earlier incarnation: renew it.
			return r.RenewLease(ctx, name, cur, ttl)
		}
		return cur, fmt.Errorf("%w: %s held by %s", ErrLeaseHeld, name, cur.Holder)
	}
	return Lease{}, fmt.Errorf("kvbinding: acquire lease %s: %w", name, err)
}

func roundTTL(ttl time.Duration) time.Duration {
	if ttl < time.Second {
		return time.Second
	}
	return ttl.Round(time.Second)
}

// RenewLease extends a lease held at l.Revision. If the lease changed, it
// returns an error wrapping ErrLeaseLost.
func (r *Registry) RenewLease(ctx context.Context, name string, l Lease, ttl time.Duration) (Lease, error) {
	data, _ := encodeRecord(recordLease, &l)
	msg := nats.NewMsg(r.subject(leasePrefix + name))
	msg.Header.Set(jetstream.MsgTTLHeader, ttlHeader(ttl))
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(l.Revision, 10))
	msg.Data = data
	ack, err := r.js.PublishMsg(ctx, msg)
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == 10164) {
			return Lease{}, fmt.Errorf("%w: %s", ErrLeaseLost, name)
		}
		return Lease{}, fmt.Errorf("kvbinding: renew lease %s: %w", name, err)
	}
	l.Revision = ack.Sequence
	return l, nil
}

// ReleaseLease deletes the lease if it is still at l.Revision, so that a
// standby can take it at once.
func (r *Registry) ReleaseLease(ctx context.Context, name string, l Lease) error {
	return r.kv.Delete(ctx, leasePrefix+name, jetstream.LastRevision(l.Revision))
}

// GetLease returns the current lease record, or an error wrapping
// jetstream.ErrKeyNotFound if nobody holds it.
func (r *Registry) GetLease(ctx context.Context, name string) (Lease, error) {
	e, err := r.kv.Get(ctx, leasePrefix+name)
	if err != nil {
		return Lease{}, err
	}
	l, err := decodeLease(e.Value())
	if err != nil {
		// A record nobody can hold: report it with its revision, so that
		// it can be deleted over (a lease without a holder is free).
		return Lease{Revision: e.Revision()}, fmt.Errorf("kvbinding: lease %s: %w", name, err)
	}
	l.Revision = e.Revision()
	return l, nil
}

// decodeLease decodes and checks a lease record: it must name a holder.
func decodeLease(data []byte) (Lease, error) {
	var l Lease
	if err := decodeRecord(data, recordLease, &l); err != nil {
		return Lease{}, fmt.Errorf("%w: %v", ErrInvalidLease, err)
	}
	if l.Holder == "" || len(l.Holder) > 2*MaxNodeIDLen+1 {
		return Lease{}, fmt.Errorf("%w: no holder", ErrInvalidLease)
	}
	return l, nil
}

// WatchLease calls fn (from its own goroutine, which wg tracks) whenever
// the lease record changes, with the new holder ("" when the lease was
// released or expired, or holds no holder), until ctx ends. Starting the
// watch waits out transient failures (a cluster electing leaders); it
// returns an error for one that waiting cannot fix, or ctx's error.
func (r *Registry) WatchLease(ctx context.Context, name string, fn func(holder string), wg *sync.WaitGroup) error {
	var w jetstream.KeyWatcher
	backoff := retry.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for {
		before := r.js.Conn().LastError()
		var err error
		if w, err = r.kv.Watch(ctx, leasePrefix+name, jetstream.UpdatesOnly()); err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if v := retry.Violation(r.js.Conn(), before); v != nil {
			return fmt.Errorf("kvbinding: watch lease %s: %w (%w)", name, v, err)
		}
		if retry.Permanent(err) {
			return fmt.Errorf("kvbinding: watch lease %s: %w", name, err)
		}
		if err := retry.Sleep(ctx, backoff.Next()); err != nil {
			return err
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				holder := ""
				if e != nil && e.Operation() == jetstream.KeyValuePut {
					if l, err := decodeLease(e.Value()); err == nil {
						holder = l.Holder
					}
				}
				fn(holder)
			}
		}
	}()
	return nil
}

// SaveCheckpoint stores the node's routing checkpoint.
func (r *Registry) SaveCheckpoint(ctx context.Context, node string, c Checkpoint) error {
	c.Node = node
	data, err := encodeRecord(recordCheckpoint, &c)
	if err != nil {
		return err
	}
	if _, err := r.kv.Put(ctx, ckptPrefix+node, data); err != nil {
		return fmt.Errorf("kvbinding: save checkpoint %s: %w", node, err)
	}
	return nil
}

// LoadCheckpoint returns the node's stored checkpoint, or a zero
// Checkpoint and false if it has none.
func (r *Registry) LoadCheckpoint(ctx context.Context, node string) (Checkpoint, bool, error) {
	c, _, ok, err := r.LoadCheckpointRev(ctx, node)
	return c, ok, err
}

// LoadCheckpointRev is LoadCheckpoint that also returns the checkpoint's
// KV revision (for LoadCheckpointAt).
func (r *Registry) LoadCheckpointRev(ctx context.Context, node string) (Checkpoint, uint64, bool, error) {
	e, err := r.kv.Get(ctx, ckptPrefix+node)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return Checkpoint{}, 0, false, nil
		}
		return Checkpoint{}, 0, false, fmt.Errorf("kvbinding: load checkpoint %s: %w", node, err)
	}
	c, err := decodeCheckpoint(node, e.Value())
	if err != nil {
		return Checkpoint{}, 0, false, err
	}
	return c, e.Revision(), true, nil
}

// LoadCheckpointAt returns the node's checkpoint stored at KV revision rev,
// and false when it is no longer the stored one (the node saved another
// since: the bucket keeps one per key). It reads the key's last value, as
// LoadCheckpoint does (the one read a node's permissions grant on another
// node's checkpoint key).
func (r *Registry) LoadCheckpointAt(ctx context.Context, node string, rev uint64) (Checkpoint, bool, error) {
	c, at, ok, err := r.LoadCheckpointRev(ctx, node)
	if err != nil || !ok || at != rev {
		return Checkpoint{}, false, err
	}
	return c, true, nil
}

// decodeCheckpoint decodes and checks the checkpoint stored under node's
// key.
func decodeCheckpoint(node string, data []byte) (Checkpoint, error) {
	var c Checkpoint
	if err := decodeRecord(data, recordCheckpoint, &c); err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %s: %v", ErrInvalidCheckpoint, node, err)
	}
	if c.Next == 0 {
		// Every checkpoint a node saves has read something or starts at 1.
		return Checkpoint{}, fmt.Errorf("%w: %s: no next sequence", ErrInvalidCheckpoint, node)
	}
	if c.Node != "" && c.Node != node {
		return Checkpoint{}, fmt.Errorf("%w: %s: the checkpoint of node %q under its key", ErrInvalidCheckpoint, node, c.Node)
	}
	if err := c.Validate(); err != nil {
		return Checkpoint{}, fmt.Errorf("%w: %s: %v", ErrInvalidCheckpoint, node, err)
	}
	return c, nil
}

// Validate checks that the pending ranges are ordered, disjoint and below
// Next.
func (c Checkpoint) Validate() error {
	var prev uint64
	for i, p := range c.Pending {
		if p[0] == 0 || p[0] > p[1] || p[1] >= c.Next || (i > 0 && p[0] <= prev) {
			return fmt.Errorf("pending range %d %v does not fit below next %d", i, p, c.Next)
		}
		prev = p[1]
	}
	for g, p := range c.Lost {
		if g == "" || p.Seq() == 0 || p.At() == 0 || p.Epoch() == 0 {
			return fmt.Errorf("lost group %q at %v: empty", g, p)
		}
	}
	return nil
}

// Done reports whether the ingress message at seq was finished (routed,
// skipped as another node's, or dead-lettered) when c was taken.
func (c Checkpoint) Done(seq uint64) bool {
	if seq >= c.Next {
		return false
	}
	for _, p := range c.Pending {
		if seq >= p[0] && seq <= p[1] {
			return false
		}
	}
	return true
}

// Start returns the first ingress sequence not known to be done: where a
// node resumes, and where its groups are taken from when it is gone.
func (c Checkpoint) Start() uint64 {
	if len(c.Pending) > 0 {
		return c.Pending[0][0]
	}
	return c.Next
}

// Floor is the routing floor: every ingress message below Seq has been
// resolved (routed, skipped as another node's, or dead-lettered) by every
// node that was live when the active LOCAL handler raised it. It only
// grows; the handler is its only writer.
type Floor struct {
	Seq uint64 `json:"seq"`
	// At and By say when and by which handler it was last raised.
	At time.Time `json:"at"`
	By string    `json:"by,omitempty"`
}

// LoadFloor returns the stored routing floor and its revision; a zero
// Floor and revision 0 if there is none. A value that does not decode is
// returned as a zero Floor with its revision and an error wrapping
// ErrInvalidFloor (RaiseFloor writes over it).
func (r *Registry) LoadFloor(ctx context.Context) (Floor, uint64, error) {
	e, err := r.kv.Get(ctx, FloorKey)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return Floor{}, 0, nil
		}
		return Floor{}, 0, fmt.Errorf("kvbinding: load floor: %w", err)
	}
	var f Floor
	if err := decodeRecord(e.Value(), recordFloor, &f); err != nil {
		return Floor{}, e.Revision(), fmt.Errorf("%w: %v", ErrInvalidFloor, err)
	}
	if f.Seq == 0 {
		return Floor{}, e.Revision(), fmt.Errorf("%w: no sequence", ErrInvalidFloor)
	}
	return f, e.Revision(), nil
}

// StoreFloor writes f as the routing floor over the record at revision
// rev (0: there is none), with a compare-and-set: it returns an error
// wrapping ErrConflict if the record changed since.
func (r *Registry) StoreFloor(ctx context.Context, f Floor, rev uint64) (uint64, error) {
	data, err := encodeRecord(recordFloor, &f)
	if err != nil {
		return 0, err
	}
	var nrev uint64
	if rev == 0 {
		nrev, err = r.kv.Create(ctx, FloorKey, data)
	} else {
		nrev, err = r.kv.Update(ctx, FloorKey, data, rev)
	}
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			return 0, fmt.Errorf("%w: floor", ErrConflict)
		}
		return 0, fmt.Errorf("kvbinding: store floor: %w", err)
	}
	return nrev, nil
}
