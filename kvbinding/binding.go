package kvbinding

import (
	"fmt"
	"time"
)

// State says what a binding record means.
type State string

const (
	// StateBound routes the group's messages with ingress sequence >= FromSeq
	// to Node.
	StateBound State = "bound"
	// StateDeadLettered records that the group's messages up to ThroughSeq
	// went to the dead-letter stream because no decision could be had; later
	// messages need a new binding.
	StateDeadLettered State = "dead-lettered"
	// StateMoving asks PrevNode, the node the group is bound to, to stop
	// routing it and hand it over to Node ("" for an unbind). PrevNode
	// answers with the fence (the group's first message it has not
	// routed); the handler then writes StateBound for Node from there, in
	// step StepDrain (or StateReleased for an unbind).
	StateMoving State = "moving"
	// StateReleased records that the group's binding ended (idle expiry, a
	// close marker, an unbind): PrevNode routed its messages up to
	// ThroughSeq; later messages need a new binding.
	StateReleased State = "released"
)

// Step is how far a bound group's new node has taken it over from the
// nodes that had it before. A move and a rebinding after a release go
// through the steps in order; each step is a new revision of the record,
// so whichever process is alive can take the next one.
type Step string

const (
	// StepNone: Node routes the group; nothing is left to take over.
	StepNone Step = ""
	// StepDrain: Node moves the group's messages still waiting on the
	// queues of the nodes in Drain to its own queue, in ingress order.
	// Those queues' consumers are paused meanwhile.
	StepDrain Step = "drain"
	// StepCatchUp: Node routes, from the ingress, the group's messages
	// from FromSeq on that it skipped while another node owned the group.
	StepCatchUp Step = "catchup"
)

// Binding is one group's route, as stored in the bindings bucket.
type Binding struct {
	// Group is the original group id (or "" for the ungrouped routing binding).
	Group string `json:"group"`
	// State says what the record means.
	State State `json:"state"`
	// Node is the node whose queue receives the group (empty when dead-lettered).
	Node string `json:"node,omitempty"`
	// FromSeq is the first ingress sequence the binding applies to.
	FromSeq uint64 `json:"from_seq"`
	// ThroughSeq is the last ingress sequence dead-lettered (StateDeadLettered only).
	ThroughSeq uint64 `json:"through_seq,omitempty"`
	// PrevNode is the node that held the group before this revision, if any;
	// it routes the messages before FromSeq.
	PrevNode string `json:"prev_node,omitempty"`
	// DecidedAt is when the handler decided.
	DecidedAt time.Time `json:"decided_at"`
	// DecidedBy names the handler (name/node) or node that wrote the record.
	DecidedBy string `json:"decided_by"`
	// ProposedBy is the node whose proposal led to the record.
	ProposedBy string `json:"proposed_by,omitempty"`
	// Reason explains a dead-letter record or a rejection that rebound.
	Reason string `json:"reason,omitempty"`
	// Step is how far Node has taken the group over (StateBound only).
	Step Step `json:"step,omitempty"`
	// Routed is the last ingress sequence from FromSeq on that an earlier
	// taker of the group is known to have routed (from its checkpoint):
	// a catch-up starts after it (StateBound in a step only; 0: none).
	Routed uint64 `json:"routed,omitempty"`
	// Ckpt is the KV revision of PrevNode's checkpoint an evacuation took
	// FromSeq from (StateBound in a step only; 0: none): the taker does
	// not route again what that checkpoint says PrevNode had finished
	// (Checkpoint.Done), whatever holds the checkpoint's start back.
	Ckpt uint64 `json:"ckpt,omitempty"`
	// Drain lists the nodes whose queues may still hold the group's
	// waiting messages (StepDrain only); the new owner moves them to its
	// own queue, in ingress order, before routing anything else of it.
	Drain []string `json:"drain,omitempty"`
	// Epoch is the group's epoch under this record: the KV revision of the
	// record that made Node its owner (a bind, a fence, an evacuation).
	// The record that changes the owner does not know its own revision
	// and leaves it 0, meaning "this record's revision"; every later
	// revision with the same owner carries it on. Every message a node
	// puts on a queue carries its group's epoch (HeaderEpoch), so a
	// consumer can tell a copy made before a move from a current one:
	// epochs only grow, and are the same for every node. Use OwnerEpoch.
	Epoch uint64 `json:"epoch,omitempty"`

	// Revision is the KV revision of the record; not part of the value.
	Revision uint64 `json:"-"`
	// Invalid is set on what the binding cache returns for a key whose
	// latest value is not a usable record (malformed, or another group's):
	// the group counts as unbound, and Revision is the bad value's, so
	// that the handler can write over it with compare-and-set. Not part
	// of the value.
	Invalid bool `json:"-"`
}

// The binding cache (Cache) keeps the fields that route: Group, State,
// Node, FromSeq, ThroughSeq, PrevNode, Step, Drain, Routed, Ckpt, Epoch (filled
// in: never 0 on a cached record), Revision and Invalid. DecidedAt,
// DecidedBy, ProposedBy and Reason are read from the bucket (Store.Get).

// Validate checks that b is a self-consistent record.
func (b Binding) Validate() error {
	if b.Group != "" {
		if err := ValidateGroupID(b.Group); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidBinding, err)
		}
	}
	if b.PrevNode != "" {
		if err := ValidateNodeID(b.PrevNode); err != nil {
			return fmt.Errorf("%w: prev_node: %v", ErrInvalidBinding, err)
		}
	}
	if (b.State != StateBound || b.Step == StepNone) && b.Routed != 0 {
		return fmt.Errorf("%w: routed outside a hand-over step", ErrInvalidBinding)
	}
	if (b.State != StateBound || b.Step == StepNone) && b.Ckpt != 0 {
		return fmt.Errorf("%w: ckpt outside a hand-over step", ErrInvalidBinding)
	}
	if b.State != StateBound && (b.Step != StepNone || len(b.Drain) > 0) {
		return fmt.Errorf("%w: %s record with a hand-over step", ErrInvalidBinding, b.State)
	}
	switch b.State {
	case StateBound:
		if err := ValidateNodeID(b.Node); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidBinding, err)
		}
		if b.FromSeq == 0 {
			return fmt.Errorf("%w: from_seq must be >= 1", ErrInvalidBinding)
		}
		switch b.Step {
		case StepNone, StepCatchUp:
			if len(b.Drain) > 0 {
				return fmt.Errorf("%w: drain list outside step %s", ErrInvalidBinding, StepDrain)
			}
		case StepDrain:
			if len(b.Drain) == 0 || len(b.Drain) > MaxDrain {
				return fmt.Errorf("%w: step %s needs 1 to %d drain nodes, has %d", ErrInvalidBinding, StepDrain, MaxDrain, len(b.Drain))
			}
			for _, n := range b.Drain {
				if err := ValidateNodeID(n); err != nil {
					return fmt.Errorf("%w: drain: %v", ErrInvalidBinding, err)
				}
			}
		default:
			return fmt.Errorf("%w: unknown step %q", ErrInvalidBinding, b.Step)
		}
	case StateDeadLettered:
		if b.Node != "" || b.ThroughSeq == 0 {
			return fmt.Errorf("%w: dead-lettered record needs through_seq and no node", ErrInvalidBinding)
		}
	case StateReleased:
		// through_seq 0: the binding ended before any message.
		if b.Node != "" {
			return fmt.Errorf("%w: released record has a node", ErrInvalidBinding)
		}
		if err := ValidateNodeID(b.PrevNode); err != nil {
			return fmt.Errorf("%w: released record: prev_node: %v", ErrInvalidBinding, err)
		}
	case StateMoving:
		if b.Node != "" {
			if err := ValidateNodeID(b.Node); err != nil {
				return fmt.Errorf("%w: %v", ErrInvalidBinding, err)
			}
		}
		if err := ValidateNodeID(b.PrevNode); err != nil {
			return fmt.Errorf("%w: moving record: prev_node: %v", ErrInvalidBinding, err)
		}
	default:
		return fmt.Errorf("%w: unknown state %q", ErrInvalidBinding, b.State)
	}
	return nil
}

// Phase is where a group's record stands, as one value: what a person
// asks ("is it moving? taking over?") and what the commands show.
type Phase uint8

const (
	// PhaseNone: the group has no (usable) record.
	PhaseNone Phase = iota
	// PhaseBound: bound to Node, nothing left to take over.
	PhaseBound
	// PhaseMoving: PrevNode is asked to hand the group over to Node (to
	// nobody for an unbind) and has not fenced it yet.
	PhaseMoving
	// PhaseDraining: Node moves the group's waiting messages off the
	// queues in Drain (it waits for their consumers first).
	PhaseDraining
	// PhaseCatchingUp: Node routes from the ingress what it skipped.
	PhaseCatchingUp
	// PhaseReleased: the binding ended after ThroughSeq.
	PhaseReleased
	// PhaseDeadLettered: the messages through ThroughSeq were
	// dead-lettered.
	PhaseDeadLettered
)

// phaseRecords is each phase's State and Step: the one table the phases
// and the binding cache's codes (which are phases) are read from.
var phaseRecords = [...]struct {
	state State
	step  Step
}{
	PhaseBound:        {StateBound, StepNone},
	PhaseMoving:       {StateMoving, StepNone},
	PhaseDraining:     {StateBound, StepDrain},
	PhaseCatchingUp:   {StateBound, StepCatchUp},
	PhaseReleased:     {StateReleased, StepNone},
	PhaseDeadLettered: {StateDeadLettered, StepNone},
}

// Record returns the State and Step of a record in phase p ("" and
// StepNone for PhaseNone).
func (p Phase) Record() (State, Step) {
	if int(p) >= len(phaseRecords) {
		return "", StepNone
	}
	r := phaseRecords[p]
	return r.state, r.step
}

// TakingOver reports whether the record's Node is taking the group over
// (draining, catching up).
func (p Phase) TakingOver() bool { return p == PhaseDraining || p == PhaseCatchingUp }

// Bound reports whether the group is bound to its record's Node: bound,
// or bound and taking the group over (draining, catching up).
func (p Phase) Bound() bool {
	return p == PhaseBound || p == PhaseDraining || p == PhaseCatchingUp
}

// Current reports whether the record routes the group now: bound to a
// node, or moving (PrevNode hands it over).
func (p Phase) Current() bool { return p.Bound() || p == PhaseMoving }

// Ended reports whether the binding ended: released or dead-lettered.
func (p Phase) Ended() bool { return p == PhaseReleased || p == PhaseDeadLettered }

// Stored reports whether b is a stored record (one read from the bucket,
// valid or not), not the zero Binding that stands for "no record". Unlike
// Phase, it is true for an invalid record, whose fields a command may
// still show.
func (b Binding) Stored() bool { return b.State != "" }

// Phase returns where b stands: phaseRecords read backwards. A step the
// table does not pair with b's state (a record that fails Validate) is
// ignored: the state alone decides.
func (b Binding) Phase() Phase {
	if b.Invalid || b.State == "" {
		return PhaseNone
	}
	byState := PhaseNone
	for p, r := range phaseRecords {
		if r.state != b.State {
			continue
		}
		if r.step == b.Step {
			return Phase(p)
		}
		if r.step == StepNone {
			byState = Phase(p)
		}
	}
	return byState
}

// Describe says in words where the group's record stands.
func (b Binding) Describe() string {
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	switch b.Phase() {
	case PhaseMoving:
		if b.Node == "" {
			return fmt.Sprintf("the group is still being unbound (%s releases it)", b.PrevNode)
		}
		return fmt.Sprintf("the group is still moving (%s hands it over to %s)", b.PrevNode, b.Node)
	case PhaseDraining, PhaseCatchingUp:
		return fmt.Sprintf("the group is bound to %s, which is still taking it over from %s (step %s)", b.Node, dash(b.PrevNode), b.Step)
	case PhaseBound:
		return fmt.Sprintf("the group is bound to %s", b.Node)
	case PhaseReleased:
		return fmt.Sprintf("the group is released (%s routed it up to ingress sequence %d)", dash(b.PrevNode), b.ThroughSeq)
	case PhaseDeadLettered:
		return fmt.Sprintf("the group's messages up to ingress sequence %d were dead-lettered", b.ThroughSeq)
	}
	if b.State == "" || b.Invalid {
		return "the group has no binding"
	}
	return fmt.Sprintf("the group's record is in state %q", b.State)
}

// Cached returns b as the binding cache returns it: the fields that
// route, with Epoch filled in (see OwnerEpoch), and Reason and Ckpt of a
// record in a hand-over step.
func (b Binding) Cached() Binding {
	c := Binding{Group: b.Group, State: b.State, Node: b.Node, FromSeq: b.FromSeq, ThroughSeq: b.ThroughSeq,
		PrevNode: b.PrevNode, Step: b.Step, Drain: b.Drain, Routed: b.Routed, Epoch: b.OwnerEpoch(),
		Revision: b.Revision, Invalid: b.Invalid}
	if b.Phase().TakingOver() {
		c.Reason, c.Ckpt = b.Reason, b.Ckpt
	}
	return c
}

// OwnerEpoch returns the group's epoch under b (see Binding.Epoch): Epoch,
// or b's own revision when b is the record that made Node the owner.
func (b Binding) OwnerEpoch() uint64 {
	if b.Epoch != 0 {
		return b.Epoch
	}
	return b.Revision
}

// MaxDrain bounds a record's Drain list: a group moved again and again
// before any move finished names each node it passed through once.
const MaxDrain = 16

// Settled reports whether b binds its group to a node that has nothing
// left to take over: the steady state a move ends in.
func (b Binding) Settled() bool { return b.State == StateBound && b.Step == StepNone && !b.Invalid }

// Marshal encodes b as the bucket value (JSON, without HTML escaping so
// that group ids read as they are).
func (b Binding) Marshal() ([]byte, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	return b.AppendJSON(make([]byte, 0, 256+len(b.Group))), nil
}

// UnmarshalBinding decodes a bucket value and validates it.
func UnmarshalBinding(data []byte) (Binding, error) {
	b, err := DecodeJSON(data)
	if err != nil {
		return Binding{}, fmt.Errorf("%w: %v", ErrInvalidBinding, err)
	}
	if err := b.Validate(); err != nil {
		return Binding{}, err
	}
	return b, nil
}

// KeyOf returns the KV key for the binding's group (UngroupedKey for "").
func KeyOf(group string) (string, error) {
	if group == "" {
		return UngroupedKey, nil
	}
	return Key(group)
}

// MaxNodeIDLen is the longest node id accepted.
const MaxNodeIDLen = 64

// ValidateNodeID reports whether id can name a node: 1 to 64 characters of
// [A-Za-z0-9_-], so that it is a single subject token, a consumer name part
// and a KV key token.
func ValidateNodeID(id string) error {
	if id == "" {
		return fmt.Errorf("node id is empty")
	}
	if len(id) > MaxNodeIDLen {
		return fmt.Errorf("node id %q longer than %d characters", id, MaxNodeIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("node id %q has %q: only letters, digits, '-' and '_' are allowed", id, c)
		}
	}
	return nil
}

// WithDrain returns list with node appended unless it is there already:
// the Drain list of a record handing a group over from node.
func WithDrain(list []string, node string) []string {
	for _, x := range list {
		if x == node {
			return list
		}
	}
	return append(append([]string(nil), list...), node)
}
