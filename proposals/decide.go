package proposals

import (
	"sort"
	"time"

	"grouprouter/kvbinding"
)

// NodeState is what the decision rule knows of a node.
type NodeState struct {
	// HasConsumer is true while the node's queue has an active consumer.
	HasConsumer bool
	// Groups is the number of groups bound to the node.
	Groups int
}

// State is everything the decision rule looks at besides the proposal.
type State struct {
	// Existing is the group's current record, if any.
	Existing *kvbinding.Route
	// Live holds the nodes that are alive now.
	Live map[string]NodeState
}

// Action says what the handler must do to carry out a decision.
type Action int

const (
	// Keep: a route stands already; write nothing, reply Rejected with it.
	Keep Action = iota + 1
	// Create: write Binding with KV create (the group has no record).
	Create
	// Replace: write Binding over the record at Existing.Revision (a
	// dead-letter record the proposal comes after).
	Replace
	// Fail: decide nothing now; Reason says why.
	Fail
)

// Verdict is the outcome of the decision rule.
type Verdict struct {
	Action Action
	// Binding to write (Create, Replace); for Keep, only Node is meaningful
	// when Existing was a bound record.
	Binding kvbinding.Binding
	// Redirected is true when the handler chose another node than proposed.
	Redirected bool
	Reason     string
}

// Decide is the decision rule of the LOCAL handler: a pure function of the
// known state, the proposal and the time. The rule:
//
//   - a group that is bound keeps its binding (Keep);
//   - a group dead-lettered through T keeps that record for proposals from
//     T or earlier, and is bound afresh for later ones (Replace);
//   - otherwise the proposed node is bound if it is eligible (Create, the
//     proposal is accepted); if not, the eligible node with the fewest
//     groups is bound instead (Create, Redirected; ties by node id);
//   - with no eligible node, nothing is decided (Fail).
//
// A node is eligible when it is alive and its queue has a consumer, or when
// no live node has one (then the messages wait on a queue, not in memory).
// For the ungrouped routing binding (group ""), any live node is eligible.
func Decide(s State, p Proposal, now time.Time) Verdict {
	action := Create
	prev := ""
	if e := s.Existing; e != nil {
		switch e.State {
		case kvbinding.StateBound:
			return Verdict{Action: Keep, Binding: kvbinding.Binding{Group: p.Group, State: e.State, Node: e.Node, FromSeq: e.FromSeq}, Reason: "group is bound"}
		case kvbinding.StateMoving:
			return Verdict{Action: Keep, Binding: kvbinding.Binding{Group: p.Group, State: e.State, Node: e.Node, PrevNode: e.PrevNode}, Reason: "group is being moved"}
		case kvbinding.StateDeadLettered, kvbinding.StateReleased:
			if p.FromSeq <= e.ThroughSeq {
				return Verdict{Action: Keep, Binding: kvbinding.Binding{Group: p.Group, State: e.State, ThroughSeq: e.ThroughSeq, PrevNode: e.PrevNode}, Reason: "the proposal comes before the end of the previous binding"}
			}
			action = Replace
			if e.State == kvbinding.StateReleased {
				prev = e.PrevNode
			}
		}
	}
	node, redirected := choose(s.Live, p)
	if prev != "" && redirected && isEligible(s.Live, prev, p.Group == "") {
		// After an expiry or close, the node that had the group keeps it
		// when it can: its queue may still hold the group's last messages.
		node, redirected = prev, false
	}
	if node == "" {
		return Verdict{Action: Fail, Reason: "no eligible node is alive"}
	}
	v := Verdict{
		Action:     action,
		Redirected: redirected,
		Binding: kvbinding.Binding{
			Group:     p.Group,
			State:     kvbinding.StateBound,
			Node:      node,
			FromSeq:   p.FromSeq,
			DecidedAt: now.UTC(),
		},
	}
	if redirected {
		v.Reason = "proposed node " + p.Node + " is not eligible"
		v.Binding.Reason = v.Reason
	}
	if prev != "" {
		// Nodes may have skipped the group's messages after the release
		// (they were the previous owner's then): the new owner takes them
		// over from the ingress, and any waiting on prev's queue.
		v.Binding.PrevNode = prev
		v.Binding.Handoff = true
	}
	return v
}

func isEligible(live map[string]NodeState, node string, ungrouped bool) bool {
	for _, n := range Eligible(live, ungrouped) {
		if n == node {
			return true
		}
	}
	return false
}

// MoveRequest is an operator's or the handler's request to move a bound
// group to Target, or to unbind it (Target "").
type MoveRequest struct {
	Group  string
	Target string
	Reason string
}

// DecideMove is the rule for moving or unbinding a group: the group must be
// bound (and not already changing hands); the target must be eligible. It
// returns Replace with a StateMoving record, Keep when the group is already
// bound to the target, or Fail with the reason (and ErrUnknownGroup or
// ErrIneligibleNode in Err).
func DecideMove(s State, m MoveRequest, now time.Time) (Verdict, error) {
	e := s.Existing
	if e == nil || (e.State != kvbinding.StateBound && e.State != kvbinding.StateMoving) {
		return Verdict{Action: Fail, Reason: "group is not bound"}, ErrUnknownGroup
	}
	if e.State == kvbinding.StateMoving || e.Handoff {
		return Verdict{Action: Fail, Reason: "group is being moved already"}, ErrMoveInProgress
	}
	if m.Target == e.Node {
		return Verdict{Action: Keep, Binding: kvbinding.Binding{Group: m.Group, State: e.State, Node: e.Node, FromSeq: e.FromSeq}, Reason: "already bound there"}, nil
	}
	if m.Target != "" {
		if _, live := s.Live[m.Target]; !live {
			return Verdict{Action: Fail, Reason: "node " + m.Target + " is not alive"}, ErrIneligibleNode
		}
		if !isEligible(s.Live, m.Target, m.Group == "") {
			return Verdict{Action: Fail, Reason: "node " + m.Target + " has no queue consumer while others have one"}, ErrIneligibleNode
		}
	}
	return Verdict{Action: Replace, Reason: m.Reason, Binding: kvbinding.Binding{
		Group: m.Group, State: kvbinding.StateMoving, Node: m.Target, PrevNode: e.Node,
		FromSeq: e.FromSeq, DecidedAt: now.UTC(), Reason: m.Reason,
	}}, nil
}

// Eligible returns the nodes a group may be bound to, sorted by id.
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

func choose(live map[string]NodeState, p Proposal) (node string, redirected bool) {
	eligible := Eligible(live, p.Group == "")
	best := ""
	for _, id := range eligible {
		if id == p.Node {
			return id, false
		}
		if best == "" || live[id].Groups < live[best].Groups {
			best = id
		}
	}
	return best, best != ""
}
