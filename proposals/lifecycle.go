package proposals

import (
	"fmt"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// A group's record goes through these states (kvbinding.State and Step):
//
//	(none) ──bind──▶ bound ──move/unbind──▶ moving ──fence──▶ bound·drain ──drained──▶ bound·catchup ──caught_up──▶ bound
//	  ▲                │ ▲                     │                  ▲                                         │
//	  │                │ └─────────────────────┼──evacuate (node gone, fence overdue)──────────────────────┘
//	  │                └─release (expire, close)──▶ released ──bind──▶ bound·drain or bound (same node)
//	  └──(TTL)── released, dead-lettered ◀──deadletter── (none)
//
// Transition is the only place that decides a record's next revision. The
// LOCAL handler is the only writer of records: nodes ask it (bind, fence,
// drained, caught_up, release, deadletter), operators ask it (move,
// unbind), and it asks itself (evacuate). Every write is a create or a
// compare-and-set on the revision Transition looked at, so a decision
// taken on a record that changed meanwhile is simply not written.

// Op names a change asked of a group's record.
type Op string

const (
	// OpBind: bind an unbound group to Node from Seq (the group's first
	// message waiting at the proposer). Asked by the group's proposer.
	OpBind Op = "bind"
	// OpFence: the node a group is moving away from has stopped routing
	// it; Seq is the group's first message it did not route.
	OpFence Op = "fence"
	// OpDrained: the new node moved the group's messages off the queues
	// in the record's Drain list.
	OpDrained Op = "drained"
	// OpCaughtUp: the new node routed from the ingress what it had
	// skipped; the move is done.
	OpCaughtUp Op = "caught_up"
	// OpRelease: the bound node ends the binding after Seq (idle expiry,
	// a close marker); Kind says which.
	OpRelease Op = "release"
	// OpDeadLetter: the proposer put the group's held messages through
	// Seq on the dead-letter stream.
	OpDeadLetter Op = "deadletter"
	// OpMove: move a bound group to Node (an operator, or the handler for
	// a node whose queue has no consumer). The bound node fences it.
	OpMove Op = "move"
	// OpUnbind: end a bound group's binding (an operator). The bound node
	// fences it and the record ends.
	OpUnbind Op = "unbind"
	// OpEvacuate: take a group from node From, which is gone or has not
	// fenced in time, to Node, from Seq (From's checkpoint; 0 if unknown).
	// Asked by the handler only.
	OpEvacuate Op = "evacuate"
)

// nodeOps are the ops a router node may ask for itself.
var nodeOps = map[Op]bool{OpBind: true, OpFence: true, OpDrained: true, OpCaughtUp: true, OpRelease: true, OpDeadLetter: true}

// IsNodeOp reports whether op is one a router node asks for (on its own
// proposal subject), as opposed to an operator's or the handler's.
func IsNodeOp(op Op) bool { return nodeOps[op] }

// Input is one thing asked of a group's record.
type Input struct {
	Op Op
	// By is the node asking (node ops), or who asked for a move (an
	// operator, the handler).
	By string
	// Node is the proposed node (bind) or the target (move, evacuate;
	// "" for unbind).
	Node string
	// From is the node the group is taken from (evacuate).
	From string
	// First is the first message a dead-letter ask covers (0: unknown).
	First uint64
	// Seq is, by op: bind, the group's first waiting message; fence and
	// evacuate, the first message the node giving the group up did not
	// route; release and deadletter, the last message covered.
	Seq uint64
	// Rev is the revision the node acted on (fence, drained, caught_up,
	// release): a report on an older revision is stale.
	Rev uint64
	// Kind is EventExpire or EventClose (release).
	Kind string
	// Reason says why (move, unbind, evacuate, release, deadletter).
	Reason string
	// Count is how many messages the step concerned, for its event.
	Count int
	// Routed is, for an evacuation of a node that was taking the group
	// over, the last ingress sequence its checkpoint says it routed of the
	// group (0: unknown).
	Routed uint64
	// Ckpt is, for an evacuation, the KV revision of From's checkpoint
	// Seq was taken from (0: none): the record carries it
	// (kvbinding.Binding.Ckpt) when it takes the group from From.
	Ckpt uint64
	// Clean is, for a fence, the fencing node's word that, once it had
	// stopped routing the group and its publishes had their answers, its
	// queue and held subject stored no message of the group (waiting, or
	// delivered and not acknowledged): nothing there to drain, so its
	// queue is neither paused nor drained, and the new node goes straight
	// to its catch-up.
	Clean bool
}

// Env is what Transition knows besides the record and the input.
type Env struct {
	Now time.Time
	// Handler is the deciding handler's id (name/node), for decided_by.
	Handler string
	// Live holds the nodes alive now, with their consumer presence and
	// bound group counts.
	Live map[string]NodeState
	// IngressLast is the ingress stream's last sequence as the handler
	// knows it, for dead-letter asks (0: unknown: a dead-letter ask then
	// fails, to be asked again).
	IngressLast uint64
	// Floor is the routing floor (see NextFloor): every ingress message
	// below it was resolved cluster-wide, so no binding starts below it.
	// 0: none.
	Floor uint64
	// Bound is the number of groups bound now (kvbinding.Cache.Bound),
	// and MaxGroups the most a new binding may make it (0: no limit).
	Bound, MaxGroups int
}

// Result is what Transition decides.
type Result struct {
	// Outcome: Accepted (Write is the new record), Rejected (another
	// record stands: the current one), Refused (the asker may not ask
	// this now: the record does not name it, or it is stale; the current
	// record stands) or Failed (nothing can be decided now; ask again).
	Outcome Outcome
	// Write is the record to write, or nil.
	Write *kvbinding.Binding
	// Create: write with KV create (the key has no record); otherwise
	// compare-and-set on the revision of the record Transition was given.
	Create bool
	// Ended: Write ends a binding (released, dead-lettered): it is
	// written with the ended-record TTL.
	Ended bool
	// Pause lists the nodes whose queue consumers must be paused before
	// Write is written (their queues are about to be drained).
	Pause []string
	// Event is published once Write is stored (or, for a Rejected bind,
	// at once), or nil.
	Event *Event
	// Err is a sentinel for Refused and Failed outcomes of operator ops
	// (ErrUnknownGroup, ErrIneligibleNode, ErrMoveInProgress), or nil.
	Err error
	// Reason explains the outcome.
	Reason string
	// Floor is, for a bind refused below the routing floor (Err
	// ErrBelowFloor), the floor: the asker drops its messages below it.
	Floor uint64
	// Limit is, for a bind refused at the group limit (Err
	// ErrGroupLimit), the limit.
	Limit int
}

// Refused is the outcome of an ask that is not the asker's to make (the
// record does not name it in that role) or is stale.
const Refused Outcome = "refused"

// Transition decides what in does to the group's record cur (nil when the
// group has no record). It is a pure function: no I/O, no clock (env.Now),
// and it does not modify its arguments.
func Transition(group string, cur *kvbinding.Binding, in Input, env Env) Result {
	if cur != nil && cur.Invalid {
		// An unusable value: the group is unbound, but a write must
		// replace that value (compare-and-set on its revision).
		return transition(group, nil, cur.Revision, in, env)
	}
	return transition(group, cur, 0, in, env)
}

func transition(group string, cur *kvbinding.Binding, badRev uint64, in Input, env Env) Result {
	if err := checkSeq(in, env); err != nil {
		return Result{Outcome: Refused, Reason: err.Error()}
	}
	if in.Op == OpDeadLetter && env.IngressLast == 0 {
		return Result{Outcome: Failed, Reason: errIngressUnknown.Error()}
	}
	m := machine{group: group, cur: cur, in: in, env: env, badRev: badRev}
	switch in.Op {
	case OpBind:
		return m.bind()
	case OpFence:
		return m.fence()
	case OpDrained:
		return m.drained()
	case OpCaughtUp:
		return m.caughtUp()
	case OpRelease:
		return m.release()
	case OpDeadLetter:
		return m.deadLetter()
	case OpMove, OpUnbind:
		return m.move()
	case OpEvacuate:
		return m.evacuate()
	}
	return Result{Outcome: Refused, Reason: fmt.Sprintf("unknown op %q", in.Op)}
}

// checkSeq refuses sequences an ask cannot carry. Only a dead-letter
// record is checked against the ingress: it makes every node skip the
// messages it covers, so it must not cover messages that were never
// stored (and so never dead-lettered). A bind, fence or release past the
// ingress's end only moves where later messages go.
func checkSeq(in Input, env Env) error {
	switch in.Op {
	case OpBind, OpFence, OpDeadLetter:
		if in.Seq == 0 {
			return fmt.Errorf("%s: seq must be >= 1", in.Op)
		}
	}
	if in.Op == OpDeadLetter && env.IngressLast > 0 && in.Seq > env.IngressLast {
		return fmt.Errorf("%s: seq %d is past the ingress stream's last message %d", in.Op, in.Seq, env.IngressLast)
	}
	return nil
}

// errIngressUnknown fails a dead-letter ask while the ingress stream's
// last sequence is not known: it cannot be checked, so it is not written.
var errIngressUnknown = fmt.Errorf("%s: the ingress stream's last sequence is not known; ask again", OpDeadLetter)

// machine holds one Transition's arguments.
type machine struct {
	group  string
	cur    *kvbinding.Binding
	in     Input
	env    Env
	badRev uint64 // revision of an invalid value to write over
}

// record returns a new record of the group stamped by the handler.
func (m *machine) record(state kvbinding.State) *kvbinding.Binding {
	return &kvbinding.Binding{Group: m.group, State: state, DecidedAt: m.env.Now.UTC(), DecidedBy: m.env.Handler}
}

// write returns an Accepted result writing b over the current record.
func (m *machine) write(b *kvbinding.Binding, ev *Event) Result {
	r := Result{Outcome: Accepted, Write: b, Create: m.cur == nil && m.badRev == 0, Event: ev}
	r.Ended = b.State == kvbinding.StateReleased || b.State == kvbinding.StateDeadLettered
	if b.Step == kvbinding.StepDrain {
		r.Pause = b.Drain
	}
	if ev != nil {
		ev.By = m.env.Handler
		if ev.Group == "" {
			ev.Group = m.group
		}
	}
	return r
}

// stands returns the outcome for an ask that leaves the current record.
func (m *machine) stands(outcome Outcome, reason string) Result {
	return Result{Outcome: outcome, Reason: reason}
}

// takeover returns the step a new owner of the group starts in when the
// queues in drain may hold its waiting messages: drain them first, except
// for the ungrouped routing binding, whose messages were spread over
// queues anyway and have no order to keep.
func (m *machine) takeover(b *kvbinding.Binding, drain []string) {
	if m.group == "" || len(drain) == 0 {
		b.Step = kvbinding.StepCatchUp
		return
	}
	b.Step, b.Drain = kvbinding.StepDrain, drain
}

func (m *machine) bind() Result {
	cur, in := m.cur, m.in
	if err := kvbinding.ValidateNodeID(in.Node); err != nil {
		return Result{Outcome: Refused, Reason: "bind: " + err.Error()}
	}
	from, prev := in.Seq, ""
	if cur != nil {
		switch cur.State {
		case kvbinding.StateBound:
			return m.stands(Rejected, "group is bound")
		case kvbinding.StateMoving:
			return m.stands(Rejected, "group is being moved")
		case kvbinding.StateDeadLettered, kvbinding.StateReleased:
			if in.Seq <= cur.ThroughSeq {
				return m.stands(Rejected, "the proposal comes before the end of the previous binding")
			}
			if cur.State == kvbinding.StateReleased || cur.PrevNode != "" {
				// Everything after the end is the new binding's: nodes
				// may have skipped some of it while their view still
				// named the previous node.
				prev, from = cur.PrevNode, cur.ThroughSeq+1
			}
		}
	}
	if in.Seq < m.env.Floor {
		// Every node that was live when the floor was raised resolved
		// these messages: routed by the binding of the time (which has
		// ended since, or the asker's view would show it), skipped, or
		// dead-lettered. A binding from here would route them again.
		return Result{Outcome: Refused, Err: ErrBelowFloor, Floor: m.env.Floor,
			Reason: fmt.Sprintf("bind: seq %d is below the routing floor %d: routed already", in.Seq, m.env.Floor)}
	}
	if m.group != "" && m.env.MaxGroups > 0 && m.env.Bound >= m.env.MaxGroups {
		// A new binding past the limit: the group's messages go to the
		// dead-letter stream (the asker's), and memory stays bounded
		// whatever a producer sends. Ended records expire, closed and
		// idle groups end: room comes back by itself.
		return Result{Outcome: Refused, Err: ErrGroupLimit, Limit: m.env.MaxGroups,
			Reason: fmt.Sprintf("bind: %d groups are bound, the limit (--max-groups) is %d", m.env.Bound, m.env.MaxGroups)}
	}
	node, redirected := Choose(m.env.Live, in.Node, m.group == "")
	if prev != "" && node != prev && isEligible(m.env.Live, prev, m.group == "") {
		// After an expiry or close, the node that had the group keeps it
		// when it can: its queue may still hold the group's last messages.
		node, redirected = prev, false
	}
	if node == "" {
		return Result{Outcome: Failed, Reason: "no eligible node is alive"}
	}
	b := m.record(kvbinding.StateBound)
	b.Node, b.FromSeq, b.ProposedBy = node, from, in.By
	if redirected {
		b.Reason = "proposed node " + in.Node + " is not eligible"
	}
	if prev != "" {
		b.PrevNode = prev
		if node != prev {
			m.takeover(b, []string{prev})
		} else {
			// The same node: it held the group's later messages itself,
			// but other nodes may have skipped some: it catches up.
			b.Step = kvbinding.StepCatchUp
		}
	}
	res := m.write(b, &Event{Kind: EventBind, Node: node, FromSeq: from, Reason: b.Reason})
	return res
}

// epochOf returns the epoch a record carries on when it keeps cur's
// owner (see kvbinding.Binding.Epoch): a record that changes the owner
// leaves Epoch 0, and its own revision becomes the epoch.
func epochOf(cur *kvbinding.Binding) uint64 {
	if cur.Epoch != 0 {
		return cur.Epoch
	}
	return cur.Revision
}

// reporter checks that a node's report concerns the record as it stands.
func (m *machine) reporter(role string, ok bool) (Result, bool) {
	if m.cur == nil {
		return Result{Outcome: Refused, Reason: "group has no record"}, false
	}
	if !ok {
		return Result{Outcome: Refused, Reason: fmt.Sprintf("%s: the record does not name %s as %s", m.in.Op, m.in.By, role)}, false
	}
	if m.in.Rev != m.cur.Revision {
		return Result{Outcome: Refused, Reason: fmt.Sprintf("%s: stale: the record is at revision %d, not %d", m.in.Op, m.cur.Revision, m.in.Rev)}, false
	}
	return Result{}, true
}

func (m *machine) fence() Result {
	cur, in := m.cur, m.in
	if r, ok := m.reporter("the node it moves away from", cur != nil && cur.State == kvbinding.StateMoving && cur.PrevNode == in.By); !ok {
		return r
	}
	drain := []string{in.By}
	if in.Clean {
		drain = nil
	}
	return m.handOver(in.By, max(in.Seq, cur.FromSeq), cur.Node, drain, "", 0)
}

// handOver ends node from's binding at fence (its first message not
// routed): bound to target from there, to be taken over, or released
// (target ""). drain lists the queues to drain (from's among them unless
// it said it holds nothing of the group).
func (m *machine) handOver(from string, fence uint64, target string, drain []string, reason string, ckpt uint64) Result {
	if target == "" {
		b := m.record(kvbinding.StateReleased)
		b.PrevNode, b.ThroughSeq, b.Reason = from, fence-1, "unbound"
		if reason != "" {
			b.Reason = reason
		}
		return m.write(b, &Event{Kind: EventUnbind, PrevNode: from, FromSeq: fence, Reason: b.Reason})
	}
	b := m.record(kvbinding.StateBound)
	b.Node, b.FromSeq, b.PrevNode, b.Reason, b.Ckpt = target, fence, from, reason, ckpt
	m.takeover(b, drain)
	var ev *Event
	if reason != "" {
		ev = &Event{Kind: EventMove, Node: target, PrevNode: from, FromSeq: fence, Reason: reason}
	}
	return m.write(b, ev)
}

func withDrain(list []string, node string) []string {
	return kvbinding.WithDrain(list, node)
}

func (m *machine) drained() Result {
	cur, in := m.cur, m.in
	if r, ok := m.reporter("the node draining it", cur != nil && cur.State == kvbinding.StateBound && cur.Node == in.By && cur.Step == kvbinding.StepDrain); !ok {
		return r
	}
	b := m.record(kvbinding.StateBound)
	b.Node, b.FromSeq, b.PrevNode, b.Step, b.Routed, b.Ckpt = cur.Node, cur.FromSeq, cur.PrevNode, kvbinding.StepCatchUp, cur.Routed, cur.Ckpt
	b.Epoch = epochOf(cur)
	return m.write(b, nil)
}

func (m *machine) caughtUp() Result {
	cur, in := m.cur, m.in
	if r, ok := m.reporter("the node catching it up", cur != nil && cur.State == kvbinding.StateBound && cur.Node == in.By && cur.Step == kvbinding.StepCatchUp); !ok {
		return r
	}
	b := m.record(kvbinding.StateBound)
	b.Node, b.FromSeq, b.PrevNode = cur.Node, cur.FromSeq, cur.PrevNode
	b.Epoch = epochOf(cur)
	return m.write(b, &Event{Kind: EventHandoff, Node: cur.Node, PrevNode: cur.PrevNode, FromSeq: cur.FromSeq, Count: in.Count})
}

func (m *machine) release() Result {
	cur, in := m.cur, m.in
	if r, ok := m.reporter("its settled node", cur != nil && cur.State == kvbinding.StateBound && cur.Node == in.By && cur.Step == kvbinding.StepNone); !ok {
		return r
	}
	if in.Kind != EventExpire && in.Kind != EventClose {
		return Result{Outcome: Refused, Reason: fmt.Sprintf("release: kind %q, want %s or %s", in.Kind, EventExpire, EventClose)}
	}
	b := m.record(kvbinding.StateReleased)
	b.PrevNode, b.ThroughSeq, b.Reason = in.By, max(in.Seq, cur.FromSeq-1), in.Reason
	return m.write(b, &Event{Kind: in.Kind, PrevNode: in.By, FromSeq: b.ThroughSeq, Reason: in.Reason})
}

func (m *machine) deadLetter() Result {
	cur, in := m.cur, m.in
	if cur != nil {
		switch cur.State {
		case kvbinding.StateBound, kvbinding.StateMoving:
			return m.stands(Rejected, "group is bound: its messages are routed, not dead-lettered")
		case kvbinding.StateDeadLettered, kvbinding.StateReleased:
			if in.Seq <= cur.ThroughSeq {
				return m.stands(Rejected, "the record covers these messages already")
			}
			if cur.State == kvbinding.StateDeadLettered && cur.PrevNode == "" {
				// Dead-lettered while no node owned it: every node holds
				// all of its messages after the record's end, the asker
				// included (a group refused at the group limit again).
				if in.First <= cur.ThroughSeq {
					return Result{Outcome: Refused, Reason: fmt.Sprintf("deadletter: the record ends at %d, after the first message %d", cur.ThroughSeq, in.First)}
				}
			} else if in.First != cur.ThroughSeq+1 {
				// Messages between the record's end and the first one the
				// asker holds may be held by others: a record through Seq
				// would make every node drop them.
				return Result{Outcome: Refused, Reason: fmt.Sprintf("deadletter: the record ends at %d; the messages before %d are not the asker's to dead-letter", cur.ThroughSeq, in.First)}
			}
		}
	}
	b := m.record(kvbinding.StateDeadLettered)
	b.ThroughSeq, b.ProposedBy, b.Reason = in.Seq, in.By, in.Reason
	if cur != nil && cur.State != kvbinding.StateBound && cur.State != kvbinding.StateMoving {
		// The node that routed the group's messages before stays named:
		// its queue may hold the last of them, which the group's next
		// node must take over first.
		b.PrevNode = cur.PrevNode
	}
	// The node that dead-lettered the messages announced it (EventDeadLetter).
	return m.write(b, nil)
}

func (m *machine) move() Result {
	cur, in := m.cur, m.in
	if cur == nil || (cur.State != kvbinding.StateBound && cur.State != kvbinding.StateMoving) {
		return Result{Outcome: Refused, Err: ErrUnknownGroup, Reason: "group is not bound"}
	}
	if cur.State == kvbinding.StateMoving || cur.Step != kvbinding.StepNone {
		return Result{Outcome: Refused, Err: ErrMoveInProgress, Reason: "group is being moved already"}
	}
	target := in.Node
	if in.Op == OpUnbind {
		target = ""
	} else {
		if target == cur.Node {
			return m.stands(Rejected, "already bound there")
		}
		if _, live := m.env.Live[target]; !live {
			return Result{Outcome: Refused, Err: ErrIneligibleNode, Reason: "node " + target + " is not alive"}
		}
		if !isEligible(m.env.Live, target, m.group == "") {
			return Result{Outcome: Refused, Err: ErrIneligibleNode, Reason: "node " + target + " has no queue consumer while others have one"}
		}
	}
	b := m.record(kvbinding.StateMoving)
	b.Node, b.PrevNode, b.FromSeq, b.Reason = target, cur.Node, cur.FromSeq, in.Reason
	b.Epoch = epochOf(cur) // the old owner's, until the fence
	return m.write(b, &Event{Kind: EventMove, Node: target, PrevNode: cur.Node, Reason: in.Reason})
}

func (m *machine) evacuate() Result {
	cur, in := m.cur, m.in
	if cur == nil {
		return Result{Outcome: Refused, Reason: "group has no record"}
	}
	switch {
	case cur.State == kvbinding.StateMoving && cur.PrevNode == in.From:
		// The node never fenced: fence from its checkpoint.
		target := cur.Node
		if target != "" && !isEligible(m.env.Live, target, m.group == "") {
			target = in.Node
		}
		if cur.Node != "" && target == "" {
			return Result{Outcome: Failed, Reason: "no eligible node is alive"}
		}
		if cur.Node == "" && in.Node != "" {
			// An unbind the node never completed: the other nodes skipped
			// the group's messages after the fence (the record named the
			// node), and the node that would have proposed them is gone.
			// Releasing here would leave them to the group's next message;
			// a new node takes them over instead (the binding ends by
			// idle expiry or the next unbind).
			target = in.Node
		}
		return m.handOver(in.From, max(in.Seq, cur.FromSeq), target, []string{in.From}, in.Reason, in.Ckpt)
	case cur.State == kvbinding.StateBound && cur.Node == in.From && cur.Step == kvbinding.StepNone:
		if in.Node == "" {
			return Result{Outcome: Failed, Reason: "no eligible node is alive"}
		}
		return m.handOver(in.From, max(in.Seq, cur.FromSeq), in.Node, []string{in.From}, in.Reason, in.Ckpt)
	case cur.State == kvbinding.StateBound && cur.Node == in.From:
		// The node was taking the group over: its successor starts the
		// take-over again from the same fence. The node's own queue may
		// hold messages it moved or caught up: drain it too.
		if in.Node == "" {
			return Result{Outcome: Failed, Reason: "no eligible node is alive"}
		}
		drain := withDrain(cur.Drain, in.From)
		if len(drain) > kvbinding.MaxDrain {
			return Result{Outcome: Failed, Reason: fmt.Sprintf("the group passed through more than %d nodes without settling", kvbinding.MaxDrain)}
		}
		b := m.record(kvbinding.StateBound)
		b.Node, b.FromSeq, b.PrevNode, b.Reason = in.Node, cur.FromSeq, cur.PrevNode, in.Reason
		// What the gone node's checkpoint says it caught up is not routed
		// again (its queue, drained too, holds what was not consumed).
		// The checkpoint the take-over skips by stays PrevNode's (in.Ckpt
		// is in.From's).
		b.Routed, b.Ckpt = cur.Routed, cur.Ckpt
		if in.Routed >= cur.FromSeq && in.Routed > b.Routed {
			b.Routed = in.Routed
		}
		m.takeover(b, drain)
		return m.write(b, &Event{Kind: EventMove, Node: in.Node, PrevNode: in.From, FromSeq: cur.FromSeq, Reason: in.Reason})
	}
	return Result{Outcome: Refused, Reason: "the record no longer involves node " + in.From}
}
