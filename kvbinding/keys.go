package kvbinding

import (
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxGroupIDLen is the longest group id accepted, in bytes.
const MaxGroupIDLen = 1024

// UngroupedKey is the reserved key of the routing binding for messages that
// carry no group id. No group id encodes to it.
const UngroupedKey = "ungrouped"

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

// Key returns the KV key of a group id. It is injective: distinct ids give
// distinct keys, and GroupFromKey inverts it.
func Key(group string) (string, error) {
	if err := ValidateGroupID(group); err != nil {
		return "", err
	}
	if isPlain(group) {
		return "r." + group, nil
	}
	return "b." + base64.RawURLEncoding.EncodeToString([]byte(group)), nil
}

// GroupFromKey returns the group id a key produced by Key stands for.
func GroupFromKey(key string) (string, error) {
	switch {
	case strings.HasPrefix(key, "r."):
		id := key[2:]
		if id == "" || !isPlain(id) {
			return "", fmt.Errorf("%w: %q", ErrInvalidKey, key)
		}
		return id, nil
	case strings.HasPrefix(key, "b."):
		raw, err := base64.RawURLEncoding.Strict().DecodeString(key[2:])
		if err != nil {
			return "", fmt.Errorf("%w: %q: %v", ErrInvalidKey, key, err)
		}
		id := string(raw)
		if err := ValidateGroupID(id); err != nil || isPlain(id) {
			// A plain id is always stored as "r.": a "b." form of it is not canonical.
			return "", fmt.Errorf("%w: %q", ErrInvalidKey, key)
		}
		return id, nil
	}
	return "", fmt.Errorf("%w: %q", ErrInvalidKey, key)
}

// isPlain reports whether s is made only of characters that are safe as a
// single KV key token.
func isPlain(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '=':
		default:
			return false
		}
	}
	return true
}
