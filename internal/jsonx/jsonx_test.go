package jsonx

import (
	"bytes"
	"encoding/json"
	"testing"
)

// marshalNoHTML is encoding/json's encoding of v without HTML escaping.
func marshalNoHTML(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// FuzzAppendString: AppendString writes what encoding/json writes (HTML
// characters aside), for any string, valid UTF-8 or not.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", `q"b\s`, "tab\tnl\n\x00\x1f", "Zürich ✓ <>&", "\xff\xfe", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := AppendString(nil, s)
		if want := marshalNoHTML(t, s); !bytes.Equal(got, want) {
			t.Fatalf("AppendString(%q) = %s, encoding/json %s", s, got, want)
		}
		if n := StringLen(s); n != len(got) {
			t.Fatalf("StringLen(%q) = %d, AppendString wrote %d bytes", s, n, len(got))
		}
	})
}

// FuzzScanner: Raw never panics, and what it accepts is one valid JSON
// value whose strings and numbers encoding/json reads the same way.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[true,false,"x"],"c":{"d":"é"}}`, `[]`, `"s"`, `12`, `01`, `1.5`, `{"a":"\u0041"}`, `[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]`, `"\xff"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d := Scanner{Data: data}
		raw, ok := d.Raw()
		if !ok {
			return
		}
		if !json.Valid(raw) {
			t.Fatalf("Raw accepted invalid JSON %q", raw)
		}
		d = Scanner{Data: raw}
		switch raw[0] {
		case '"':
			s, ok := d.Str()
			var want string
			if err := json.Unmarshal(raw, &want); err != nil || !ok || s != want {
				t.Fatalf("Str(%q) = %q, %v; encoding/json %q, %v", raw, s, ok, want, err)
			}
		case '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			n, ok := d.Uint()
			var want uint64
			if err := json.Unmarshal(raw, &want); err != nil || !ok || n != want {
				t.Fatalf("Uint(%q) = %d, %v; encoding/json %d, %v", raw, n, ok, want, err)
			}
		}
	})
}

func TestScannerRefusesWhatItDoesNotHandle(t *testing.T) {
	for _, in := range []string{`"esc\"aped"`, `"ctl` + "\x01" + `"`, "\"\xff\"", `-1`, `1.5`, `1e3`, `01`, `12345678901234567890`, `null`, `{}`} {
		d := Scanner{Data: []byte(in)}
		if _, ok := d.Raw(); ok && in != `{}` {
			t.Errorf("Raw accepted %s", in)
		}
		d = Scanner{Data: []byte(in)}
		if d.Object(func([]byte) bool { return true }) {
			t.Errorf("Object accepted %s", in)
		}
	}
}
