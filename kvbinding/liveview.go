package kvbinding

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// LiveView is one process's view of the live nodes, kept from the
// liveness records of the registry bucket: who announced itself and with
// what, when this process last heard from each node (by its own clock),
// and which nodes are gone: their record withdrawn, or past its TTL and
// no longer stored. Registry keeps one from its watch (Run); a simulation
// feeds one by hand, on its own clock. It is safe for concurrent use.
type LiveView struct {
	mu       sync.RWMutex
	live     map[string]NodeInfo
	seen     map[string]time.Time // this clock's time of each node's last announcement
	lastSeen map[string]time.Time // the same, kept after the node is gone
	// returned is when each node that had been live and gone entered the
	// live set again.
	returned map[string]time.Time
	// rev is the revision of each node's last announcement received, kept
	// after the node is gone.
	rev map[string]uint64
	// expires: the time after which to look up whether a node's record
	// expired.
	expires  map[string]time.Time
	ready    chan struct{}
	once     sync.Once
	onChange func()
	log      *slog.Logger
	now      func() time.Time
}

// LiveViewConfig configures a LiveView.
type LiveViewConfig struct {
	// OnChange, if not nil, is called after the set of live nodes, or a
	// live node's consumer presence or process, changed; from the
	// goroutine that fed the change, outside the view's lock.
	OnChange func()
	// Logger receives, at debug level, each node joining or leaving the
	// live set and why. Default: discard.
	Logger *slog.Logger
	// Now is the view's clock. Default: time.Now.
	Now func() time.Time
}

// NewLiveView returns an empty view.
func NewLiveView(cfg LiveViewConfig) *LiveView {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &LiveView{live: map[string]NodeInfo{}, seen: map[string]time.Time{}, lastSeen: map[string]time.Time{},
		returned: map[string]time.Time{}, rev: map[string]uint64{}, expires: map[string]time.Time{},
		ready: make(chan struct{}), onChange: cfg.OnChange, log: log, now: now}
}

// Live returns the nodes currently announced, keyed by node id.
func (v *LiveView) Live() map[string]NodeInfo {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return maps.Clone(v.live)
}

// Seen returns when this process last received node's announcement (its
// own clock), or the zero time.
func (v *LiveView) Seen(node string) time.Time {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.seen[node]
}

// LastSeen returns when this process last received node's announcement,
// also after the node is gone (its record expired or was withdrawn); the
// zero time if never.
func (v *LiveView) LastSeen(node string) time.Time {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.lastSeen[node]
}

// Returned returns when node entered the live set again after it had
// been live and gone, as this process saw it (its own clock), or the zero
// time if it never did.
func (v *LiveView) Returned(node string) time.Time {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.returned[node]
}

// SeenRevision returns the revision of node's last announcement this
// process received (also after the node is gone), or 0. A liveness record
// stored at a later revision is an announcement it has not seen yet.
func (v *LiveView) SeenRevision(node string) uint64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.rev[node]
}

// Ready is closed once the view holds the nodes announced when its watch
// started.
func (v *LiveView) Ready() <-chan struct{} { return v.ready }

// LiveFeed hands a LiveView the liveness records of the registry bucket
// (keys under "live."), as Registry.Run's watch does: one goroutine at a
// time, in the bucket's order, the latest record of every key, Ready, then
// every change.
type LiveFeed struct{ v *LiveView }

// Feed returns the view's feed. A Registry's view is fed by its Run: feed
// a view by hand only when nothing runs it.
func (v *LiveView) Feed() LiveFeed { return LiveFeed{v} }

// Put takes the liveness record stored under key at revision rev. A value
// that does not decode, or names another node than its key, changes
// nothing.
func (f LiveFeed) Put(key string, value []byte, rev uint64) { f.v.apply(key, opPut, value, rev) }

// Delete takes the removal of the liveness record under key (withdrawn,
// or expired with a marker).
func (f LiveFeed) Delete(key string, rev uint64) { f.v.apply(key, opDelete, nil, rev) }

// Ready says the initial records are in: the view is Ready.
func (f LiveFeed) Ready() { f.v.once.Do(func() { close(f.v.ready) }) }

// expirySlack is how long past a record's TTL, by this process's clock
// from the record's arrival, the view first looks the record up.
const expirySlack = 250 * time.Millisecond

func (v *LiveView) apply(key string, op entryOp, value []byte, rev uint64) {
	node := strings.TrimPrefix(key, livePrefix)
	changed := false
	v.mu.Lock()
	if op == opPut {
		if info, err := decodeLive(value); err == nil && info.Node == node && ValidateNodeID(node) == nil {
			old, had := v.live[node]
			changed = !had || old.HasConsumer != info.HasConsumer || !old.Started.Equal(info.Started) || old.Instance != info.Instance
			if changed {
				v.log.Debug("live node announced", "live_node", node, "new", !had, "instance", info.Instance, "has_consumer", info.HasConsumer, "ttl", info.TTL, "rev", rev)
			}
			now := v.now()
			if _, before := v.lastSeen[node]; !had && before {
				v.returned[node] = now
				v.log.Debug("live node returned", "live_node", node, "gone_since", v.lastSeen[node])
			}
			v.live[node] = info
			v.seen[node] = now
			v.lastSeen[node] = now
			v.rev[node] = max(v.rev[node], rev)
			if info.TTL > 0 {
				v.expires[node] = now.Add(info.TTL + expirySlack)
			} else {
				delete(v.expires, node) // an earlier release's: its marker says when it expired
			}
		}
	} else if _, had := v.live[node]; had {
		delete(v.live, node)
		delete(v.seen, node)
		delete(v.expires, node)
		changed = true
		v.log.Debug("live node gone: its record was withdrawn, or expired with a marker", "live_node", node, "rev", rev)
	}
	v.mu.Unlock()
	if changed && v.onChange != nil {
		v.onChange()
	}
}

// NextDue returns when a node's record is next past its TTL by the view's
// clock (ExpireDue then has a lookup to make), or the zero time when no
// record says how long it lives.
func (v *LiveView) NextDue() time.Time {
	v.mu.RLock()
	defer v.mu.RUnlock()
	var next time.Time
	for _, t := range v.expires {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	return next
}

// ExpireDue looks up each node whose record is past its TTL (by the view's
// clock, from the record's arrival) and drops the node from the live set
// if the bucket no longer holds its record. stored reports whether the
// bucket holds node's liveness record; a node it cannot tell about (an
// error) is looked up again shortly. The server's expiry decides, never
// this process's clock alone: a view that lags (a paused process, a cut
// link) finds the record still there, or cannot look, and waits on.
func (v *LiveView) ExpireDue(ctx context.Context, stored func(ctx context.Context, node string) (bool, error)) {
	type due struct {
		node     string
		deadline time.Time
	}
	var dues []due
	now := v.now()
	v.mu.RLock()
	for node, t := range v.expires {
		if now.After(t) {
			dues = append(dues, due{node, t})
		}
	}
	v.mu.RUnlock()
	// In the nodes' order: a simulation replays a seed exactly.
	slices.SortFunc(dues, func(a, b due) int { return strings.Compare(a.node, b.node) })
	for _, d := range dues {
		has, err := stored(ctx, d.node)
		if ctx.Err() != nil {
			return
		}
		changed := false
		v.mu.Lock()
		switch {
		case !v.expires[d.node].Equal(d.deadline):
			// Announced again (or removed) meanwhile.
		case err == nil && !has:
			v.log.Debug("live node gone: its record expired", "live_node", d.node, "last_seen", v.lastSeen[d.node])
			delete(v.live, d.node)
			delete(v.seen, d.node)
			delete(v.expires, d.node)
			changed = true
		default:
			// Still stored (this watch lags, or the server has not
			// expired it yet), or the bucket could not be read: look
			// again shortly.
			v.expires[d.node] = v.now().Add(expirySlack)
		}
		v.mu.Unlock()
		if changed && v.onChange != nil {
			v.onChange()
		}
	}
}
