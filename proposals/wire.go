package proposals

import (
	"encoding/json"
	"fmt"
	"strconv"

	"grouprouter/kvbinding"
)

// SubjectPropose is the request/reply subject the active LOCAL handler answers.
const SubjectPropose = "grouping.propose"

// handlerQueue is the queue group handlers subscribe in: should two ever
// overlap, each proposal is still answered once.
const handlerQueue = "grouping-handlers"

// ProtocolVersion is the version of the wire format.
const ProtocolVersion = 1

// MaxProposalsPerRequest bounds one request.
const MaxProposalsPerRequest = 1024

// Proposal asks the handler to bind Group to Node from ingress sequence FromSeq.
type Proposal struct {
	// Group is the group id; "" is the routing binding of ungrouped messages.
	Group string `json:"group"`
	// Node is the proposed node.
	Node string `json:"node"`
	// FromSeq is the ingress sequence of the group's first unrouted message.
	FromSeq uint64 `json:"from_seq"`
}

// Validate checks one proposal.
func (p Proposal) Validate() error {
	if p.Group != "" {
		if err := kvbinding.ValidateGroupID(p.Group); err != nil {
			return err
		}
	}
	if err := kvbinding.ValidateNodeID(p.Node); err != nil {
		return err
	}
	if p.FromSeq == 0 {
		return fmt.Errorf("from_seq must be >= 1")
	}
	return nil
}

// Request is a batch of proposals from one node.
type Request struct {
	Version   int        `json:"v"`
	Proposer  string     `json:"proposer"`
	Proposals []Proposal `json:"proposals"`
}

// Outcome of one proposal.
type Outcome string

const (
	// Accepted: the proposed node is bound.
	Accepted Outcome = "accepted"
	// Rejected: another route stands; Binding names it.
	Rejected Outcome = "rejected"
	// Failed: nothing was decided; Error says why. Propose again later.
	Failed Outcome = "failed"
)

// Decision answers one proposal.
type Decision struct {
	Group    string             `json:"group"`
	Outcome  Outcome            `json:"outcome"`
	Binding  *kvbinding.Binding `json:"binding,omitempty"`
	Revision uint64             `json:"revision,omitempty"`
	Error    string             `json:"error,omitempty"`
}

// Reply answers a Request, decision i for proposal i.
type Reply struct {
	Version   int        `json:"v"`
	Handler   string     `json:"handler"`
	Decisions []Decision `json:"decisions,omitempty"`
	Error     string     `json:"error,omitempty"`
}

// EncodeRequest validates and encodes a request.
func EncodeRequest(r Request) ([]byte, error) {
	r.Version = ProtocolVersion
	if err := r.validate(); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// DecodeRequest decodes and validates a request. A request whose envelope
// is malformed is an error wrapping ErrBadMessage; individual invalid
// proposals are reported by ProposalErrors so that the rest can proceed.
func DecodeRequest(data []byte) (Request, error) {
	var r Request
	if err := json.Unmarshal(data, &r); err != nil {
		return Request{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	if r.Version != ProtocolVersion {
		return Request{}, fmt.Errorf("%w: protocol version %d, want %d", ErrBadMessage, r.Version, ProtocolVersion)
	}
	if err := kvbinding.ValidateNodeID(r.Proposer); err != nil {
		return Request{}, fmt.Errorf("%w: proposer: %v", ErrBadMessage, err)
	}
	if len(r.Proposals) == 0 || len(r.Proposals) > MaxProposalsPerRequest {
		return Request{}, fmt.Errorf("%w: %d proposals, want 1 to %d", ErrBadMessage, len(r.Proposals), MaxProposalsPerRequest)
	}
	return r, nil
}

func (r Request) validate() error {
	if err := kvbinding.ValidateNodeID(r.Proposer); err != nil {
		return fmt.Errorf("%w: proposer: %v", ErrBadMessage, err)
	}
	if len(r.Proposals) == 0 || len(r.Proposals) > MaxProposalsPerRequest {
		return fmt.Errorf("%w: %d proposals, want 1 to %d", ErrBadMessage, len(r.Proposals), MaxProposalsPerRequest)
	}
	for i, p := range r.Proposals {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("%w: proposal %d: %v", ErrBadMessage, i, err)
		}
	}
	return nil
}

// EncodeReply encodes a reply. It writes the JSON by hand: a reply
// carries a binding per proposal, up to MaxProposalsPerRequest of them.
func EncodeReply(r Reply) ([]byte, error) {
	buf := make([]byte, 0, 64+len(r.Decisions)*300)
	buf = append(buf, `{"v":`...)
	buf = strconv.AppendInt(buf, ProtocolVersion, 10)
	buf = append(buf, `,"handler":`...)
	buf = kvbinding.AppendJSONString(buf, r.Handler)
	if len(r.Decisions) > 0 {
		buf = append(buf, `,"decisions":[`...)
		for i, d := range r.Decisions {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, `{"group":`...)
			buf = kvbinding.AppendJSONString(buf, d.Group)
			buf = append(buf, `,"outcome":`...)
			buf = kvbinding.AppendJSONString(buf, string(d.Outcome))
			if d.Binding != nil {
				buf = append(buf, `,"binding":`...)
				buf = d.Binding.AppendJSON(buf)
			}
			if d.Revision != 0 {
				buf = append(buf, `,"revision":`...)
				buf = strconv.AppendUint(buf, d.Revision, 10)
			}
			if d.Error != "" {
				buf = append(buf, `,"error":`...)
				buf = kvbinding.AppendJSONString(buf, d.Error)
			}
			buf = append(buf, '}')
		}
		buf = append(buf, ']')
	}
	if r.Error != "" {
		buf = append(buf, `,"error":`...)
		buf = kvbinding.AppendJSONString(buf, r.Error)
	}
	return append(buf, '}'), nil
}

// wireReply is Reply with its bindings left raw, decoded without
// reflection by kvbinding.DecodeJSON.
type wireReply struct {
	Version   int    `json:"v"`
	Handler   string `json:"handler"`
	Decisions []struct {
		Group    string          `json:"group"`
		Outcome  Outcome         `json:"outcome"`
		Binding  json.RawMessage `json:"binding,omitempty"`
		Revision uint64          `json:"revision,omitempty"`
		Error    string          `json:"error,omitempty"`
	} `json:"decisions,omitempty"`
	Error string `json:"error,omitempty"`
}

// DecodeReply decodes a reply to a request of n proposals and checks that
// it answers each of them, in order, with well-formed bindings.
func DecodeReply(data []byte, req Request) (Reply, error) {
	var w wireReply
	if err := json.Unmarshal(data, &w); err != nil {
		return Reply{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	r := Reply{Version: w.Version, Handler: w.Handler, Error: w.Error}
	if len(w.Decisions) > 0 {
		r.Decisions = make([]Decision, len(w.Decisions))
	}
	for i, d := range w.Decisions {
		r.Decisions[i] = Decision{Group: d.Group, Outcome: d.Outcome, Revision: d.Revision, Error: d.Error}
		if len(d.Binding) > 0 && string(d.Binding) != "null" {
			b, err := kvbinding.DecodeJSON(d.Binding)
			if err != nil {
				return Reply{}, fmt.Errorf("%w: decision %d: %v", ErrBadMessage, i, err)
			}
			r.Decisions[i].Binding = &b
		}
	}
	if r.Version != ProtocolVersion {
		return Reply{}, fmt.Errorf("%w: protocol version %d, want %d", ErrBadMessage, r.Version, ProtocolVersion)
	}
	if r.Error != "" {
		return r, fmt.Errorf("%w: %s", ErrHandlerFailed, r.Error)
	}
	if len(r.Decisions) != len(req.Proposals) {
		return Reply{}, fmt.Errorf("%w: %d decisions for %d proposals", ErrBadMessage, len(r.Decisions), len(req.Proposals))
	}
	for i, d := range r.Decisions {
		if d.Group != req.Proposals[i].Group {
			return Reply{}, fmt.Errorf("%w: decision %d is for group %q, not %q", ErrBadMessage, i, d.Group, req.Proposals[i].Group)
		}
		switch d.Outcome {
		case Accepted, Rejected:
			if d.Binding == nil || d.Binding.Group != d.Group || d.Revision == 0 {
				return Reply{}, fmt.Errorf("%w: decision %d has no binding for its group", ErrBadMessage, i)
			}
			if err := d.Binding.Validate(); err != nil {
				return Reply{}, fmt.Errorf("%w: decision %d: %v", ErrBadMessage, i, err)
			}
			r.Decisions[i].Binding.Revision = d.Revision
		case Failed:
		default:
			return Reply{}, fmt.Errorf("%w: decision %d has outcome %q", ErrBadMessage, i, d.Outcome)
		}
	}
	return r, nil
}
