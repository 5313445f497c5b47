package proposals

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"grouprouter/internal/jsonx"
	"grouprouter/kvbinding"
)

// SubjectPropose is the request/reply subject the active LOCAL handler answers.
const SubjectPropose = "grouping.propose"

// handlerQueue is the queue group handlers subscribe in: should two ever
// overlap, each proposal is still answered once.
const handlerQueue = "grouping-handlers"

// ProtocolVersion is the version of the wire format. Version 2 leaves out
// of a reply the binding of a proposal accepted exactly as proposed (see
// Reply.DecidedAt).
const ProtocolVersion = 2

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
//
// On the wire, an accepted decision whose binding is exactly what was
// proposed (state bound, the proposed node and from_seq, decided by
// Handler at DecidedAt for the request's proposer, nothing else set)
// carries only its revision: the binding is rebuilt from the proposal.
// Nearly every decision of a busy handler is such a binding, and encoding
// and decoding it was a visible share of a decision's CPU.
type Reply struct {
	Version   int        `json:"v"`
	Handler   string     `json:"handler"`
	DecidedAt time.Time  `json:"decided_at,omitzero"`
	Decisions []Decision `json:"decisions,omitempty"`
	Error     string     `json:"error,omitempty"`
}

// asProposed reports whether b is the binding that proposal p rebuilds to
// in a reply by handler at time at for proposer.
func asProposed(b *kvbinding.Binding, p Proposal, proposer, handler string, at time.Time) bool {
	return b.Group == p.Group && b.State == kvbinding.StateBound && b.Node == p.Node && b.FromSeq == p.FromSeq &&
		b.DecidedBy == handler && b.ProposedBy == proposer && b.DecidedAt.Equal(at) && !at.IsZero() &&
		b.ThroughSeq == 0 && b.PrevNode == "" && b.Reason == "" && !b.Handoff && len(b.Drain) == 0
}

// rebuild returns the binding asProposed describes.
func rebuild(p Proposal, proposer, handler string, at time.Time) kvbinding.Binding {
	return kvbinding.Binding{Group: p.Group, State: kvbinding.StateBound, Node: p.Node, FromSeq: p.FromSeq,
		DecidedAt: at, DecidedBy: handler, ProposedBy: proposer}
}

// EncodeRequest validates and encodes a request.
func EncodeRequest(r Request) ([]byte, error) {
	r.Version = ProtocolVersion
	if err := r.validate(); err != nil {
		return nil, err
	}
	// Written by hand: a request carries up to MaxProposalsPerRequest
	// proposals, and encoding/json was a visible share of a decision's CPU.
	buf := make([]byte, 0, 48+len(r.Proposals)*(48+avgGroupLen))
	buf = append(buf, `{"v":`...)
	buf = strconv.AppendInt(buf, ProtocolVersion, 10)
	buf = append(buf, `,"proposer":`...)
	buf = jsonx.AppendString(buf, r.Proposer)
	buf = append(buf, `,"proposals":[`...)
	for i, p := range r.Proposals {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"group":`...)
		buf = jsonx.AppendString(buf, p.Group)
		buf = append(buf, `,"node":`...)
		buf = jsonx.AppendString(buf, p.Node)
		buf = append(buf, `,"from_seq":`...)
		buf = strconv.AppendUint(buf, p.FromSeq, 10)
		buf = append(buf, '}')
	}
	return append(buf, ']', '}'), nil
}

// avgGroupLen sizes encoding buffers.
const avgGroupLen = 24

// DecodeRequest decodes and validates a request. A request whose envelope
// is malformed is an error wrapping ErrBadMessage; individual invalid
// proposals are reported by ProposalErrors so that the rest can proceed.
func DecodeRequest(data []byte) (Request, error) {
	r, ok := scanRequest(data)
	if !ok {
		r = Request{}
		if err := json.Unmarshal(data, &r); err != nil {
			return Request{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
		}
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

// scanRequest decodes a plain request (as EncodeRequest writes it) without
// reflection; false means "decode it with encoding/json", which then gives
// the same result or the error.
func scanRequest(data []byte) (Request, bool) {
	var r Request
	d := jsonx.Scanner{Data: data}
	ok := d.Object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "v":
			r.Version, ok = d.Int()
		case "proposer":
			r.Proposer, ok = d.Str()
		case "proposals":
			r.Proposals = make([]Proposal, 0, bytes.Count(data, []byte(`"from_seq"`)))
			ok = d.Array(func() bool {
				var p Proposal
				ok := d.Object(func(key []byte) bool {
					var ok bool
					switch string(key) {
					case "group":
						p.Group, ok = d.Str()
					case "node":
						p.Node, ok = d.Str()
					case "from_seq":
						p.FromSeq, ok = d.Uint()
					}
					return ok
				})
				r.Proposals = append(r.Proposals, p)
				return ok
			})
		}
		return ok
	})
	return r, ok && d.End()
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

// EncodeReply encodes a reply to req. It writes the JSON by hand: a reply
// carries a decision per proposal, up to MaxProposalsPerRequest of them.
func EncodeReply(r Reply, req Request) ([]byte, error) {
	if len(r.Decisions) > 0 && len(r.Decisions) != len(req.Proposals) {
		return nil, fmt.Errorf("proposals: %d decisions for %d proposals", len(r.Decisions), len(req.Proposals))
	}
	if r.DecidedAt.IsZero() {
		for _, d := range r.Decisions {
			if d.Outcome == Accepted && d.Binding != nil {
				r.DecidedAt = d.Binding.DecidedAt
				break
			}
		}
	}
	buf := make([]byte, 0, 96+len(r.Decisions)*(48+avgGroupLen))
	buf = append(buf, `{"v":`...)
	buf = strconv.AppendInt(buf, ProtocolVersion, 10)
	buf = append(buf, `,"handler":`...)
	buf = jsonx.AppendString(buf, r.Handler)
	if !r.DecidedAt.IsZero() {
		buf = append(buf, `,"decided_at":"`...)
		buf = r.DecidedAt.AppendFormat(buf, time.RFC3339Nano)
		buf = append(buf, '"')
	}
	if len(r.Decisions) > 0 {
		buf = append(buf, `,"decisions":[`...)
		for i, d := range r.Decisions {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, `{"group":`...)
			buf = jsonx.AppendString(buf, d.Group)
			buf = append(buf, `,"outcome":`...)
			buf = jsonx.AppendString(buf, string(d.Outcome))
			if d.Binding != nil && !(d.Outcome == Accepted && asProposed(d.Binding, req.Proposals[i], req.Proposer, r.Handler, r.DecidedAt)) {
				buf = append(buf, `,"binding":`...)
				buf = d.Binding.AppendJSON(buf)
			}
			if d.Revision != 0 {
				buf = append(buf, `,"revision":`...)
				buf = strconv.AppendUint(buf, d.Revision, 10)
			}
			if d.Error != "" {
				buf = append(buf, `,"error":`...)
				buf = jsonx.AppendString(buf, d.Error)
			}
			buf = append(buf, '}')
		}
		buf = append(buf, ']')
	}
	if r.Error != "" {
		buf = append(buf, `,"error":`...)
		buf = jsonx.AppendString(buf, r.Error)
	}
	return append(buf, '}'), nil
}

// wireReply is Reply with its bindings left raw, decoded without
// reflection by kvbinding.DecodeJSON.
type wireReply struct {
	Version   int       `json:"v"`
	Handler   string    `json:"handler"`
	DecidedAt time.Time `json:"decided_at"`
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
	r, ok := scanReply(data, len(req.Proposals))
	if !ok {
		var err error
		if r, err = decodeReplySlow(data); err != nil {
			return Reply{}, err
		}
	}
	return checkReply(r, req)
}

// scanReply decodes a plain reply (as EncodeReply writes it) without
// reflection; false means "decode it with encoding/json".
func scanReply(data []byte, n int) (Reply, bool) {
	var r Reply
	d := jsonx.Scanner{Data: data}
	ok := d.Object(func(key []byte) bool {
		var ok bool
		switch string(key) {
		case "v":
			r.Version, ok = d.Int()
		case "handler":
			r.Handler, ok = d.Str()
		case "decided_at":
			r.DecidedAt, ok = d.Time()
		case "error":
			r.Error, ok = d.Str()
		case "decisions":
			r.Decisions = make([]Decision, 0, n)
			var bs []kvbinding.Binding
			ok = d.Array(func() bool {
				var dec Decision
				ok := d.Object(func(key []byte) bool {
					var ok bool
					switch string(key) {
					case "group":
						dec.Group, ok = d.Str()
					case "outcome":
						var o string
						o, ok = d.Str()
						dec.Outcome = Outcome(o)
					case "revision":
						dec.Revision, ok = d.Uint()
					case "error":
						dec.Error, ok = d.Str()
					case "binding":
						var b kvbinding.Binding
						if b, ok = kvbinding.ScanJSON(&d); ok {
							if bs == nil {
								bs = make([]kvbinding.Binding, 0, n)
							}
							bs = append(bs, b)
							dec.Binding = &bs[len(bs)-1]
							ok = cap(bs) == n // no reallocation moved earlier bindings
						}
					}
					return ok
				})
				r.Decisions = append(r.Decisions, dec)
				return ok
			})
		}
		return ok
	})
	return r, ok && d.End()
}

// decodeReplySlow decodes a reply with encoding/json.
func decodeReplySlow(data []byte) (Reply, error) {
	var w wireReply
	if err := json.Unmarshal(data, &w); err != nil {
		return Reply{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	r := Reply{Version: w.Version, Handler: w.Handler, DecidedAt: w.DecidedAt, Error: w.Error}
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
	return r, nil
}

// checkReply checks that r answers each proposal of req, in order, with
// well-formed bindings, and sets each binding's revision.
func checkReply(r Reply, req Request) (Reply, error) {
	if r.Version != ProtocolVersion {
		return Reply{}, fmt.Errorf("%w: protocol version %d, want %d", ErrBadMessage, r.Version, ProtocolVersion)
	}
	if r.Error != "" {
		return r, fmt.Errorf("%w: %s", ErrHandlerFailed, r.Error)
	}
	if len(r.Decisions) != len(req.Proposals) {
		return Reply{}, fmt.Errorf("%w: %d decisions for %d proposals", ErrBadMessage, len(r.Decisions), len(req.Proposals))
	}
	var rebuilt []kvbinding.Binding // one allocation for the bindings rebuilt from proposals
	for i, d := range r.Decisions {
		if d.Group != req.Proposals[i].Group {
			return Reply{}, fmt.Errorf("%w: decision %d is for group %q, not %q", ErrBadMessage, i, d.Group, req.Proposals[i].Group)
		}
		switch d.Outcome {
		case Accepted, Rejected:
			if d.Binding == nil && d.Outcome == Accepted && !r.DecidedAt.IsZero() && d.Revision != 0 {
				if rebuilt == nil {
					rebuilt = make([]kvbinding.Binding, 0, len(r.Decisions)-i)
				}
				rebuilt = append(rebuilt, rebuild(req.Proposals[i], req.Proposer, r.Handler, r.DecidedAt))
				b := &rebuilt[len(rebuilt)-1]
				b.Revision = d.Revision
				r.Decisions[i].Binding = b
				continue
			}
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
