package proposals

import (
	"slices"
	"sort"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// The handler monitor's decisions, with no I/O and no clock: on every lease
// tick the active handler gathers what it knows (MonitorInput), asks its
// MonitorState to Plan, and carries out the MonitorActions. The
// simulation (router/sim_handler_test.go) drives the same planner.

// MonitorConfig is what the monitor's rules are tuned by.
type MonitorConfig struct {
	// NodeGrace: how long a node that owns groups may be gone before its
	// groups are evacuated.
	NodeGrace time.Duration
	// RebindAfter: how long a live node's queue may have no consumer,
	// while another node's has one, before its groups move; negative
	// disables.
	RebindAfter time.Duration
	// FenceDeadline: how long a moving record may wait for its old node's
	// fence before the handler fences it from the node's checkpoint.
	FenceDeadline time.Duration
	// Rebalance tunes the moves that spread groups (Enabled false: none).
	Rebalance RebalanceConfig
}

// MonitorState is what the monitor remembers from one tick to the next.
// Plan updates it; the shell tells it when the work it started is done
// (Done). It is not safe for concurrent use: the handler guards it.
type MonitorState struct {
	// GoneSince: since when each node that owns groups has been gone.
	GoneSince map[string]time.Time
	// NoConsumer: since when each live node that owns groups has had no
	// queue consumer while another node's queue has one.
	NoConsumer map[string]time.Time
	// Evacuating: nodes whose groups are being taken off (evacuation,
	// rebind or overdue fences in progress): nothing more is started for
	// them until Done.
	Evacuating map[string]bool
	// Moving: when each moving record (by group and revision) that waits
	// for its old node's fence was first seen.
	Moving map[string]SeenRev
	// Unsettled: when each group was last seen moving or in a hand-over
	// step, for the rebalancing cool-down (kept for a cool-down after
	// the group settled).
	Unsettled map[string]time.Time
	// Rebalancing: the rebalance moves of a tick are being written:
	// none is planned until RebalanceDone (their records are not counted
	// yet).
	Rebalancing bool
	// BalanceTotal: the groups on the nodes rebalancing counted at the
	// last tick (BalanceCounted: there was one); BalanceWaits: the ticks
	// in a row rebalancing waited because that count changed (see
	// steadyTicks).
	BalanceTotal, BalanceWaits int
	BalanceCounted             bool
}

// steadyTicks: rebalancing plans only on a tick whose count of groups (on
// the nodes it spreads them over) is the previous tick's, or after this
// many ticks in a row that it was not. While groups are being bound, each
// new one goes to the least loaded node, which spreads the load by itself,
// and the counts taken during a burst of bindings (decided for several
// proposers at once, each from its own view) are off by a few: moves
// planned from them are moved back a tick later.
const steadyTicks = 4

// SeenRev is a record revision and when the monitor first saw it.
type SeenRev struct {
	Rev  uint64
	Seen time.Time
}

// MonitorInput is what the shell knows at one tick.
type MonitorInput struct {
	Now time.Time
	// Live: the nodes the registry lists as alive, and whether each
	// one's queue has a consumer.
	Live map[string]bool
	// LastSeen: for owners that are not live, when this process last saw
	// them announce (absent or zero: never).
	LastSeen map[string]time.Time
	// Owners: the nodes that own groups (bound, or being moved off).
	Owners map[string]bool
	// Unsettled: the records moving or in a hand-over step.
	Unsettled map[string]kvbinding.Binding
	// Nodes: the nodes the rules may choose from (live, not suspect,
	// announcing on time), with their consumer presence and bound group
	// counts, for rebalancing (nil: no rebalancing this tick).
	Nodes map[string]NodeState
	// Candidates: for the nodes Overloaded named, their settled groups
	// (see Candidate).
	Candidates map[string][]Candidate
}

// Evacuation asks the shell to take groups off Node from its checkpoint.
type Evacuation struct {
	Node string
	// Groups: the groups to take off; nil: all of the node's groups (it
	// is gone).
	Groups []string
}

// MonitorActions is what one tick decided, for the shell to carry out.
type MonitorActions struct {
	// Evacuate: nodes gone past NodeGrace (Groups nil), then nodes that
	// did not fence moves within FenceDeadline (their groups), by node id.
	Evacuate []Evacuation
	// Departed: owners first seen gone this tick, before NodeGrace: the
	// shell takes off at once their groups whose binding starts at or
	// after the node's checkpoint (nothing of theirs is covered by it, so
	// waiting for the node to come back saves nothing), by node id.
	Departed []string
	// Rebind: live nodes whose queue has had no consumer for RebindAfter
	// while another node's has one, by node id.
	Rebind []string
	// Rebalance: settled groups to move to spread the load.
	Rebalance []RebalanceMove
}

func (s *MonitorState) init() {
	if s.GoneSince == nil {
		s.GoneSince, s.NoConsumer, s.Evacuating = map[string]time.Time{}, map[string]time.Time{}, map[string]bool{}
		s.Moving, s.Unsettled = map[string]SeenRev{}, map[string]time.Time{}
	}
}

// Plan decides one tick: it updates s with what in shows and returns what
// to do. Nodes it names in Evacuate and Rebind are marked evacuating until
// the shell calls Done for them.
func (s *MonitorState) Plan(cfg MonitorConfig, in MonitorInput) MonitorActions {
	s.init()
	now := in.Now
	someConsumer := false
	for _, has := range in.Live {
		someConsumer = someConsumer || has
	}
	var out MonitorActions
	for _, node := range sortedSet(in.Owners) {
		has, alive := in.Live[node]
		if !alive {
			delete(s.NoConsumer, node)
			since, ok := s.GoneSince[node]
			if !ok {
				// Gone since its last announcement, if this process saw
				// one: the grace counts from there, not from when its
				// liveness record expired.
				since = now
				if seen := in.LastSeen[node]; !seen.IsZero() && seen.Before(now) {
					since = seen
				}
				s.GoneSince[node] = since
				if now.Sub(since) < cfg.NodeGrace && !s.Evacuating[node] {
					out.Departed = append(out.Departed, node)
					s.Evacuating[node] = true
					continue
				}
			}
			if now.Sub(since) >= cfg.NodeGrace && !s.Evacuating[node] {
				out.Evacuate = append(out.Evacuate, Evacuation{Node: node})
				s.Evacuating[node] = true
			}
			continue
		}
		delete(s.GoneSince, node)
		if has || !someConsumer || cfg.RebindAfter < 0 {
			delete(s.NoConsumer, node)
			continue
		}
		since, ok := s.NoConsumer[node]
		if !ok {
			s.NoConsumer[node] = now
			continue
		}
		if now.Sub(since) >= cfg.RebindAfter && !s.Evacuating[node] {
			out.Rebind = append(out.Rebind, node)
			s.Evacuating[node] = true
		}
	}
	// Moves waiting for a fence.
	overdue := map[string][]string{}
	for g, r := range in.Unsettled {
		s.Unsettled[g] = now
		if r.State != kvbinding.StateMoving {
			continue
		}
		seen, ok := s.Moving[g]
		if !ok || seen.Rev != r.Revision {
			s.Moving[g] = SeenRev{Rev: r.Revision, Seen: now}
			continue
		}
		if now.Sub(seen.Seen) >= cfg.FenceDeadline && !s.Evacuating[r.PrevNode] {
			overdue[r.PrevNode] = append(overdue[r.PrevNode], g)
		}
	}
	for g := range s.Moving {
		if r, ok := in.Unsettled[g]; !ok || r.State != kvbinding.StateMoving {
			delete(s.Moving, g)
		}
	}
	for g, at := range s.Unsettled {
		if _, ok := in.Unsettled[g]; !ok && now.Sub(at) >= cfg.Rebalance.CoolDown {
			delete(s.Unsettled, g)
		}
	}
	for _, node := range sortedKeys(overdue) {
		groups := overdue[node]
		sort.Strings(groups)
		out.Evacuate = append(out.Evacuate, Evacuation{Node: node, Groups: groups})
		s.Evacuating[node] = true
	}
	steady := true
	if cfg.Rebalance.Enabled && in.Nodes != nil {
		total := 0
		for _, n := range in.Nodes {
			total += n.Groups
		}
		if s.BalanceCounted && total != s.BalanceTotal && s.BalanceWaits < steadyTicks {
			steady = false
			s.BalanceWaits++
		} else {
			s.BalanceWaits = 0
		}
		s.BalanceTotal, s.BalanceCounted = total, true
	}
	if cfg.Rebalance.Enabled && in.Nodes != nil && steady && !s.Rebalancing && len(out.Evacuate) == 0 && len(out.Rebind) == 0 && len(s.Evacuating) == 0 {
		// Nodes being emptied come first: their groups land where the
		// balance is counted next tick.
		out.Rebalance = PlanRebalance(cfg.Rebalance, RebalanceInput{
			Now: now, Nodes: in.Nodes, Incoming: Incoming(in.Unsettled), Candidates: in.Candidates, LastMove: s.Unsettled,
			InFlight: len(in.Unsettled),
		})
		for _, mv := range out.Rebalance {
			// Counted as moving from now: a move the shell fails to
			// start waits out the cool-down too (it is not retried at
			// every tick).
			s.Unsettled[mv.Group] = now
		}
		s.Rebalancing = len(out.Rebalance) > 0
	}
	return out
}

// Done tells the state that the evacuation or rebind of node the shell
// started has ended; gone or noConsumer clears the node's clock too, so
// that a node still gone (or still without a consumer) is acted on again
// after a new grace.
func (s *MonitorState) Done(node string, gone, noConsumer bool) {
	s.init()
	delete(s.Evacuating, node)
	if gone {
		delete(s.GoneSince, node)
	}
	if noConsumer {
		delete(s.NoConsumer, node)
	}
}

// RebalanceDone tells the state that the rebalance moves of the last
// tick that planned some have been written (or failed).
func (s *MonitorState) RebalanceDone() { s.Rebalancing = false }

// Incoming counts, per target node, the groups moving to it (for
// Overloaded and PlanRebalance: they count for their target).
func Incoming(unsettled map[string]kvbinding.Binding) map[string]int {
	out := map[string]int{}
	for g, r := range unsettled {
		if r.State == kvbinding.StateMoving && r.Node != "" && g != "" {
			out[r.Node]++
		}
	}
	return out
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// PauseInput is what the pause keeper knows at one tick.
type PauseInput struct {
	Now time.Time
	// Paused: until when this handler last paused each queue consumer.
	Paused map[string]time.Time
	// Pausing: record writes in flight that paused each node's queue.
	Pausing map[string]int
	// Draining: per node, the records whose drain lists it.
	Draining map[string]int
	// CatchingUp: per node, the records catching up a group taken from
	// it (their previous node); CatchUpSince: since when (TrackCatchUps).
	CatchingUp   map[string]int
	CatchUpSince map[string]time.Time
	// Window: how long one pause lasts.
	Window time.Duration
}

// CatchUpHold bounds how long a queue stays paused for the catch-ups
// from its node once no record drains it (PlanPauses): past it, a
// catch-up that has not ended (it retries a failure, or reads a long
// span) no longer holds back the node's other groups.
const CatchUpHold = 3 * pauseWindow

// PlanPauses returns the queue consumers to pause (again) and those to
// resume: a queue a record drains is paused, renewed once a third of its
// window has passed; a queue this handler paused stays paused (renewed)
// while a record catches up a group taken from its node, for CatchUpHold
// at most, so that a copy that landed on it after the drain looked (a
// publish held by a partitioned link, a client's buffer flushed after a
// reconnect) is still there when the catch-up meets it by its id and
// moves it, not taken by the old consumer meanwhile; a queue this
// handler paused that nothing of these holds and no write in flight is
// about to drain is resumed.
func PlanPauses(in PauseInput) (pause, resume []string) {
	for _, node := range sortedKeys(in.Draining) {
		if in.Draining[node] > 0 && NeedsPause(in.Paused, node, in.Now, in.Window) {
			pause = append(pause, node)
		}
	}
	held := func(node string) bool {
		since, ok := in.CatchUpSince[node]
		return in.CatchingUp[node] > 0 && in.Draining[node] == 0 && ok && in.Now.Sub(since) < CatchUpHold
	}
	for _, node := range sortedKeys(in.CatchingUp) {
		if _, paused := in.Paused[node]; paused && held(node) && NeedsPause(in.Paused, node, in.Now, in.Window) {
			pause = append(pause, node)
		}
	}
	sort.Strings(pause)
	for _, node := range sortedKeys(in.Paused) {
		if in.Draining[node] == 0 && !held(node) && in.Pausing[node] == 0 {
			resume = append(resume, node)
		}
	}
	return pause, resume
}

// TrackCatchUps keeps since, per node, the time since when records catch
// up groups taken from it while none drains it, as of now.
func TrackCatchUps(since map[string]time.Time, catchingUp, draining map[string]int, now time.Time) {
	for node := range since {
		if catchingUp[node] == 0 || draining[node] > 0 {
			delete(since, node)
		}
	}
	for node, n := range catchingUp {
		if _, ok := since[node]; !ok && n > 0 && draining[node] == 0 {
			since[node] = now
		}
	}
}

// EndsPause reports whether the record written (next) no longer names a
// queue that its previous revision (cur) kept paused (PlanPauses): one it
// drained, or the one it caught up from. The handler runs its keeper at
// once after such a write, not at its next tick.
func EndsPause(cur *kvbinding.Binding, next kvbinding.Binding) bool {
	if cur == nil {
		return false
	}
	for _, n := range cur.Drain {
		if !slices.Contains(next.Drain, n) && !catchesUpFrom(next, n) {
			return true
		}
	}
	return catchesUpFrom(*cur, cur.PrevNode) && !catchesUpFrom(next, cur.PrevNode)
}

// catchesUpFrom reports whether record b catches up a group taken from
// node.
func catchesUpFrom(b kvbinding.Binding, node string) bool {
	return node != "" && b.State == kvbinding.StateBound && b.Step == kvbinding.StepCatchUp && b.PrevNode == node
}

// NeedsPause reports whether node's queue consumer must be paused now: it
// was not paused by this handler, or its pause has less than two thirds
// of the window left.
func NeedsPause(paused map[string]time.Time, node string, now time.Time, window time.Duration) bool {
	until, ok := paused[node]
	return !ok || until.Sub(now) <= 2*window/3
}
