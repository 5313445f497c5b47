package proposals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/grouprouter/grouprouter/internal/logagg"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// SubjectAdmin is the request/reply subject of operator commands (move,
// unbind), answered by the active LOCAL handler.
const SubjectAdmin = "grouping.admin"

// AdminRequest asks the handler to move a group to Node, or to unbind it.
type AdminRequest struct {
	Version int    `json:"v"`
	Op      string `json:"op"`
	Group   string `json:"group"`
	Node    string `json:"node,omitempty"`
}

// AdminReply answers an AdminRequest: the record written (a "moving"
// record the old owner then completes), or an error with a code.
type AdminReply struct {
	Version  int                `json:"v"`
	Binding  *kvbinding.Binding `json:"binding,omitempty"`
	Revision uint64             `json:"revision,omitempty"`
	Error    string             `json:"error,omitempty"`
	Code     string             `json:"code,omitempty"`
}

// Error codes of AdminReply.
const (
	codeUnknownGroup = "unknown_group"
	codeIneligible   = "ineligible_node"
	codeInProgress   = "move_in_progress"
	codeBadRequest   = "bad_request"
	codeFailed       = "failed"
)

// DecodeAdminRequest decodes and validates an operator request.
func DecodeAdminRequest(data []byte) (AdminRequest, error) {
	var r AdminRequest
	if err := json.Unmarshal(data, &r); err != nil {
		return AdminRequest{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	if r.Version != ProtocolVersion {
		return AdminRequest{}, fmt.Errorf("%w: protocol version %d, want %d", ErrBadMessage, r.Version, ProtocolVersion)
	}
	if err := kvbinding.ValidateGroupID(r.Group); err != nil {
		return AdminRequest{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	switch r.Op {
	case string(OpMove):
		if err := kvbinding.ValidateNodeID(r.Node); err != nil {
			return AdminRequest{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
		}
	case string(OpUnbind):
		if r.Node != "" {
			return AdminRequest{}, fmt.Errorf("%w: unbind takes no node", ErrBadMessage)
		}
	default:
		return AdminRequest{}, fmt.Errorf("%w: unknown op %q", ErrBadMessage, r.Op)
	}
	return r, nil
}

// Move asks the active handler to move group to node (unbind it when node
// is ""), with the same order-preserving handoff as a node loss. It returns
// the record written, or an error wrapping ErrUnknownGroup,
// ErrIneligibleNode, ErrMoveInProgress, ErrNoHandler, ErrDecisionTimeout or
// ErrBadMessage.
func Move(ctx context.Context, nc *nats.Conn, group, node string, timeout time.Duration) (kvbinding.Binding, error) {
	req := AdminRequest{Version: ProtocolVersion, Op: string(OpMove), Group: group, Node: node}
	if node == "" {
		req.Op = string(OpUnbind)
	}
	data, err := json.Marshal(req)
	if err != nil {
		return kvbinding.Binding{}, err
	}
	if _, err := DecodeAdminRequest(data); err != nil {
		return kvbinding.Binding{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, SubjectAdmin, data)
	switch {
	case err == nil:
	case errors.Is(err, nats.ErrNoResponders):
		return kvbinding.Binding{}, ErrNoHandler
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return kvbinding.Binding{}, fmt.Errorf("%w after %v", ErrDecisionTimeout, timeout)
	default:
		return kvbinding.Binding{}, err
	}
	var reply AdminReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return kvbinding.Binding{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	if reply.Error != "" {
		var sentinel error = ErrHandlerFailed
		switch reply.Code {
		case codeUnknownGroup:
			sentinel = ErrUnknownGroup
		case codeIneligible:
			sentinel = ErrIneligibleNode
		case codeInProgress:
			sentinel = ErrMoveInProgress
		case codeBadRequest:
			sentinel = ErrBadMessage
		}
		return kvbinding.Binding{}, fmt.Errorf("%w: %s", sentinel, reply.Error)
	}
	if reply.Binding == nil {
		return kvbinding.Binding{}, fmt.Errorf("%w: reply without binding", ErrBadMessage)
	}
	b := *reply.Binding
	b.Revision = reply.Revision
	return b, nil
}

// serveAdmin answers one operator request; it reports whether the answer
// is an error.
func (h *Handler) serveAdmin(ctx context.Context, r micro.Request) bool {
	reply := h.admin(ctx, r.Data())
	reply.Version = ProtocolVersion
	data, _ := json.Marshal(reply)
	_ = h.respond(r, data)
	return reply.Error != ""
}

func (h *Handler) admin(ctx context.Context, data []byte) AdminReply {
	req, err := DecodeAdminRequest(data)
	if err != nil {
		return AdminReply{Error: err.Error(), Code: codeBadRequest}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	op := OpMove
	if req.Op == string(OpUnbind) {
		op = OpUnbind
	}
	reason := "operator " + req.Op
	res, b, err := h.apply(ctx, req.Group, Input{Op: op, By: "operator", Node: req.Node, Reason: reason}, h.liveState(), causeOperator)
	switch {
	case err != nil:
		return AdminReply{Error: err.Error(), Code: codeFailed}
	case res.Outcome == Refused || res.Outcome == Failed:
		code := codeFailed
		switch {
		case errors.Is(res.Err, ErrUnknownGroup):
			code = codeUnknownGroup
		case errors.Is(res.Err, ErrIneligibleNode):
			code = codeIneligible
		case errors.Is(res.Err, ErrMoveInProgress):
			code = codeInProgress
		}
		return AdminReply{Error: fmt.Sprintf("%s %q: %s", req.Op, req.Group, res.Reason), Code: code}
	case res.Write == nil:
		// Already where it was asked to go: the record as stored.
		cur, err := h.store.Get(ctx, req.Group)
		if err != nil {
			return AdminReply{Error: err.Error(), Code: codeFailed}
		}
		return AdminReply{Binding: &cur, Revision: cur.Revision}
	}
	h.log.Info("group move requested", "group", logagg.Short(b.Group), "from", b.PrevNode, "to", b.Node, "revision", b.Revision)
	return AdminReply{Binding: &b, Revision: b.Revision}
}
