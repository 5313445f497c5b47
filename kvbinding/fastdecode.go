package kvbinding

import (
	"bytes"
	"time"
)

// fastBinding decodes the fields of a binding value that the cache keeps
// (group, state, node, from_seq, through_seq, prev_node, handoff), without
// reflection: a warm start decodes every record of the bucket, and
// encoding/json was most of its time. It returns false for anything it
// does not handle plainly (escaped strings, unexpected types), and the
// caller then decodes with UnmarshalBinding.
func fastBinding(data []byte) (Binding, bool) {
	b, ok := decodeBinding(data, false)
	return b, ok && b.Validate() == nil
}

// decodeBinding decodes a binding value without reflection; with all set
// it keeps every field, else only those the cache needs.
func decodeBinding(data []byte, all bool) (Binding, bool) {
	var b Binding
	d := scanner{data: data}
	if !d.byte('{') {
		return b, false
	}
	if d.peek() == '}' {
		return b, false
	}
	for {
		key, ok := d.str()
		if !ok || !d.byte(':') {
			return b, false
		}
		switch key {
		case "group":
			b.Group, ok = d.str()
		case "state":
			var s string
			s, ok = d.str()
			b.State = State(s)
		case "node":
			b.Node, ok = d.str()
		case "prev_node":
			b.PrevNode, ok = d.str()
		case "from_seq":
			b.FromSeq, ok = d.uint()
		case "through_seq":
			b.ThroughSeq, ok = d.uint()
		case "handoff":
			b.Handoff, ok = d.bool()
		case "decided_at":
			var at string
			if at, ok = d.str(); ok {
				t, err := time.Parse(time.RFC3339Nano, at)
				ok = err == nil
				if all {
					b.DecidedAt = t
				}
			}
		case "decided_by":
			b.DecidedBy, ok = d.str()
		case "proposed_by":
			b.ProposedBy, ok = d.str()
		case "reason":
			b.Reason, ok = d.str()
		case "drain":
			var drain []string
			drain, ok = d.strings()
			if all {
				b.Drain = drain
			}
		default:
			return b, false
		}
		if !ok {
			return b, false
		}
		switch d.next() {
		case ',':
			continue
		case '}':
			if d.ws(); d.i != len(d.data) {
				return b, false
			}
			return b, true
		default:
			return b, false
		}
	}
}

type scanner struct {
	data []byte
	i    int
}

func (d *scanner) ws() {
	for d.i < len(d.data) {
		switch d.data[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *scanner) peek() byte {
	d.ws()
	if d.i < len(d.data) {
		return d.data[d.i]
	}
	return 0
}

func (d *scanner) next() byte {
	c := d.peek()
	if c != 0 {
		d.i++
	}
	return c
}

func (d *scanner) byte(c byte) bool { return d.next() == c }

// str reads a string without escapes or control characters.
func (d *scanner) str() (string, bool) {
	if !d.byte('"') {
		return "", false
	}
	rest := d.data[d.i:]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return "", false
	}
	for _, c := range rest[:j] {
		if c == '\\' || c < 0x20 {
			return "", false
		}
	}
	d.i += j + 1
	return string(rest[:j]), true
}

func (d *scanner) uint() (uint64, bool) {
	d.ws()
	var n uint64
	start := d.i
	for d.i < len(d.data) && d.data[d.i] >= '0' && d.data[d.i] <= '9' {
		if d.i-start >= 19 {
			return 0, false
		}
		n = n*10 + uint64(d.data[d.i]-'0')
		d.i++
	}
	if d.i == start || (d.data[start] == '0' && d.i-start > 1) {
		return 0, false
	}
	return n, true
}

func (d *scanner) bool() (bool, bool) {
	d.ws()
	switch {
	case bytes.HasPrefix(d.data[d.i:], []byte("true")):
		d.i += 4
		return true, true
	case bytes.HasPrefix(d.data[d.i:], []byte("false")):
		d.i += 5
		return false, true
	}
	return false, false
}

func (d *scanner) strings() ([]string, bool) {
	if !d.byte('[') {
		return nil, false
	}
	if d.peek() == ']' {
		d.i++
		return []string{}, true
	}
	var out []string
	for {
		s, ok := d.str()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		switch d.next() {
		case ',':
		case ']':
			return out, true
		default:
			return nil, false
		}
	}
}
