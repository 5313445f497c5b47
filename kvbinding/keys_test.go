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
			back, err := GroupFromKey(key)
			if err != nil || back != tt.id {
				t.Errorf("GroupFromKey(%q) = %q, %v; want %q", key, back, err, tt.id)
			}
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
	for _, key := range []string{"", "x", "r.", "b.", "r.a.b", "b.!!", "b.b3JkZXItNDI", UngroupedKey, "q.abc"} {
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
			back, err := GroupFromKey(key)
			if err != nil || back != id {
				t.Fatalf("GroupFromKey(Key(%q)) = %q, %v", id, back, err)
			}
		}
		// Any string that decodes as a key must be Key's output for its id.
		if g, err := GroupFromKey(id); err == nil {
			if k, _ := Key(g); k != id {
				t.Fatalf("GroupFromKey(%q) = %q but Key(%q) = %q", id, g, g, k)
			}
		}
	})
}
