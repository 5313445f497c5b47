package proposals

import (
	"strconv"
	"time"

	"github.com/grouprouter/grouprouter/internal/jsonx"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
)

// SubjectEventsPrefix prefixes event subjects: grouping.events.<kind>.
const SubjectEventsPrefix = "grouping.events."

// Event kinds.
const (
	EventBind            = "bind"            // a group was bound (accepted or redirected)
	EventReject          = "reject"          // a proposal was rejected: another route stands
	EventTimeout         = "timeout"         // a proposal got no decision in time
	EventDeadLetter      = "deadletter"      // messages went to the dead-letter stream
	EventHandlerTakeover = "handler"         // a LOCAL handler became active
	EventMove            = "move"            // a group is moving to another node (operator, node loss, no consumer, rebalance)
	EventHandoff         = "handoff"         // a moved group's new node took it over and routes it
	EventExpire          = "expire"          // an idle group's binding expired
	EventClose           = "close"           // a group was closed by a Group-Seq: -1 message
	EventUnbind          = "unbind"          // a group's binding was released by an operator
	EventProgress        = "progress"        // how far a node is in a long takeover step (drain, catch-up)
	EventIngressGap      = "gap"             // ingress messages were gone before a node read them (expired, removed, lost)
	EventQueueLoss       = "queue-loss"      // the queue stream lost messages a node had stored (servers lost acknowledged writes)
	EventBucketRewind    = "bindings-rewind" // the bindings bucket went back below what a node had read
	EventPark            = "park"            // a consumer parked a group (package consumer): its failing message and the later ones wait
	EventRelease         = "release"         // a parked group's messages were replayed and the group runs again
	EventSkip            = "skip"            // a parked message was dropped unhandled (grouprouter skip, or a failure during a release)
	EventLimit           = "limit"           // new groups are refused: as many groups are bound as the limit (--max-groups)
	EventHold            = "hold"            // a group's messages past its share of its node's queue window wait on the node's held subject
	EventUnhold          = "unhold"          // a held-back group's held messages are all on its queue again
)

// Event is the JSON body published on SubjectEventsPrefix + Kind.
type Event struct {
	// ID is unique per event: a UUID version 7 (time-ordered) in its
	// canonical text form, set by Publish. The events stream may deliver
	// an event again (a subscriber reading it after a live one, a consumer
	// re-created after a fault); subscribers deduplicate on it.
	ID       string    `json:"id"`
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
	// Step, Total and Groups are set on progress events: Node has moved
	// (Step "drain") or routed (Step "catchup") Count of the Total
	// messages its step found so far (Total 0: not counted yet) for
	// Groups groups; Group and PrevNode are set when the step is about one
	// group. Reason is "done" on a step's last event, or why it stopped.
	Step   string `json:"step,omitempty"`
	Total  int    `json:"total,omitempty"`
	Groups int    `json:"groups,omitempty"`
}

// Publish sends the event on core NATS (fire and forget: events are for
// observers and never block routing; the stream GROUPING_EVENTS, when it
// exists, keeps them). It sets ID and At when they are empty.
func (e Event) Publish(nc *nats.Conn) {
	if e.At.IsZero() {
		e.At = time.Now().UTC()
	}
	if e.ID == "" {
		e.ID = NewEventID()
	}
	_ = nc.Publish(SubjectEventsPrefix+e.Kind, e.AppendJSON(make([]byte, 0, 160+len(e.Group)+len(e.Reason))))
}

// AppendJSON appends the event's JSON encoding, as encoding/json writes it
// but without reflection (a bind event is published per new group) and
// without HTML escaping.
func (e Event) AppendJSON(buf []byte) []byte {
	buf = append(buf, `{"id":`...)
	buf = jsonx.AppendString(buf, e.ID)
	buf = append(buf, `,"kind":`...)
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
	if e.Step != "" {
		buf = append(buf, `,"step":`...)
		buf = jsonx.AppendString(buf, e.Step)
	}
	if e.Total != 0 {
		buf = append(buf, `,"total":`...)
		buf = strconv.AppendInt(buf, int64(e.Total), 10)
	}
	if e.Groups != 0 {
		buf = append(buf, `,"groups":`...)
		buf = strconv.AppendInt(buf, int64(e.Groups), 10)
	}
	return append(buf, '}')
}

// NewEventID returns a new event id: a UUID version 7 (its first 48 bits
// are the Unix time in milliseconds, so ids sort by time), in canonical
// text form. It returns "" if the random source fails, which Go's
// crypto/rand does not (since Go 1.24 it never returns an error).
func NewEventID() string {
	id, err := uuid.NewV7()
	if err != nil {
		return ""
	}
	return id.String()
}
