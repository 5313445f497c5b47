package wire

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

// DefaultGroupHeader is the header that carries a message's group id
// unless the router's Config.GroupHeader names another.
const DefaultGroupHeader = "Group-Id"

// MaxGroupIDLen is the longest group id accepted, in bytes.
const MaxGroupIDLen = 1024

// ErrInvalidGroupID is returned for a group id that is empty, longer
// than MaxGroupIDLen bytes or not valid UTF-8. Its text is the one it had
// in package kvbinding, where it was defined first.
var ErrInvalidGroupID = errors.New("kvbinding: invalid group id")

// ValidateGroupID reports whether id is a usable group id: 1 to
// MaxGroupIDLen bytes of valid UTF-8. The error wraps ErrInvalidGroupID.
func ValidateGroupID(id string) error {
	switch {
	case len(id) == 0:
		return fmt.Errorf("%w: empty", ErrInvalidGroupID)
	case len(id) > MaxGroupIDLen:
		return fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidGroupID, len(id), MaxGroupIDLen)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidGroupID)
	}
	return nil
}

// ValidHeaderName reports whether h can name the group header: printable
// ASCII without spaces or ':'.
func ValidHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	return true
}

// GroupOf returns the group id a message's headers carry under name (""
// for none) and, when the message cannot be grouped, why: the value is not
// a valid group id, or the header is there several times (in different
// letter cases, or repeated) with different values. Every node reads the
// same answer from the same headers: NATS headers are case-sensitive, so a
// differently cased name counts as the same header, and when its copies
// disagree the message is dead-lettered instead of guessed at.
func GroupOf(h nats.Header, name string) (group, invalid string) {
	var (
		value string
		found bool
	)
	for k, vs := range h {
		if len(k) != len(name) || !equalFold(k, name) {
			continue
		}
		for _, v := range vs {
			if !found {
				value, found = v, true
				continue
			}
			if v != value {
				return "", fmt.Sprintf("%s header is present more than once with different values", name)
			}
		}
	}
	if !found {
		return "", ""
	}
	if err := ValidateGroupID(value); err != nil {
		return "", fmt.Sprintf("invalid %s header: %v", name, err)
	}
	return value, ""
}

// equalFold reports whether the ASCII strings a and b, of the same length,
// are equal but for the letter case.
func equalFold(a, b string) bool {
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
