// Package jsonx holds the small, reflection-free JSON reader and writer
// the hot paths share: binding values, proposal requests and replies, and
// events. Each of them is written by this project in one known shape; the
// reader handles that shape ("plain" JSON: strings without escapes,
// unsigned integers, booleans, objects and arrays of those) and reports
// anything else as not handled, so that its caller falls back to
// encoding/json and the result never differs from what encoding/json
// would decode.
package jsonx

import (
	"bytes"
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendString appends s as a JSON string, as encoding/json writes it but
// without HTML escaping: invalid UTF-8 bytes become \ufffd, U+2028 and
// U+2029 are escaped.
func AppendString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			switch {
			case r == utf8.RuneError && size == 1:
				buf = append(buf, s[start:i]...)
				buf = append(buf, `\ufffd`...)
			case r == '\u2028' || r == '\u2029':
				buf = append(buf, s[start:i]...)
				buf = append(buf, '\\', 'u', '2', '0', '2', '8'+byte(r&1))
			default:
				i += size
				continue
			}
			i += size
			start = i
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
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
		case '\b':
			buf = append(buf, '\\', 'b')
		case '\f':
			buf = append(buf, '\\', 'f')
		default:
			const hex = "0123456789abcdef"
			buf = append(buf, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	buf = append(buf, s[start:]...)
	return append(buf, '"')
}

// StringLen returns len(AppendString(nil, s)) without writing anything:
// the bytes s takes as a JSON string, quotes included.
func StringLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			switch {
			case r == utf8.RuneError && size == 1, r == '\u2028' || r == '\u2029':
				n += 6
			default:
				n += size
			}
			i += size
			continue
		}
		switch {
		case c >= 0x20 && c != '"' && c != '\\':
			n++
		case c == '"', c == '\\', c == '\n', c == '\r', c == '\t', c == '\b', c == '\f':
			n += 2
		default:
			n += 6
		}
		i++
	}
	return n
}

// AppendField appends `,"name":` (without the comma when first is true).
func AppendField(buf []byte, name string, first bool) []byte {
	if !first {
		buf = append(buf, ',')
	}
	buf = append(buf, '"')
	buf = append(buf, name...)
	return append(buf, '"', ':')
}

// AppendUint appends n in decimal.
func AppendUint(buf []byte, n uint64) []byte { return strconv.AppendUint(buf, n, 10) }

// Scanner reads plain JSON from Data, from offset I. Every method skips
// leading whitespace and returns false for input it does not handle.
type Scanner struct {
	Data []byte
	I    int
}

// NewScanner returns a scanner over data.
func NewScanner(data []byte) *Scanner { return &Scanner{Data: data} }

func (d *Scanner) ws() {
	for d.I < len(d.Data) {
		switch d.Data[d.I] {
		case ' ', '\t', '\n', '\r':
			d.I++
		default:
			return
		}
	}
}

// Peek returns the next non-space byte without consuming it (0 at the end).
func (d *Scanner) Peek() byte {
	d.ws()
	if d.I < len(d.Data) {
		return d.Data[d.I]
	}
	return 0
}

// Next consumes and returns the next non-space byte (0 at the end).
func (d *Scanner) Next() byte {
	c := d.Peek()
	if c != 0 {
		d.I++
	}
	return c
}

// Byte consumes the next non-space byte and reports whether it is c.
func (d *Scanner) Byte(c byte) bool { return d.Next() == c }

// End reports whether only whitespace is left.
func (d *Scanner) End() bool {
	d.ws()
	return d.I == len(d.Data)
}

// Str reads a string without escapes or control characters, in valid UTF-8.
func (d *Scanner) Str() (string, bool) {
	b, ok := d.strBytes()
	return string(b), ok
}

func (d *Scanner) strBytes() ([]byte, bool) {
	if !d.Byte('"') {
		return nil, false
	}
	rest := d.Data[d.I:]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return nil, false
	}
	ascii := true
	for _, c := range rest[:j] {
		if c == '\\' || c < 0x20 {
			return nil, false
		}
		if c >= utf8.RuneSelf {
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(rest[:j]) {
		return nil, false // encoding/json would replace the invalid bytes
	}
	d.I += j + 1
	return rest[:j], true
}

// Uint reads an unsigned integer of at most 19 digits, without a leading zero.
func (d *Scanner) Uint() (uint64, bool) {
	d.ws()
	var n uint64
	start := d.I
	for d.I < len(d.Data) && d.Data[d.I] >= '0' && d.Data[d.I] <= '9' {
		if d.I-start >= 19 {
			return 0, false
		}
		n = n*10 + uint64(d.Data[d.I]-'0')
		d.I++
	}
	if d.I == start || (d.Data[start] == '0' && d.I-start > 1) {
		return 0, false
	}
	if d.I < len(d.Data) {
		switch d.Data[d.I] {
		case '.', 'e', 'E':
			return 0, false // a fraction or an exponent: not plain
		}
	}
	return n, true
}

// Int reads a non-negative integer that fits an int32 (versions, counts).
func (d *Scanner) Int() (int, bool) {
	n, ok := d.Uint()
	if !ok || n > 1<<31-1 {
		return 0, false
	}
	return int(n), true
}

// Bool reads true or false.
func (d *Scanner) Bool() (bool, bool) {
	d.ws()
	switch {
	case bytes.HasPrefix(d.Data[d.I:], []byte("true")):
		d.I += 4
		return true, true
	case bytes.HasPrefix(d.Data[d.I:], []byte("false")):
		d.I += 5
		return false, true
	}
	return false, false
}

// Time reads a time written in RFC 3339 with optional fractional seconds,
// as encoding/json writes a time.Time.
func (d *Scanner) Time() (time.Time, bool) {
	s, ok := d.Str()
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	return t, err == nil
}

// Strings reads an array of strings.
func (d *Scanner) Strings() ([]string, bool) {
	if !d.Byte('[') {
		return nil, false
	}
	if d.Peek() == ']' {
		d.I++
		return []string{}, true
	}
	var out []string
	for {
		s, ok := d.Str()
		if !ok {
			return nil, false
		}
		out = append(out, s)
		switch d.Next() {
		case ',':
		case ']':
			return out, true
		default:
			return nil, false
		}
	}
}

// Object reads an object, calling field for each key with the scanner
// positioned at its value; field must consume the value and return true,
// or return false to give up. An empty object is not handled (no caller
// writes one).
func (d *Scanner) Object(field func(key []byte) bool) bool {
	if !d.Byte('{') || d.Peek() == '}' {
		return false
	}
	for {
		key, ok := d.strBytes()
		if !ok || !d.Byte(':') || !field(key) {
			return false
		}
		switch d.Next() {
		case ',':
		case '}':
			return true
		default:
			return false
		}
	}
}

// Array reads an array, calling elem for each element with the scanner
// positioned at it; elem must consume it and return true. An empty array
// is handled.
func (d *Scanner) Array(elem func() bool) bool {
	if !d.Byte('[') {
		return false
	}
	if d.Peek() == ']' {
		d.I++
		return true
	}
	for {
		if !elem() {
			return false
		}
		switch d.Next() {
		case ',':
		case ']':
			return true
		default:
			return false
		}
	}
}

// Raw consumes one plain value and returns its bytes.
func (d *Scanner) Raw() ([]byte, bool) {
	d.ws()
	start := d.I
	if !d.skip(0) {
		return nil, false
	}
	return d.Data[start:d.I], true
}

// maxDepth bounds nesting in Raw.
const maxDepth = 16

func (d *Scanner) skip(depth int) bool {
	if depth > maxDepth {
		return false
	}
	switch d.Peek() {
	case '"':
		_, ok := d.strBytes()
		return ok
	case '{':
		return d.Object(func([]byte) bool { return d.skip(depth + 1) })
	case '[':
		return d.Array(func() bool { return d.skip(depth + 1) })
	case 't', 'f':
		_, ok := d.Bool()
		return ok
	default:
		_, ok := d.Uint()
		return ok
	}
}
