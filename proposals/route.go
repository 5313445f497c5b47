package proposals

import "github.com/grouprouter/grouprouter/kvbinding"

// RouteAction says what a node does with a message, given its group's
// record.
type RouteAction uint8

const (
	// RouteTo: the message belongs to the owner returned with it ("" for
	// a dead-lettered message); a node that is not the owner skips it.
	RouteTo RouteAction = iota + 1
	// RouteWait: hold the message; a change that concerns this node is in
	// progress and a later revision of the record decides.
	RouteWait
	// RoutePropose: no binding covers the message; the group needs one.
	RoutePropose
)

// Owner says, for node me, what to do with the group's message at ingress
// sequence seq according to record r. An invalid record counts as none.
func Owner(r kvbinding.Binding, seq uint64, me string) (owner string, act RouteAction) {
	if r.Invalid {
		return "", RoutePropose
	}
	switch r.State {
	case kvbinding.StateBound:
		if seq < r.FromSeq {
			if r.PrevNode != "" {
				return r.PrevNode, RouteTo
			}
			// History before FromSeq is unknown: the current binding
			// stands (the queue stream's duplicate window absorbs a
			// double route).
			return r.Node, RouteTo
		}
		if r.Step != kvbinding.StepNone && r.Node == me {
			return "", RouteWait
		}
		return r.Node, RouteTo
	case kvbinding.StateMoving:
		if me == r.Node || me == r.PrevNode {
			return "", RouteWait
		}
		// Neither the old nor the new owner: never this node's to route.
		return r.PrevNode, RouteTo
	case kvbinding.StateReleased:
		if seq <= r.ThroughSeq {
			return r.PrevNode, RouteTo
		}
	case kvbinding.StateDeadLettered:
		if seq <= r.ThroughSeq {
			return "", RouteTo
		}
	}
	return "", RoutePropose
}

// Duty is what a record asks of one node.
type Duty uint8

const (
	// DutyNone: nothing.
	DutyNone Duty = iota
	// DutyFence: stop routing the group and report the fence (OpFence)
	// once no publish of it is in flight.
	DutyFence
	// DutyDrain: move the group's messages off the Drain queues to my
	// queue, then report OpDrained.
	DutyDrain
	// DutyCatchUp: route from the ingress the group's messages from
	// FromSeq that I skipped, then report OpCaughtUp.
	DutyCatchUp
)

// DutyOf returns what record r asks of node me.
func DutyOf(r kvbinding.Binding, me string) Duty {
	switch {
	case r.Invalid:
	case r.State == kvbinding.StateMoving && r.PrevNode == me:
		return DutyFence
	case r.State == kvbinding.StateBound && r.Node == me && r.Step == kvbinding.StepDrain:
		return DutyDrain
	case r.State == kvbinding.StateBound && r.Node == me && r.Step == kvbinding.StepCatchUp:
		return DutyCatchUp
	}
	return DutyNone
}

// Evacuated reports whether take-over record r was written by an
// evacuation: the handler took the group from a node that never fenced
// it, from that node's checkpoint, so the node may have routed some of
// the group's messages past r.FromSeq. A record a fence wrote starts at
// the first message its node did not route. (An evacuation says why in
// its Reason; a fence's record has none.)
func Evacuated(r kvbinding.Binding) bool {
	return r.State == kvbinding.StateBound && r.Step != kvbinding.StepNone && r.Reason != ""
}

// MoveDone reports whether a move of a group to target (an unbind when
// target is "") has finished, given the group's record at or after the
// revision that started it (nil: the record is gone). A move is done when
// the group is settled on target; an unbind as soon as the record is no
// longer moving (released, and maybe bound afresh by a new message since).
func MoveDone(r *kvbinding.Binding, target string) bool {
	if target == "" {
		return r == nil || r.State != kvbinding.StateMoving
	}
	return r != nil && r.Settled() && r.Node == target
}
