package proposals

import (
	"sort"
	"time"
)

// The balancer: which node is the least loaded (new groups, groups taken
// off a node, a node's proposals), and which groups move to spread the
// load (rebalancing). Pure functions of what they are given.

// LeastLoaded returns the node of nodes with the least load, "" when nodes
// is empty. Ties go to the first in nodes' order starting at index turn
// (modulo len(nodes)): turn 0 breaks ties by order, a turn that grows
// with each call spreads them round-robin.
func LeastLoaded(nodes []string, load func(node string) int, turn int) string {
	if len(nodes) == 0 {
		return ""
	}
	if turn < 0 {
		turn = -turn
	}
	best, bestLoad := "", 0
	for i := range nodes {
		n := nodes[(turn+i)%len(nodes)]
		if l := load(n); best == "" || l < bestLoad {
			best, bestLoad = n, l
		}
	}
	return best
}

// RebalanceConfig tunes rebalancing.
type RebalanceConfig struct {
	// Enabled turns rebalancing on.
	Enabled bool
	// Tolerance: how many groups a node may hold above (or below) its
	// share (the groups on nodes with a consumer, divided by their
	// number) before groups move.
	Tolerance int
	// Slack widens the tolerance to this fraction of a node's share when
	// that is more (0.05: a node of 1,000 groups over 3 nodes may be 16
	// off its share of 333): a move pauses the old node's queue consumer,
	// which holds back all of its groups for the hand-over's drain, a
	// price that a difference of a few groups in hundreds is not worth.
	// 0 in a handler's configuration takes DefaultRebalance's; negative:
	// none.
	Slack float64
	// MaxMoves bounds the moves started per handler tick.
	MaxMoves int
	// MaxInFlight bounds the groups moving (for any reason) when
	// rebalancing starts a move: no rebalance move is started while that
	// many are unsettled.
	MaxInFlight int
	// CoolDown: a group that moved (for any reason) is not moved again by
	// rebalancing before this much time has passed since it was last seen
	// unsettled.
	CoolDown time.Duration
	// ReturnCoolDown: a node that was live, went and came back (a
	// partition healed, a process restarted) neither gives nor takes
	// groups by rebalancing before it has been back this long: its
	// publishes held by the network may still be landing, and it may still
	// be catching up.
	ReturnCoolDown time.Duration
}

// DefaultRebalance is the rebalancing of a handler whose configuration
// does not say otherwise.
var DefaultRebalance = RebalanceConfig{Enabled: true, Tolerance: 1, Slack: 0.05, MaxMoves: 4, MaxInFlight: 16, CoolDown: 30 * time.Second,
	ReturnCoolDown: 10 * time.Second}

// allowance returns how far a node's load times n may be from total (the
// comparisons are made on load×n, to stay in whole numbers where they
// can): n times the tolerance, or Slack times total when more.
func (cfg RebalanceConfig) allowance(n, total int) float64 {
	return max(float64(cfg.Tolerance*n), cfg.Slack*float64(total))
}

// Candidate is a settled group a rebalance may move.
type Candidate struct {
	Group string
	// Busy: the group's node reported it busy (messages routed recently
	// or held); idle groups move first.
	Busy bool
}

// RebalanceMove is one group to move to spread the load.
type RebalanceMove struct {
	Group, From, To string
}

// RebalanceInput is what PlanRebalance decides on.
type RebalanceInput struct {
	Now time.Time
	// Nodes: the live nodes with their consumer presence and settled or
	// bound group counts (NodeState.Groups).
	Nodes map[string]NodeState
	// Incoming: per node, the groups moving to it (not in its count yet).
	Incoming map[string]int
	// Candidates: per node, its settled groups that may move.
	Candidates map[string][]Candidate
	// LastMove: when each group was last seen moving (cool-down).
	LastMove map[string]time.Time
	// InFlight: how many groups are moving now, for any reason.
	InFlight int
}

// balanceLoads returns the eligible nodes (sorted), their loads (bound
// groups plus groups moving to them) and the total.
func balanceLoads(nodes map[string]NodeState, incoming map[string]int) ([]string, map[string]int, int) {
	eligible := Eligible(nodes, false)
	loads := make(map[string]int, len(eligible))
	total := 0
	for _, n := range eligible {
		loads[n] = nodes[n].Groups + incoming[n]
		total += loads[n]
	}
	return eligible, loads, total
}

// Overloaded returns the eligible nodes holding more than their share, when
// some node is out of the tolerance (above share+tolerance or below
// share-tolerance); nil when the load is balanced. The shell reads the
// groups of these nodes only (Candidates).
func Overloaded(cfg RebalanceConfig, nodes map[string]NodeState, incoming map[string]int) []string {
	eligible, loads, total := balanceLoads(nodes, incoming)
	n := len(eligible)
	if n < 2 {
		return nil
	}
	out, unbalanced := []string(nil), false
	allow := cfg.allowance(n, total)
	for _, id := range eligible {
		l := loads[id] * n
		if float64(l) > float64(total)+allow || float64(l) < float64(total)-allow {
			unbalanced = true
		}
		if l > total {
			out = append(out, id)
		}
	}
	if !unbalanced {
		return nil
	}
	return out
}

// PlanRebalance returns the groups to move so that every node with a
// consumer holds its share within the tolerance: repeatedly one group from
// the most loaded node (ties by id) to the least loaded (ties by id),
// while one is out of the tolerance and the two differ by two or more;
// idle candidates first, then by group id; never a group moved within the
// cool-down; at most MaxMoves, and none when MaxInFlight groups are
// moving already.
func PlanRebalance(cfg RebalanceConfig, in RebalanceInput) []RebalanceMove {
	budget := cfg.MaxMoves
	if cfg.MaxInFlight > 0 {
		budget = min(budget, cfg.MaxInFlight-in.InFlight)
	}
	if !cfg.Enabled || budget <= 0 {
		return nil
	}
	eligible, loads, total := balanceLoads(in.Nodes, in.Incoming)
	n := len(eligible)
	if n < 2 {
		return nil
	}
	// Each node's movable groups, in the order they go.
	queue := make(map[string][]string, len(in.Candidates))
	for node, cs := range in.Candidates {
		if _, ok := loads[node]; !ok {
			continue
		}
		ok := make([]Candidate, 0, len(cs))
		for _, c := range cs {
			if c.Group == "" {
				continue // the ungrouped routing binding
			}
			if at, moved := in.LastMove[c.Group]; moved && in.Now.Sub(at) < cfg.CoolDown {
				continue
			}
			ok = append(ok, c)
		}
		sort.Slice(ok, func(i, j int) bool {
			if ok[i].Busy != ok[j].Busy {
				return !ok[i].Busy
			}
			return ok[i].Group < ok[j].Group
		})
		for _, c := range ok {
			queue[node] = append(queue[node], c.Group)
		}
	}
	var out []RebalanceMove
	for len(out) < budget {
		// The least loaded node takes; the most loaded node that has a
		// group to give gives.
		dst := LeastLoaded(eligible, func(id string) int { return loads[id] }, 0)
		src := ""
		for _, id := range eligible {
			if len(queue[id]) > 0 && (src == "" || loads[id] > loads[src]) {
				src = id
			}
		}
		if src == "" || loads[src]-loads[dst] < 2 {
			break
		}
		allow := cfg.allowance(n, total)
		over := float64(loads[src]*n) > float64(total)+allow
		under := float64(loads[dst]*n) < float64(total)-allow
		if !over && !under {
			break
		}
		g := queue[src][0]
		queue[src] = queue[src][1:]
		out = append(out, RebalanceMove{Group: g, From: src, To: dst})
		loads[src]--
		loads[dst]++
	}
	return out
}
