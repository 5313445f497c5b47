package proposals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"grouprouter/kvbinding"
)

// SubjectAdmin is the request/reply subject of operator commands (move,
// unbind), answered by the active LOCAL handler.
const SubjectAdmin = "grouping.admin"

// Admin operations.
const (
	OpMove   = "move"
	OpUnbind = "unbind"
)

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
	case OpMove:
		if err := kvbinding.ValidateNodeID(r.Node); err != nil {
			return AdminRequest{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
		}
	case OpUnbind:
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
	req := AdminRequest{Version: ProtocolVersion, Op: OpMove, Group: group, Node: node}
	if node == "" {
		req.Op = OpUnbind
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

func (h *Handler) onAdmin(m *nats.Msg) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		reply := h.admin(m.Data)
		reply.Version = ProtocolVersion
		data, _ := json.Marshal(reply)
		_ = m.Respond(data)
	}()
}

func (h *Handler) admin(data []byte) AdminReply {
	req, err := DecodeAdminRequest(data)
	if err != nil {
		return AdminReply{Error: err.Error(), Code: codeBadRequest}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cur, err := h.store.Get(ctx, req.Group)
	st := State{Live: h.liveState()}
	if err == nil {
		r := routeOf(cur)
		st.Existing = &r
	} else if !errors.Is(err, kvbinding.ErrNotFound) {
		return AdminReply{Error: err.Error(), Code: codeFailed}
	}
	reason := "operator " + req.Op
	v, err := DecideMove(st, MoveRequest{Group: req.Group, Target: req.Node, Reason: reason}, time.Now())
	if err != nil {
		code := codeFailed
		switch {
		case errors.Is(err, ErrUnknownGroup):
			code = codeUnknownGroup
		case errors.Is(err, ErrIneligibleNode):
			code = codeIneligible
		case errors.Is(err, ErrMoveInProgress):
			code = codeInProgress
		}
		return AdminReply{Error: fmt.Sprintf("%s %q: %s", req.Op, req.Group, v.Reason), Code: code}
	}
	if v.Action == Keep {
		return AdminReply{Binding: &cur, Revision: cur.Revision}
	}
	v.Binding.DecidedBy = h.id
	b, err := h.store.Replace(ctx, v.Binding, cur.Revision)
	if err != nil {
		if errors.Is(err, kvbinding.ErrConflict) {
			return AdminReply{Error: "group changed concurrently; try again", Code: codeInProgress}
		}
		return AdminReply{Error: err.Error(), Code: codeFailed}
	}
	h.cache.Apply(b)
	Event{Kind: EventMove, Group: b.Group, Node: b.Node, PrevNode: b.PrevNode, By: h.id, Reason: reason}.Publish(h.nc)
	h.log.Info("group move requested", "group", b.Group, "from", b.PrevNode, "to", b.Node)
	return AdminReply{Binding: &b, Revision: b.Revision}
}

// routeOf converts a stored record to the cache's view of it.
func routeOf(b kvbinding.Binding) kvbinding.Route {
	return kvbinding.Route{State: b.State, Node: b.Node, FromSeq: b.FromSeq, ThroughSeq: b.ThroughSeq,
		PrevNode: b.PrevNode, Handoff: b.Handoff, Revision: b.Revision}
}
