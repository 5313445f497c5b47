package kvbinding

import (
	"strconv"
	"time"

	"github.com/grouprouter/grouprouter/internal/jsonx"
)

// AppendJSON appends the binding's JSON encoding, as encoding/json would
// write it but without reflection and without HTML escaping: bindings are
// written and read for every new group. (Binding does not implement
// json.Marshaler on purpose: a struct embedding it would inherit it.)
func (b Binding) AppendJSON(buf []byte) []byte {
	buf = append(buf, `{"record":"binding","v":`...)
	buf = strconv.AppendInt(buf, RecordVersion, 10)
	buf = append(buf, `,"group":`...)
	buf = jsonx.AppendString(buf, b.Group)
	buf = append(buf, `,"state":`...)
	buf = jsonx.AppendString(buf, string(b.State))
	if b.Node != "" {
		buf = append(buf, `,"node":`...)
		buf = jsonx.AppendString(buf, b.Node)
	}
	buf = append(buf, `,"from_seq":`...)
	buf = strconv.AppendUint(buf, b.FromSeq, 10)
	if b.ThroughSeq != 0 {
		buf = append(buf, `,"through_seq":`...)
		buf = strconv.AppendUint(buf, b.ThroughSeq, 10)
	}
	if b.PrevNode != "" {
		buf = append(buf, `,"prev_node":`...)
		buf = jsonx.AppendString(buf, b.PrevNode)
	}
	buf = append(buf, `,"decided_at":"`...)
	buf = b.DecidedAt.AppendFormat(buf, time.RFC3339Nano)
	buf = append(buf, `","decided_by":`...)
	buf = jsonx.AppendString(buf, b.DecidedBy)
	if b.ProposedBy != "" {
		buf = append(buf, `,"proposed_by":`...)
		buf = jsonx.AppendString(buf, b.ProposedBy)
	}
	if b.Reason != "" {
		buf = append(buf, `,"reason":`...)
		buf = jsonx.AppendString(buf, b.Reason)
	}
	if b.Step != StepNone {
		buf = append(buf, `,"step":`...)
		buf = jsonx.AppendString(buf, string(b.Step))
	}
	if b.Routed != 0 {
		buf = append(buf, `,"routed":`...)
		buf = strconv.AppendUint(buf, b.Routed, 10)
	}
	if b.Ckpt != 0 {
		buf = append(buf, `,"ckpt":`...)
		buf = strconv.AppendUint(buf, b.Ckpt, 10)
	}
	if b.Epoch != 0 {
		buf = append(buf, `,"epoch":`...)
		buf = strconv.AppendUint(buf, b.Epoch, 10)
	}
	if len(b.Drain) > 0 {
		buf = append(buf, `,"drain":[`...)
		for i, n := range b.Drain {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = jsonx.AppendString(buf, n)
		}
		buf = append(buf, ']')
	}
	return append(buf, '}')
}

// DecodeJSON decodes a binding's JSON encoding (not validated), without
// reflection when the value is plain (no escaped strings, no field unknown
// to this release), with encoding/json otherwise, by the rules of
// record.go: a value of another kind, or untyped with a field unknown to
// this release, is an error.
func DecodeJSON(data []byte) (Binding, error) {
	if b, ok := decodeBinding(data, true); ok {
		return b, nil
	}
	var b Binding
	if err := decodeRecord(data, recordBinding, &b); err != nil {
		return Binding{}, err
	}
	return b, nil
}
