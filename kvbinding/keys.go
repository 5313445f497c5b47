package kvbinding

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"unsafe"

	"github.com/grouprouter/grouprouter/wire"
)

// MaxGroupIDLen is wire.MaxGroupIDLen.
const MaxGroupIDLen = wire.MaxGroupIDLen

// UngroupedKey is the reserved key of the routing binding for messages that
// carry no group id. No group id encodes to it.
const UngroupedKey = "ungrouped"

// ValidateGroupID is wire.ValidateGroupID.
func ValidateGroupID(id string) error { return wire.ValidateGroupID(id) }

// MaxKeyLen is the longest key Key produces. A group id whose full key
// (see FullKey) would be longer gets a digest key instead, "h." and the
// SHA-256 of the id in unpadded base64url (45 bytes): a key, and so the KV
// subject every write and every watcher carries, costs the same for an id
// of 100 bytes as for one of 1,024. The record holds the full id.
const MaxKeyLen = 64

// digestKeyLen is the length of a digest key: "h." + 43 base64url
// characters of a SHA-256.
const digestKeyLen = 2 + 43

// Key returns the KV key of a group id in the bindings bucket: its full
// key (FullKey) when that is at most MaxKeyLen bytes, else its digest key
// ("h." + base64url(SHA-256(id))). Ids of up to 62 plain characters keep
// the key they always had. Distinct ids give distinct keys but for a
// SHA-256 collision; the record under a digest key names its group, and a
// record of another group there is never taken for the asked one (see
// Store.Get, ErrKeyCollision). GroupFromKey inverts the full keys, not the
// digest keys.
func Key(group string) (string, error) {
	full, err := FullKey(group)
	if err != nil || len(full) <= MaxKeyLen {
		return full, err
	}
	return digestKey(group), nil
}

// FullKey returns the injective, invertible key of a group id: "r." + id
// for ids made of letters, digits, '-', '_' and '=', else "b." +
// base64url(id), whatever its length (up to about 1.4 KB). It was the
// binding key of every id before digest keys: records of long ids written
// then are still read under it (see LegacyKey). Buckets whose values do
// not name their group (the consumer's parked bucket) keep using it.
func FullKey(group string) (string, error) {
	if err := ValidateGroupID(group); err != nil {
		return "", err
	}
	if isPlain(group) {
		return "r." + group, nil
	}
	return "b." + base64.RawURLEncoding.EncodeToString([]byte(group)), nil
}

// LegacyKey returns the key a group's record had before digest keys, and
// true, for an id whose Key is a digest key; "", false otherwise (the key
// did not change).
func LegacyKey(group string) (string, bool) {
	full, err := FullKey(group)
	if err != nil || len(full) <= MaxKeyLen {
		return "", false
	}
	return full, true
}

func digestKey(group string) string {
	var b [digestKeyLen]byte
	return string(appendDigestKey(b[:0], group))
}

// appendDigestKey appends group's digest key to b.
func appendDigestKey(b []byte, group string) []byte {
	// Hashed in place: a copy of a 1,000-byte id for each key or ref was
	// a tenth of what a burst of long ids allocated. Sum256 only reads.
	sum := sha256.Sum256(unsafe.Slice(unsafe.StringData(group), len(group)))
	return base64.RawURLEncoding.AppendEncode(append(b, "h."...), sum[:])
}

// digested reports whether a group id's Key is a digest key (its full key
// is longer than MaxKeyLen), without building the full key.
func digested(group string) bool {
	n := len(group)
	switch {
	case n+2 > MaxKeyLen:
		return true // even "r." + id is too long
	case 2+base64.RawURLEncoding.EncodedLen(n) <= MaxKeyLen:
		return false // even "b." + base64(id) fits
	}
	return !isPlain(group)
}

// refMark starts the Ref of a group with a digest key. No group id starts
// with it: it is not valid UTF-8.
const refMark = "\xff"

// Ref returns the name the binding cache knows a group by: the id itself
// when its Key is its full key (ids of up to 62 plain characters), else
// "\xff" and its digest key, 46 bytes whatever the id's length. The cache
// keeps no long id in memory: it is keyed by refs, notifies refs
// (CacheConfig.Notify), and takes a ref wherever it takes a group. The
// ungrouped routing binding's ref is "". Refs are injective on valid ids
// as digest keys are (a group with a full key never has a ref starting
// with "\xff").
func Ref(group string) string {
	if !digested(group) || ValidateGroupID(group) != nil {
		return group
	}
	var b [len(refMark) + digestKeyLen]byte
	return string(appendDigestKey(append(b[:0], refMark...), group))
}

// IsRef reports whether s is the Ref of a group with a digest key (and so
// not a group id).
func IsRef(s string) bool { return strings.HasPrefix(s, refMark) }

// refOfKey returns the Ref of the group whose record stands under a digest
// key.
func refOfKey(key string) string { return refMark + key }

// RefOfKey returns the Ref of the group whose Key is key: the id of a full
// key, the digest key's ref for a digest key. It inverts Key on refs.
func RefOfKey(key string) (string, error) {
	if strings.HasPrefix(key, "h.") {
		if len(key) != digestKeyLen {
			return "", fmt.Errorf("%w: not a digest key: %q", ErrInvalidGroupID, key)
		}
		return refOfKey(key), nil
	}
	return GroupFromKey(key)
}

// IsDigestKey reports whether key has the form of a digest key.
func IsDigestKey(key string) bool {
	if len(key) != digestKeyLen || !strings.HasPrefix(key, "h.") {
		return false
	}
	_, err := base64.RawURLEncoding.Strict().DecodeString(key[2:])
	return err == nil
}

// KeyHolds reports whether a record of group may stand under key: key is
// the group's Key, or its legacy full key.
func KeyHolds(key, group string) bool {
	if group == "" {
		return key == UngroupedKey
	}
	if ValidateGroupID(group) != nil {
		return false
	}
	if digested(group) && IsDigestKey(key) {
		return key == digestKey(group)
	}
	full, _ := FullKey(group)
	return key == full
}

// GroupFromKey returns the group id a full key (FullKey: "r." or "b.", of
// any length) stands for. A digest key names no group: for one it returns
// an error wrapping ErrDigestKey (the group is in the record). Anything
// else is an error wrapping ErrInvalidKey.
func GroupFromKey(key string) (string, error) {
	switch {
	case strings.HasPrefix(key, "r."):
		id := key[2:]
		if id == "" || !isPlain(id) || len(id) > MaxGroupIDLen {
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
	case IsDigestKey(key):
		return "", fmt.Errorf("%w: %q", ErrDigestKey, key)
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
