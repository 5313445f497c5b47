package proposals

import (
	"strconv"
	"time"

	"grouprouter/internal/jsonx"

	"github.com/nats-io/nats.go"
)

// SubjectEventsPrefix prefixes event subjects: grouping.events.<kind>.
const SubjectEventsPrefix = "grouping.events."

// Event kinds.
const (
	EventBind            = "bind"       // a group was bound (accepted or redirected)
	EventReject          = "reject"     // a proposal was rejected: another route stands
	EventTimeout         = "timeout"    // a proposal got no decision in time
	EventDeadLetter      = "deadletter" // messages went to the dead-letter stream
	EventHandlerTakeover = "handler"    // a LOCAL handler became active
	EventMove            = "move"       // a group is moving to another node (operator, node loss, no consumer)
	EventHandoff         = "handoff"    // a moved group's new node took it over and routes it
	EventExpire          = "expire"     // an idle group's binding expired
	EventClose           = "close"      // a group was closed by a Group-Seq: -1 message
	EventUnbind          = "unbind"     // a group's binding was released by an operator
)

// Event is the JSON body published on SubjectEventsPrefix + Kind.
type Event struct {
	Kind     string    `json:"kind"`
	Group    string    `json:"group"`
	Node     string    `json:"node,omitempty"`
	PrevNode string    `json:"prev_node,omitempty"`
	FromSeq  uint64    `json:"from_seq,omitempty"`
	By       string    `json:"by"`
	At       time.Time `json:"at"`
	Reason   string    `json:"reason,omitempty"`
	Attempt  int       `json:"attempt,omitempty"`
	Count    int       `json:"count,omitempty"`
}

// Publish sends the event on core NATS (fire and forget: events are for
// observers and never block routing).
func (e Event) Publish(nc *nats.Conn) {
	if e.At.IsZero() {
		e.At = time.Now().UTC()
	}
	_ = nc.Publish(SubjectEventsPrefix+e.Kind, e.AppendJSON(make([]byte, 0, 160)))
}

// AppendJSON appends the event's JSON encoding, as encoding/json writes it
// but without reflection (a bind event is published per new group) and
// without HTML escaping.
func (e Event) AppendJSON(buf []byte) []byte {
	buf = append(buf, `{"kind":`...)
	buf = jsonx.AppendString(buf, e.Kind)
	buf = append(buf, `,"group":`...)
	buf = jsonx.AppendString(buf, e.Group)
	if e.Node != "" {
		buf = append(buf, `,"node":`...)
		buf = jsonx.AppendString(buf, e.Node)
	}
	if e.PrevNode != "" {
		buf = append(buf, `,"prev_node":`...)
		buf = jsonx.AppendString(buf, e.PrevNode)
	}
	if e.FromSeq != 0 {
		buf = append(buf, `,"from_seq":`...)
		buf = strconv.AppendUint(buf, e.FromSeq, 10)
	}
	buf = append(buf, `,"by":`...)
	buf = jsonx.AppendString(buf, e.By)
	buf = append(buf, `,"at":"`...)
	buf = e.At.AppendFormat(buf, time.RFC3339Nano)
	buf = append(buf, '"')
	if e.Reason != "" {
		buf = append(buf, `,"reason":`...)
		buf = jsonx.AppendString(buf, e.Reason)
	}
	if e.Attempt != 0 {
		buf = append(buf, `,"attempt":`...)
		buf = strconv.AppendInt(buf, int64(e.Attempt), 10)
	}
	if e.Count != 0 {
		buf = append(buf, `,"count":`...)
		buf = strconv.AppendInt(buf, int64(e.Count), 10)
	}
	return append(buf, '}')
}
