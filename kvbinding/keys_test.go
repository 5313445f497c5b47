package kvbinding

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

var validKey = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

func checkKVKey(t *testing.T, key string) {
	t.Helper()
	if !validKey.MatchString(key) || strings.HasPrefix(key, ".") || strings.HasSuffix(key, ".") || strings.Contains(key, "..") {
		t.Fatalf("key %q is not a valid KV key", key)
	}
}

func TestKeyRoundTrip(t *testing.T) {
	tests := []struct {
		name, id, key string // key "" = any encoded key
	}{
		{"plain", "order-42", "r.order-42"},
		{"underscore and equals", "a_b=c", "r.a_b=c"},
		{"dot", "a.b.c", ""},
		{"star", "a*b", ""},
		{"gt", ">", ""},
		{"space", "order 42", ""},
		{"slash", "a/b", ""},
		{"colon", "order:42", ""},
		{"non-ascii", "Zürich ✓", ""},
		{"cjk", "日本", ""},
		{"looks like a key", "r.x", ""},
		{"looks encoded", "b.x", ""},
		{"reserved word", "ungrouped", "r.ungrouped"},
		{"max length", strings.Repeat("x", MaxGroupIDLen), ""},
		{"max length odd", strings.Repeat("é", MaxGroupIDLen/2), ""},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key, err := Key(tt.id)
			if err != nil {
				t.Fatalf("Key(%q): %v", tt.id, err)
			}
			if tt.key != "" && key != tt.key {
				t.Errorf("Key(%q) = %q, want %q", tt.id, key, tt.key)
			}
			checkKVKey(t, key)
			if key == UngroupedKey {
				t.Errorf("Key(%q) collides with the reserved key", tt.id)
			}
			if other, ok := seen[key]; ok {
				t.Errorf("ids %q and %q share key %q", other, tt.id, key)
			}
			seen[key] = tt.id
			checkKey(t, tt.id, key)
		})
	}
}

// checkKey checks the properties of key = Key(id): at most MaxKeyLen bytes;
// the full key when that is short enough (GroupFromKey inverts it), else a
// digest key (GroupFromKey says so); KeyHolds accepts it and the full key.
func checkKey(t *testing.T, id, key string) {
	t.Helper()
	if len(key) > MaxKeyLen {
		t.Fatalf("Key(%q) = %q: %d bytes, over MaxKeyLen", id, key, len(key))
	}
	full, err := FullKey(id)
	if err != nil {
		t.Fatalf("FullKey(%q): %v", id, err)
	}
	checkKVKey(t, full)
	if back, err := GroupFromKey(full); err != nil || back != id {
		t.Fatalf("GroupFromKey(FullKey(%q)) = %q, %v", id, back, err)
	}
	legacy, long := LegacyKey(id)
	switch {
	case len(full) <= MaxKeyLen:
		if key != full || long {
			t.Fatalf("Key(%q) = %q, LegacyKey %q %v; want the full key %q, no legacy key", id, key, legacy, long, full)
		}
	default:
		if !IsDigestKey(key) || !long || legacy != full {
			t.Fatalf("Key(%q) = %q, LegacyKey %q %v; want a digest key and the legacy key %q", id, key, legacy, long, full)
		}
		if _, err := GroupFromKey(key); !errors.Is(err, ErrDigestKey) {
			t.Fatalf("GroupFromKey(%q) error = %v, want ErrDigestKey", key, err)
		}
	}
	if !KeyHolds(key, id) || !KeyHolds(full, id) {
		t.Fatalf("KeyHolds refuses %q or %q for %q", key, full, id)
	}
	if KeyHolds(key, id+"x") && len(id) < MaxGroupIDLen {
		t.Fatalf("KeyHolds(%q) accepts another id", key)
	}
}

// TestKeyBound: the ids whose full key fits in MaxKeyLen keep it (buckets
// of short ids are unchanged); one byte more and the key is a digest.
func TestKeyBound(t *testing.T) {
	for _, tt := range []struct {
		name   string
		id     string
		digest bool
	}{
		{"plain, 62 bytes", strings.Repeat("p", 62), false},
		{"plain, 63 bytes", strings.Repeat("p", 63), true},
		{"encoded, 46 bytes", strings.Repeat(":", 46), false}, // b. + 62
		{"encoded, 47 bytes", strings.Repeat(":", 47), true},
		{"1000 bytes", strings.Repeat("x", 1000), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key, err := Key(tt.id)
			if err != nil {
				t.Fatal(err)
			}
			if IsDigestKey(key) != tt.digest {
				t.Fatalf("Key(%d bytes) = %q, digest %v, want %v", len(tt.id), key, IsDigestKey(key), tt.digest)
			}
			checkKVKey(t, key)
			checkKey(t, tt.id, key)
		})
	}
}

func TestKeyRejectsInvalidIDs(t *testing.T) {
	for name, id := range map[string]string{
		"empty":    "",
		"too long": strings.Repeat("x", MaxGroupIDLen+1),
		"bad utf8": "a\xffb",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Key(id); !errors.Is(err, ErrInvalidGroupID) {
				t.Errorf("Key(%q) error = %v, want ErrInvalidGroupID", id, err)
			}
		})
	}
}

func TestGroupFromKeyRejectsForeignKeys(t *testing.T) {
	for _, key := range []string{"", "x", "r.", "b.", "r.a.b", "b.!!", "b.b3JkZXItNDI", UngroupedKey, "q.abc", "h.", "h.abc", "h." + strings.Repeat("A", 44)} {
		if id, err := GroupFromKey(key); err == nil {
			t.Errorf("GroupFromKey(%q) = %q, want an error", key, id)
		}
	}
}

// FuzzKey checks that every valid group id maps to a valid, unique key that
// decodes back to the id, and that no key decodes to something Key would not
// produce.
func FuzzKey(f *testing.F) {
	for _, s := range []string{"a", "a.b", "order:42", "Zürich ✓", " ", "r.x", "b.x", "==", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		key, err := Key(id)
		valid := len(id) >= 1 && len(id) <= MaxGroupIDLen && utf8.ValidString(id)
		if (err == nil) != valid {
			t.Fatalf("Key(%q) error = %v, valid = %v", id, err, valid)
		}
		if err == nil {
			checkKVKey(t, key)
			checkKey(t, id, key)
		}
		// Any string that decodes as a key must be FullKey's output for
		// its id, and no other group's record may stand under it.
		if g, err := GroupFromKey(id); err == nil {
			if k, _ := FullKey(g); k != id {
				t.Fatalf("GroupFromKey(%q) = %q but FullKey(%q) = %q", id, g, g, k)
			}
		}
		if IsDigestKey(id) {
			if _, err := GroupFromKey(id); !errors.Is(err, ErrDigestKey) {
				t.Fatalf("GroupFromKey(%q) error = %v, want ErrDigestKey", id, err)
			}
		}
	})
}
