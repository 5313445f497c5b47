package proposals

import (
	"hash/fnv"
	"sort"
)

// The node-choice rules: which nodes may take a group, which one a new
// group goes to, where a moved group goes, which node proposes a group and
// where a message without a group goes. All are pure functions of what
// they are given.

// NodeState is what the rules know of a live node.
type NodeState struct {
	// HasConsumer is true while the node's queue has an active consumer.
	HasConsumer bool
	// Groups is the number of groups bound to the node.
	Groups int
}

// Eligible returns the nodes a group may be bound to, sorted by id: the
// live nodes whose queue has a consumer, or every live node when none has
// one (the messages then wait on a queue, not in memory). For the
// ungrouped routing binding (ungrouped), every live node is eligible.
func Eligible(live map[string]NodeState, ungrouped bool) []string {
	withConsumer := false
	if !ungrouped {
		for _, n := range live {
			if n.HasConsumer {
				withConsumer = true
				break
			}
		}
	}
	out := make([]string, 0, len(live))
	for id, n := range live {
		if !withConsumer || n.HasConsumer {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

func isEligible(live map[string]NodeState, node string, ungrouped bool) bool {
	for _, n := range Eligible(live, ungrouped) {
		if n == node {
			return true
		}
	}
	return false
}

// Choose returns the node a new group is bound to: the proposed node if it
// is eligible, else the eligible node with the fewest groups (ties by
// node id), with redirected set; "" when no node is eligible.
func Choose(live map[string]NodeState, proposed string, ungrouped bool) (node string, redirected bool) {
	eligible := Eligible(live, ungrouped)
	for _, id := range eligible {
		if id == proposed {
			return id, false
		}
	}
	best := LeastLoaded(eligible, func(id string) int { return live[id].Groups }, 0)
	return best, best != ""
}

// PickTarget returns the node a group taken off a node goes to: the target
// of the move in progress (current, "" if none) if it is still eligible,
// else the eligible node with the fewest groups, ties by node id; "" when
// none is eligible. It counts the choice in live (so that a node's groups
// spread when picked one after another).
func PickTarget(live map[string]NodeState, group, current string) string {
	eligible := Eligible(live, group == "")
	best := ""
	for _, n := range eligible {
		if n == current {
			best = n
			break
		}
	}
	if best == "" {
		best = LeastLoaded(eligible, func(id string) int { return live[id].Groups }, 0)
	}
	if best != "" && group != "" {
		s := live[best]
		s.Groups++
		live[best] = s
	}
	return best
}

// Proposer returns which of nodes proposes a binding for group: the one
// with the highest rendezvous hash of (node, group), ties by node id. Every
// node computes it from the same live set, so one node proposes a group
// and the others wait for its binding (they propose too after a timeout,
// in case it is gone).
func Proposer(group string, nodes []string) string {
	best, bestNode := uint64(0), ""
	for _, node := range nodes {
		if v := rendezvous(node, group); bestNode == "" || v > best || (v == best && node < bestNode) {
			best, bestNode = v, node
		}
	}
	return bestNode
}

// IsProposer reports whether me proposes for group among me and the live
// nodes (live may or may not list me).
func IsProposer(group, me string, live []string) bool {
	mine := rendezvous(me, group)
	for _, n := range live {
		if n == me {
			continue
		}
		if v := rendezvous(n, group); v > mine || (v == mine && n < me) {
			return false
		}
	}
	return true
}

func rendezvous(node, group string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(group))
	// FNV-1a alone leaves ids that share a prefix clustered in the high
	// bits; the 64-bit finalizer spreads them.
	return mix64(h.Sum64())
}

// mix64 is the MurmurHash3 64-bit finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb93e53ca34d5
	x ^= x >> 33
	return x
}

// UngroupedDestination returns the node a message without a group id goes
// to: me when preferMe (local-first, and my queue has a consumer); else
// the turn-th eligible node (round-robin over the nodes whose queue has a
// consumer, over every live node when none has one); me when no node is
// live.
func UngroupedDestination(live map[string]NodeState, me string, preferMe bool, turn int) string {
	if preferMe {
		return me
	}
	eligible := Eligible(live, false)
	if len(eligible) == 0 {
		return me
	}
	return eligible[turn%len(eligible)]
}
