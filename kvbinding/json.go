package kvbinding

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendJSON appends the binding's JSON encoding, as encoding/json would
// write it but without reflection and without HTML escaping: bindings are
// written and read for every new group. (Binding does not implement
// json.Marshaler on purpose: a struct embedding it would inherit it.)
func (b Binding) AppendJSON(buf []byte) []byte {
	buf = append(buf, `{"group":`...)
	buf = appendString(buf, b.Group)
	buf = append(buf, `,"state":`...)
	buf = appendString(buf, string(b.State))
	if b.Node != "" {
		buf = append(buf, `,"node":`...)
		buf = appendString(buf, b.Node)
	}
	buf = append(buf, `,"from_seq":`...)
	buf = strconv.AppendUint(buf, b.FromSeq, 10)
	if b.ThroughSeq != 0 {
		buf = append(buf, `,"through_seq":`...)
		buf = strconv.AppendUint(buf, b.ThroughSeq, 10)
	}
	if b.PrevNode != "" {
		buf = append(buf, `,"prev_node":`...)
		buf = appendString(buf, b.PrevNode)
	}
	buf = append(buf, `,"decided_at":"`...)
	buf = b.DecidedAt.AppendFormat(buf, time.RFC3339Nano)
	buf = append(buf, `","decided_by":`...)
	buf = appendString(buf, b.DecidedBy)
	if b.ProposedBy != "" {
		buf = append(buf, `,"proposed_by":`...)
		buf = appendString(buf, b.ProposedBy)
	}
	if b.Reason != "" {
		buf = append(buf, `,"reason":`...)
		buf = appendString(buf, b.Reason)
	}
	if b.Handoff {
		buf = append(buf, `,"handoff":true`...)
	}
	if len(b.Drain) > 0 {
		buf = append(buf, `,"drain":[`...)
		for i, n := range b.Drain {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendString(buf, n)
		}
		buf = append(buf, ']')
	}
	return append(buf, '}')
}

// AppendJSONString appends s as a JSON string (invalid UTF-8 replaced, as
// encoding/json does, HTML characters as they are).
func AppendJSONString(buf []byte, s string) []byte { return appendString(buf, s) }

// appendString appends s as a JSON string.
func appendString(buf []byte, s string) []byte {
	if !utf8.ValidString(s) {
		q, _ := json.Marshal(s) // replaces invalid bytes, as encoding/json does
		return append(buf, q...)
	}
	buf = append(buf, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		buf = append(buf, s[start:i]...)
		switch c {
		case '"', '\\':
			buf = append(buf, '\\', c)
		case '\n':
			buf = append(buf, '\\', 'n')
		case '\r':
			buf = append(buf, '\\', 'r')
		case '\t':
			buf = append(buf, '\\', 't')
		default:
			const hex = "0123456789abcdef"
			buf = append(buf, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	buf = append(buf, s[start:]...)
	return append(buf, '"')
}

// DecodeJSON decodes a binding's JSON encoding (not validated), without
// reflection when the value is plain (no escaped strings), with
// encoding/json otherwise.
func DecodeJSON(data []byte) (Binding, error) {
	if b, ok := decodeBinding(data, true); ok {
		return b, nil
	}
	var b Binding
	if err := json.Unmarshal(data, &b); err != nil {
		return Binding{}, err
	}
	return b, nil
}
