package kvbinding

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
	"unicode/utf8"
)

func TestFastBindingMatchesJSON(t *testing.T) {
	records := []Binding{
		{Group: "order-42", State: StateBound, Node: "n1", FromSeq: 17, DecidedAt: time.Now(), DecidedBy: "h/n0", ProposedBy: "n2"},
		{Group: "Zürich ✓ a.b > *", State: StateBound, Node: "n1", FromSeq: 1, PrevNode: "n0", Step: StepDrain, Drain: []string{"n0", "n3"}, Reason: "node n0 gone"},
		{Group: "g", State: StateReleased, ThroughSeq: 99, PrevNode: "n1"},
		{Group: "g", State: StateMoving, Node: "n2", PrevNode: "n1", FromSeq: 4, Epoch: 12},
		{Group: "g", State: StateBound, Node: "n2", PrevNode: "n1", FromSeq: 4, Step: StepCatchUp, Epoch: 13},
		{Group: "g", State: StateBound, Node: "n2", PrevNode: "n1", FromSeq: 4, Step: StepDrain, Drain: []string{"n1"}, Routed: 9, Ckpt: 31},
		{Group: "", State: StateBound, Node: "n1", FromSeq: 3},
		{Group: "x", State: StateDeadLettered, ThroughSeq: 5, Reason: `quoted "reason"`},
	}
	for _, want := range records {
		data, err := want.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		got, ok := fastBinding(data)
		slow, err := UnmarshalBinding(data)
		if err != nil {
			t.Fatal(err)
		}
		if want.Reason == `quoted "reason"` {
			if ok {
				t.Errorf("escaped string accepted by the fast path: %s", data)
			}
			continue
		}
		if !ok {
			t.Errorf("fast path refused %s", data)
			continue
		}
		if got.Group != slow.Group || got.State != slow.State || got.Node != slow.Node || got.FromSeq != slow.FromSeq ||
			got.ThroughSeq != slow.ThroughSeq || got.PrevNode != slow.PrevNode || got.Step != slow.Step || got.Epoch != slow.Epoch || got.Routed != slow.Routed || got.Ckpt != slow.Ckpt || !reflect.DeepEqual(got.Drain, slow.Drain) {
			t.Errorf("fast %+v != json %+v", got, slow)
		}
	}
}

// FuzzFastBinding: whenever the fast path accepts a value, encoding/json
// accepts it too and agrees on every cached field.
func FuzzFastBinding(f *testing.F) {
	f.Add([]byte(`{"group":"g","state":"bound","node":"n1","from_seq":1,"decided_at":"2026-01-01T00:00:00Z","decided_by":"h"}`))
	f.Add([]byte(`{"group":"g","state":"released","through_seq":3,"prev_node":"n1","drain":["a","b"],"step":"drain"}`))
	f.Add([]byte(`{"group":"g","state":"bound","node":"n1","from_seq":01}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, ok := fastBinding(data)
		if !ok {
			return
		}
		var slow Binding
		if err := json.Unmarshal(data, &slow); err != nil {
			t.Fatalf("fast path accepted %q, encoding/json: %v", data, err)
		}
		if got.Group != slow.Group || got.State != slow.State || got.Node != slow.Node || got.FromSeq != slow.FromSeq ||
			got.ThroughSeq != slow.ThroughSeq || got.PrevNode != slow.PrevNode || got.Step != slow.Step || got.Epoch != slow.Epoch || got.Routed != slow.Routed || got.Ckpt != slow.Ckpt || !reflect.DeepEqual(got.Drain, slow.Drain) {
			t.Fatalf("fast %+v != json %+v for %q", got, slow, data)
		}
	})
}

// FuzzBindingJSONRoundTrip: the reflection-free encoder writes valid JSON
// that both decoders read back to the same binding.
func FuzzBindingJSONRoundTrip(f *testing.F) {
	f.Add("order-42", "n1", "reason \"q\" \n\t\x01 é ✓ <>&", uint64(7), true)
	f.Add("Zürich ✓", "", "", uint64(1), false)
	f.Fuzz(func(t *testing.T, group, prev, reason string, seq uint64, handoff bool) {
		step := StepNone
		if handoff {
			step = StepDrain
		}
		b := Binding{Group: group, State: StateBound, Node: "n1", FromSeq: seq, PrevNode: prev, Reason: reason,
			Step: step, DecidedAt: time.Unix(1700000000, 123456789).UTC(), DecidedBy: "h/n0", Drain: []string{prev}}
		data := b.AppendJSON(nil)
		if !json.Valid(data) {
			t.Fatalf("invalid JSON %q", data)
		}
		var viaJSON Binding
		if err := json.Unmarshal(data, &viaJSON); err != nil {
			t.Fatalf("encoding/json cannot read %q: %v", data, err)
		}
		viaFast, err := DecodeJSON(data)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(viaJSON, viaFast) {
			t.Fatalf("decoders disagree on %q:\n%+v\n%+v", data, viaJSON, viaFast)
		}
		if utf8.ValidString(group) && utf8.ValidString(prev) && utf8.ValidString(reason) {
			viaJSON.DecidedAt = b.DecidedAt // same instant; location pointers differ
			if !reflect.DeepEqual(viaJSON, b) {
				t.Fatalf("round trip changed the binding:\n%+v\n%+v", b, viaJSON)
			}
		}
	})
}
