package kvbinding

import (
	"errors"
	"strings"
	"testing"
)

// TestRecordsRefuseForeignJSON: a PubAck reflected onto a key, or any JSON
// that is not a router record of the key's kind, does not decode; records
// of the release before records were typed, and of the next release, do.
func TestRecordsRefuseForeignJSON(t *testing.T) {
	const puback = `{"stream":"GROUPING_INGRESS","seq":57}`
	for _, tc := range []struct {
		name, data string
		ok         bool
	}{
		{"a PubAck", puback, false},
		{"a PubAck, duplicate", `{"stream":"GROUPING_INGRESS","seq":57,"duplicate":true}`, false},
		{"not an object", `[1,2]`, false},
		{"not JSON", `next=5`, false},
		{"untyped, of the previous release", `{"next":12,"pending":[[3,4]]}`, true},
		{"untyped with a field unknown here", `{"next":12,"later":1}`, false},
		{"this release", `{"record":"checkpoint","v":1,"next":12}`, true},
		{"the next release, with a field it added", `{"record":"checkpoint","v":2,"next":12,"later":1}`, true},
		{"two releases ahead", `{"record":"checkpoint","v":3,"next":12}`, false},
		{"another kind", `{"record":"floor","v":1,"seq":12}`, false},
		{"a kind and no version", `{"record":"checkpoint","next":12}`, false},
	} {
		var c Checkpoint
		err := decodeRecord([]byte(tc.data), recordCheckpoint, &c)
		if (err == nil) != tc.ok {
			t.Errorf("%s: decodeRecord(%s) = %v, want ok %v", tc.name, tc.data, err, tc.ok)
		}
		if err != nil && !errors.Is(err, errRecord) {
			t.Errorf("%s: error %v does not wrap errRecord", tc.name, err)
		}
		if err == nil && c.Next != 12 {
			t.Errorf("%s: next %d, want 12", tc.name, c.Next)
		}
	}
}

func TestEncodeRecordIsTyped(t *testing.T) {
	data, err := encodeRecord(recordCheckpoint, &Checkpoint{Next: 7})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), `{"record":"checkpoint","v":1,`) {
		t.Errorf("encoded %s, want it to start with its kind and version", data)
	}
	var c Checkpoint
	if err := decodeRecord(data, recordCheckpoint, &c); err != nil || c.Next != 7 {
		t.Errorf("round trip: %+v, %v", c, err)
	}
	empty, err := encodeRecord(recordFloor, &struct{}{})
	if err != nil || string(empty) != `{"record":"floor","v":1}` {
		t.Errorf("empty record encoded %s, %v", empty, err)
	}
}

func TestBindingRecordsAreTyped(t *testing.T) {
	const old = `{"group":"a","state":"bound","node":"n1","from_seq":3,"decided_at":"2026-01-02T03:04:05Z","decided_by":"h"}`
	for _, tc := range []struct {
		name, data string
		ok         bool
	}{
		{"a PubAck", `{"stream":"KV_grouping-bindings","seq":9}`, false},
		{"untyped, of the previous release", old, true},
		{"untyped with a field unknown here", strings.Replace(old, `"group"`, `"later":1,"group"`, 1), false},
		{"the next release, with a field it added", strings.Replace(old, `{`, `{"record":"binding","v":2,"later":1,`, 1), true},
		{"two releases ahead", strings.Replace(old, `{`, `{"record":"binding","v":3,`, 1), false},
		{"a checkpoint", `{"record":"checkpoint","v":1,"next":12}`, false},
		{"escaped, of another kind", strings.Replace(old, `{`, `{"record":"flo\u006fr","v":1,`, 1), false},
	} {
		b, err := UnmarshalBinding([]byte(tc.data))
		if (err == nil) != tc.ok {
			t.Errorf("%s: UnmarshalBinding = %+v, %v; want ok %v", tc.name, b, err, tc.ok)
		}
		if _, fast := fastBinding([]byte(tc.data)); fast && !tc.ok {
			t.Errorf("%s: the fast decoder accepts it", tc.name)
		}
	}
	b, err := UnmarshalBinding([]byte(old))
	if err != nil {
		t.Fatal(err)
	}
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), `{"record":"binding","v":1,"group":"a"`) {
		t.Errorf("binding encoded %s, want it typed", data)
	}
	if got, ok := fastBinding(data); !ok || got.Node != "n1" {
		t.Errorf("fast decoding of %s: %+v %v", data, got, ok)
	}
}
