package router

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// One process per node id.
//
// Everything a node owns is keyed by its id: its queue consumer, its
// checkpoint, its liveness record, the handler lease holder name/node. Two
// processes under one id would take the lease from each other, overwrite
// each other's checkpoint and reconfigure each other's queue consumer. So
// each process draws an instance id (a UUID) and announces it, with its
// host, pid and start time, in its liveness record, and:
//
//   - at start, before it touches anything its id owns, a node reads its
//     liveness key. No record: the id is free. A record of another
//     instance: the node watches it until it is renewed (another process
//     heartbeats under the id: the node refuses to start, with
//     NodeIDInUseError) or it is gone (the previous process crashed and
//     its record expired: the node starts). A record that does not decode
//     is not a process of this id: it is overwritten.
//   - while it runs, a node that sees its liveness key announced by another
//     instance (two processes that passed the check at the same moment)
//     stops if it is the later starter (started later, or at the same
//     instant with the greater instance id). Both processes see both
//     records and decide alike, so exactly one of them stops, whatever
//     their clocks say: the earlier one keeps its queue, lease and
//     checkpoint, and the one that stops withdraws and saves nothing.
//     The record of the predecessor the start-up check found gone is not
//     another process, until it is renewed: the check may find it gone (or
//     not renewed within its TTL) while the node's registry still holds it,
//     or is yet to learn of its expiry.

// process is this process under its node id: its instance id, host and
// pid, announced in its liveness record; yielded is set, and conflict
// receives the error, when it gives the id up to another.
type process struct {
	instance string
	host     string
	pid      int
	// started is when it started routing (setup), announced too.
	started time.Time
	// predecessor is the last record of the process the start-up check
	// found gone under this id (claimNodeID), if any.
	predecessor kvbinding.NodeInfo
	yielded     atomic.Bool
	conflict    chan error
	// warned is the instance of the earlier starter last warned about.
	warned atomic.Pointer[string]
}

// claimPoll is how often a starting node reads its liveness key while it
// waits for an old record to be renewed or to go.
const claimPoll = 100 * time.Millisecond

// maxClaimWait bounds the wait for an old liveness record to go, whatever
// heartbeat period the record claims (a foreign or corrupt record must not
// hold a node back for long).
const maxClaimWait = 30 * time.Second

// claimVerdict is what a starting node concludes from its liveness key.
type claimVerdict int

const (
	claimWait  claimVerdict = iota // look again
	claimFree                      // start
	claimTaken                     // another process heartbeats under the id: refuse
)

// liveView is one reading of a node's liveness key.
type liveView struct {
	found   bool
	rev     uint64
	info    kvbinding.NodeInfo
	invalid error // the value does not decode (found is true)
}

// decideClaim is the start-up rule: first is the first reading of the
// node's liveness key, taken at firstAt, cur the latest, taken at now.
// It returns the verdict and why.
func decideClaim(first, cur liveView, firstAt, now time.Time) (claimVerdict, string) {
	switch {
	case !cur.found && first.found:
		return claimFree, "the previous process's liveness record expired or was withdrawn"
	case !cur.found:
		return claimFree, "no liveness record"
	case cur.invalid != nil:
		return claimFree, "the liveness record is not one a node wrote; it is overwritten"
	case !first.found || first.invalid != nil || cur.rev != first.rev:
		// Written since the first reading: a process heartbeats under the id.
		return claimTaken, "another process wrote the liveness record since the first reading"
	case now.Sub(firstAt) >= staleAfter(first.info):
		return claimFree, "the liveness record was not renewed within its TTL"
	}
	return claimWait, "waiting for the liveness record to be renewed or to expire"
}

// staleAfter is how long after a liveness record was first read a process
// that still runs has surely renewed it: its TTL as announce sets it (3
// heartbeats, at least 1 s, in whole seconds), plus a second for the
// server's expiry, at most maxClaimWait.
func staleAfter(info kvbinding.NodeInfo) time.Duration {
	every := info.Every
	if every <= 0 {
		every = DefaultHeartbeat
	}
	if every > maxClaimWait {
		return maxClaimWait
	}
	ttl := kvbinding.NodeTTL(every)
	ttl = (ttl + time.Second - 1).Truncate(time.Second)
	return min(ttl+time.Second, maxClaimWait)
}

// laterStarter reports whether the process that started at started with
// instance id instance must yield its node id to other, which announces
// under the same id: it started later, or at the same instant with the
// greater instance id. For two distinct processes exactly one of
// laterStarter(a, b) and laterStarter(b, a) is true.
func laterStarter(started time.Time, instance string, other kvbinding.NodeInfo) bool {
	if other.Instance == instance {
		return false
	}
	if !started.Equal(other.Started) {
		return started.After(other.Started)
	}
	return instance > other.Instance
}

// stalePredecessor reports whether other, the record announced under
// this node's id, is the last record of predecessor, the process the
// start-up check found gone (not a renewal of it: a later heartbeat).
func stalePredecessor(predecessor, other kvbinding.NodeInfo) bool {
	return predecessor.Instance != "" && other.Instance == predecessor.Instance && !other.Heartbeat.After(predecessor.Heartbeat)
}

// claimNodeID is the start-up check of the node id: it returns nil when
// no other process heartbeats under it, a *NodeIDInUseError when one
// does, or ctx's error. Reading the key waits out NATS being unavailable,
// as every setup step does.
func (r *Router) claimNodeID(ctx context.Context) error {
	var first liveView
	var firstAt time.Time
	t := time.NewTicker(claimPoll)
	defer t.Stop()
	for i := 0; ; i++ {
		var cur liveView
		if err := r.setupStep(ctx, "node id check", func(ctx context.Context) error {
			info, rev, found, err := r.reg.LiveRecord(ctx, r.cfg.Node)
			if errors.Is(err, kvbinding.ErrInvalidNodeInfo) {
				cur = liveView{found: true, rev: rev, invalid: err}
				return nil
			}
			cur = liveView{found: found, rev: rev, info: info}
			return err
		}); err != nil {
			return err
		}
		now := time.Now()
		if i == 0 {
			first, firstAt = cur, now
		}
		verdict, why := decideClaim(first, cur, firstAt, now)
		switch verdict {
		case claimFree:
			switch {
			case cur.invalid != nil:
				r.log.Warn("node id check: "+why, "err", cur.invalid)
			case first.found:
				r.proc.predecessor = first.info
				r.log.Info("node id check: the id is free: "+why, "waited", now.Sub(firstAt).Round(time.Millisecond),
					"previous_host", first.info.Host, "previous_pid", first.info.PID, "previous_instance", first.info.Instance)
			default:
				r.log.Debug("node id check: the id is free: " + why)
			}
			return nil
		case claimTaken:
			return &NodeIDInUseError{Node: r.cfg.Node, Other: cur.info}
		}
		if i == 0 {
			r.log.Info("node id check: a liveness record of another process is there; waiting until it is renewed (refuse) or expires (start)",
				"other_host", first.info.Host, "other_pid", first.info.PID, "other_instance", first.info.Instance,
				"other_started", first.info.Started, "at_most", staleAfter(first.info))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// checkOwnRecord applies the running rule to the liveness record last
// announced under this node's id (live is the registry's view): if
// another process announced it and this one is the later starter, the
// node stops (Run returns a *NodeIDInUseError).
func (r *Router) checkOwnRecord(live map[string]kvbinding.NodeInfo) {
	other, ok := live[r.cfg.Node]
	if !ok || other.Instance == r.proc.instance || r.proc.started.IsZero() || stalePredecessor(r.proc.predecessor, other) {
		return
	}
	if !laterStarter(r.proc.started, r.proc.instance, other) {
		if p := r.proc.warned.Load(); p == nil || *p != other.Instance {
			r.proc.warned.Store(&other.Instance)
			r.log.Warn("another process announces this node id; it started later and stops",
				"other_host", other.Host, "other_pid", other.PID, "other_instance", other.Instance, "other_started", other.Started)
		}
		return
	}
	if !r.proc.yielded.CompareAndSwap(false, true) {
		return
	}
	err := &NodeIDInUseError{Node: r.cfg.Node, Other: other, Yielded: true}
	r.log.Error("stopping: another process that started earlier runs this node id",
		"other_host", other.Host, "other_pid", other.PID, "other_instance", other.Instance, "other_started", other.Started)
	r.proc.conflict <- err // buffered, sent once
}

// NodeIDInUseError is the error Run returns when another process runs
// under the node's id: found at start (Yielded false), or while running
// when that process started first (Yielded true). It matches
// ErrNodeIDInUse.
type NodeIDInUseError struct {
	// Node is the node id.
	Node string
	// Other is the other process's liveness record (host, pid, start
	// time and instance id).
	Other kvbinding.NodeInfo
	// Yielded is true when this node was running and stopped, being the
	// later starter.
	Yielded bool
}

func (e *NodeIDInUseError) Error() string {
	who := fmt.Sprintf("host %s, pid %d, started %s, instance %s", orUnknown(e.Other.Host), e.Other.PID,
		e.Other.Started.UTC().Format(time.RFC3339Nano), orUnknown(e.Other.Instance))
	if e.Yielded {
		return fmt.Sprintf("node id %q is also run by another process, which started first (%s): this one stopped", e.Node, who)
	}
	return fmt.Sprintf("node id %q is in use by another live process (%s): stop it, or give this node another id", e.Node, who)
}

// Unwrap returns ErrNodeIDInUse.
func (e *NodeIDInUseError) Unwrap() error { return ErrNodeIDInUse }

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
