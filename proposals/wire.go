package proposals

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/grouprouter/grouprouter/internal/jsonx"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// Subjects of the protocol.
const (
	// SubjectProposePrefix + <node> is the subject node <node> sends its
	// proposals on; the active LOCAL handler answers (SubjectPropose is its
	// subscription). The handler refuses a request whose proposer is not
	// the subject's node, so that NATS permissions on the subject decide
	// who may speak as whom.
	SubjectProposePrefix = "grouping.propose."
	// SubjectPropose is the wildcard the handler subscribes to.
	SubjectPropose = SubjectProposePrefix + "*"
)

// ProposeSubject returns the subject node proposes on.
func ProposeSubject(node string) string { return SubjectProposePrefix + node }

// handlerQueue is the queue group handlers subscribe in: should two ever
// overlap, each proposal is still answered once.
const handlerQueue = "grouping-handlers"

// ProtocolVersion is the version of the wire format. Version 3 put every
// record change a node asks for (not only bindings) on the node's own
// subject, and replies name revisions instead of carrying records.
const ProtocolVersion = 3

// MinProtocolVersion is the oldest version this release reads. A request
// or reply of any version from MinProtocolVersion to ProtocolVersion+1 is
// read (fields unknown to this release ignored), so that during a rolling
// upgrade nodes of this release and of the next one ask each other's
// handlers: the next release may add fields, and must keep reading this
// one's messages (see docs/operations.md, "Rolling upgrades").
const MinProtocolVersion = 3

// readableVersion reports whether messages of version v are read.
func readableVersion(v int) bool { return v >= MinProtocolVersion && v <= ProtocolVersion+1 }

// MaxProposalsPerRequest bounds one request.
const MaxProposalsPerRequest = 1024

// MaxRequestBytes bounds a request (and a reply) on the wire.
const MaxRequestBytes = 1 << 20

// maxReasonLen bounds the reason a node gives.
const maxReasonLen = 512

// Proposal asks the handler for one change of a group's record: a binding
// (Op "" or OpBind) or a step of the group's life (see Op).
type Proposal struct {
	// Op is what is asked; "" means OpBind.
	Op Op `json:"op,omitempty"`
	// Group is the group id; "" is the routing binding of ungrouped messages.
	Group string `json:"group"`
	// Node is the proposed node (bind).
	Node string `json:"node,omitempty"`
	// Seq is the ingress sequence the change applies at (see Input.Seq).
	Seq uint64 `json:"seq,omitempty"`
	// First is the first message a dead-letter ask covers (see Input.First).
	First uint64 `json:"first,omitempty"`
	// Rev is the record revision a step acted on (see Input.Rev).
	Rev uint64 `json:"rev,omitempty"`
	// Kind is EventExpire or EventClose (release).
	Kind string `json:"kind,omitempty"`
	// Reason says why (release, deadletter).
	Reason string `json:"reason,omitempty"`
	// Count is how many messages a step concerned (drained, caught_up, deadletter).
	Count int `json:"count,omitempty"`
	// Clean (fence) says the fencing node's queue and held subject store
	// nothing of the group: see Input.Clean. A handler that does not know
	// the field drains the queue as before.
	Clean bool `json:"clean,omitempty"`
}

// op returns the proposal's op, OpBind for "".
func (p Proposal) op() Op {
	if p.Op == "" {
		return OpBind
	}
	return p.Op
}

// Input returns the state machine input of a proposal by node proposer.
func (p Proposal) Input(proposer string) Input {
	return Input{Op: p.op(), By: proposer, Node: p.Node, Seq: p.Seq, First: p.First, Rev: p.Rev, Kind: p.Kind, Reason: p.Reason, Count: p.Count,
		Clean: p.Clean}
}

// Validate checks one proposal's fields (not whether the handler will
// accept it: that is Transition's).
func (p Proposal) Validate() error {
	if p.Group != "" {
		if err := kvbinding.ValidateGroupID(p.Group); err != nil {
			return err
		}
	}
	op := p.op()
	if !IsNodeOp(op) {
		return fmt.Errorf("op %q is not one a node asks for", p.Op)
	}
	switch op {
	case OpBind:
		if err := kvbinding.ValidateNodeID(p.Node); err != nil {
			return err
		}
		if p.Seq == 0 {
			return fmt.Errorf("seq must be >= 1")
		}
	case OpFence, OpDrained, OpCaughtUp, OpRelease:
		if p.Rev == 0 {
			return fmt.Errorf("%s needs the revision it acts on", op)
		}
	case OpDeadLetter:
		if p.Seq == 0 || p.First > p.Seq {
			return fmt.Errorf("seq must be >= 1 and first <= seq")
		}
	}
	if p.Node != "" && op != OpBind {
		return fmt.Errorf("%s takes no node", op)
	}
	if p.Clean && op != OpFence {
		return fmt.Errorf("only a fence says clean, not %s", op)
	}
	if len(p.Reason) > maxReasonLen || len(p.Kind) > 16 || p.Count < 0 {
		return fmt.Errorf("reason, kind or count out of bounds")
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
	// Accepted: the change was written; Revision is the new record's.
	Accepted Outcome = "accepted"
	// Rejected: another record stands; Revision is its.
	Rejected Outcome = "rejected"
	// Failed: nothing was decided; Error says why. Propose again later.
	Failed Outcome = "failed"
)

// Decision answers one proposal. A node's cache learns records from the
// bindings bucket's watch only: Revision tells it which revision of the
// group's record to wait for.
type Decision struct {
	Group    string  `json:"group"`
	Outcome  Outcome `json:"outcome"`
	Revision uint64  `json:"revision,omitempty"`
	Error    string  `json:"error,omitempty"`
	// Floor is set on a bind refused below the routing floor: the
	// floor, below which the asker drops the group's messages (the
	// cluster routed them already).
	Floor uint64 `json:"floor,omitempty"`
	// Limit is set on a bind refused because as many groups are bound as
	// the cluster's limit: the limit. The asker dead-letters the group's
	// held messages. (Releases before it send no such field: their
	// askers retry, as for any refusal.)
	Limit int `json:"limit,omitempty"`
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
	// Written by hand: a request carries up to MaxProposalsPerRequest
	// proposals, and encoding/json was a visible share of a decision's CPU.
	// Sized exactly: a buffer grown by doubling allocated three times a
	// request of long group ids.
	size := 48 + len(r.Proposer)
	for _, p := range r.Proposals {
		size += p.EncodedLen() + 1
	}
	buf := make([]byte, 0, size)
	buf = append(buf, `{"v":`...)
	buf = strconv.AppendInt(buf, ProtocolVersion, 10)
	buf = append(buf, `,"proposer":`...)
	buf = jsonx.AppendString(buf, r.Proposer)
	buf = append(buf, `,"proposals":[`...)
	for i, p := range r.Proposals {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = p.appendJSON(buf)
	}
	buf = append(buf, ']', '}')
	if len(buf) > MaxRequestBytes {
		return nil, fmt.Errorf("%w: request of %d bytes, at most %d", ErrBadMessage, len(buf), MaxRequestBytes)
	}
	return buf, nil
}

// appendJSON appends p as encoding/json writes it.
func (p Proposal) appendJSON(buf []byte) []byte {
	buf = append(buf, '{')
	if p.Op != "" {
		buf = append(buf, `"op":`...)
		buf = jsonx.AppendString(buf, string(p.Op))
		buf = append(buf, ',')
	}
	buf = append(buf, `"group":`...)
	buf = jsonx.AppendString(buf, p.Group)
	if p.Node != "" {
		buf = append(buf, `,"node":`...)
		buf = jsonx.AppendString(buf, p.Node)
	}
	if p.Seq != 0 {
		buf = append(buf, `,"seq":`...)
		buf = strconv.AppendUint(buf, p.Seq, 10)
	}
	if p.First != 0 {
		buf = append(buf, `,"first":`...)
		buf = strconv.AppendUint(buf, p.First, 10)
	}
	if p.Rev != 0 {
		buf = append(buf, `,"rev":`...)
		buf = strconv.AppendUint(buf, p.Rev, 10)
	}
	if p.Kind != "" {
		buf = append(buf, `,"kind":`...)
		buf = jsonx.AppendString(buf, p.Kind)
	}
	if p.Reason != "" {
		buf = append(buf, `,"reason":`...)
		buf = jsonx.AppendString(buf, p.Reason)
	}
	if p.Count != 0 {
		buf = append(buf, `,"count":`...)
		buf = strconv.AppendInt(buf, int64(p.Count), 10)
	}
	if p.Clean {
		buf = append(buf, `,"clean":true`...)
	}
	return append(buf, '}')
}

// EncodedLen returns the bytes p takes in a request (len of what
// appendJSON writes), without encoding it: the asker fills a request up to
// RequestBudget with it.
func (p Proposal) EncodedLen() int {
	n := len(`{"group":}`) + jsonx.StringLen(p.Group)
	str := func(name, v string) {
		if v != "" {
			n += len(name) + 4 + jsonx.StringLen(v) // ,"name":
		}
	}
	num := func(name string, v uint64) {
		if v != 0 {
			n += len(name) + 4 + digits(v)
		}
	}
	if p.Op != "" {
		n += len(`"op":,`) + jsonx.StringLen(string(p.Op))
	}
	str("node", p.Node)
	num("seq", p.Seq)
	num("first", p.First)
	num("rev", p.Rev)
	str("kind", p.Kind)
	str("reason", p.Reason)
	if p.Count != 0 {
		n += len("count") + 4 + len(strconv.Itoa(p.Count))
	}
	if p.Clean {
		n += len(`,"clean":true`)
	}
	return n
}

// digits returns the decimal digits of v.
func digits(v uint64) int {
	n := 1
	for v >= 10 {
		v /= 10
		n++
	}
	return n
}

// RequestBudget is the most bytes of proposals an asker puts in one
// request (see Proposal.EncodedLen), a third of MaxRequestBytes: the reply
// repeats every group id and may add an error to each decision, and must
// fit in MaxRequestBytes (and the server's max_payload) too. A batch of
// MaxProposalsPerRequest proposals of long group ids (up to
// kvbinding.MaxGroupIDLen bytes each) would not: a request over
// MaxRequestBytes fails as a whole, and every proposal in it is retried.
const RequestBudget = MaxRequestBytes / 3

// DecodeRequest decodes a request and checks its envelope. A malformed
// envelope is an error wrapping ErrBadMessage; individual invalid
// proposals are left for the handler to answer with a failed decision, so
// that the rest can proceed.
func DecodeRequest(data []byte) (Request, error) {
	if len(data) > MaxRequestBytes {
		return Request{}, fmt.Errorf("%w: request of %d bytes, at most %d", ErrBadMessage, len(data), MaxRequestBytes)
	}
	r, ok := scanRequest(data)
	if !ok {
		r = Request{}
		if err := json.Unmarshal(data, &r); err != nil {
			return Request{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
		}
	}
	if !readableVersion(r.Version) {
		return Request{}, fmt.Errorf("%w: protocol version %d, this release reads %d to %d", ErrBadMessage, r.Version, MinProtocolVersion, ProtocolVersion+1)
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
			r.Proposals = make([]Proposal, 0, min(bytes.Count(data, []byte(`"group"`)), MaxProposalsPerRequest+1))
			ok = d.Array(func() bool {
				var p Proposal
				ok := d.Object(func(key []byte) bool {
					var ok bool
					switch string(key) {
					case "op":
						var s string
						s, ok = d.Str()
						p.Op = Op(s)
					case "group":
						p.Group, ok = d.Str()
					case "node":
						p.Node, ok = d.Str()
					case "seq":
						p.Seq, ok = d.Uint()
					case "first":
						p.First, ok = d.Uint()
					case "rev":
						p.Rev, ok = d.Uint()
					case "kind":
						p.Kind, ok = d.Str()
					case "reason":
						p.Reason, ok = d.Str()
					case "count":
						p.Count, ok = d.Int()
					case "clean":
						p.Clean, ok = d.Bool()
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
	size := 64 + len(r.Handler)
	for _, d := range r.Decisions {
		size += 64 + len(d.Group) + len(d.Error) // about, before escapes
	}
	buf := make([]byte, 0, size)
	buf = append(buf, `{"v":`...)
	buf = strconv.AppendInt(buf, ProtocolVersion, 10)
	buf = append(buf, `,"handler":`...)
	buf = jsonx.AppendString(buf, r.Handler)
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
			if d.Revision != 0 {
				buf = append(buf, `,"revision":`...)
				buf = strconv.AppendUint(buf, d.Revision, 10)
			}
			if d.Error != "" {
				buf = append(buf, `,"error":`...)
				buf = jsonx.AppendString(buf, d.Error)
			}
			if d.Floor != 0 {
				buf = append(buf, `,"floor":`...)
				buf = strconv.AppendUint(buf, d.Floor, 10)
			}
			if d.Limit > 0 {
				buf = append(buf, `,"limit":`...)
				buf = strconv.AppendInt(buf, int64(d.Limit), 10)
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

// DecodeReply decodes a reply to req and checks that it answers each of
// its proposals, in order, for the same groups.
func DecodeReply(data []byte, req Request) (Reply, error) {
	if len(data) > MaxRequestBytes {
		return Reply{}, fmt.Errorf("%w: reply of %d bytes", ErrBadMessage, len(data))
	}
	r, ok := scanReply(data, len(req.Proposals))
	if !ok {
		r = Reply{}
		if err := json.Unmarshal(data, &r); err != nil {
			return Reply{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
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
		case "error":
			r.Error, ok = d.Str()
		case "decisions":
			r.Decisions = make([]Decision, 0, min(n, MaxProposalsPerRequest))
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
					case "floor":
						dec.Floor, ok = d.Uint()
					case "limit":
						var n int
						n, ok = d.Int()
						dec.Limit = n
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

// checkReply checks that r answers each proposal of req, in order.
func checkReply(r Reply, req Request) (Reply, error) {
	if !readableVersion(r.Version) {
		return Reply{}, fmt.Errorf("%w: protocol version %d, this release reads %d to %d", ErrBadMessage, r.Version, MinProtocolVersion, ProtocolVersion+1)
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
			if d.Revision == 0 {
				return Reply{}, fmt.Errorf("%w: decision %d names no revision", ErrBadMessage, i)
			}
		case Refused, Failed:
		default:
			return Reply{}, fmt.Errorf("%w: decision %d has outcome %q", ErrBadMessage, i, d.Outcome)
		}
	}
	return r, nil
}

// ProposerOf returns the node a proposal subject names, and whether the
// subject is one (SubjectProposePrefix + a single node id token).
func ProposerOf(subject string) (string, bool) {
	node, ok := strings.CutPrefix(subject, SubjectProposePrefix)
	if !ok || kvbinding.ValidateNodeID(node) != nil {
		return "", false
	}
	return node, true
}
