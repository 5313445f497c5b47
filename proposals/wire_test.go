package proposals

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"grouprouter/internal/natstest"
	"grouprouter/kvbinding"
)

func TestRequestRoundTrip(t *testing.T) {
	req := Request{Proposer: "n1", Proposals: []Proposal{
		{Group: "order:42", Node: "n2", FromSeq: 17},
		{Group: "Zürich ✓ a.b > *", Node: "n0", FromSeq: 18},
		{Group: "", Node: "n1", FromSeq: 19},
	}}
	data, err := EncodeRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRequest(data)
	if err != nil {
		t.Fatal(err)
	}
	if got.Proposer != "n1" || len(got.Proposals) != 3 || got.Proposals[1] != req.Proposals[1] {
		t.Fatalf("round trip = %+v", got)
	}
}

func TestDecodeRequestRejects(t *testing.T) {
	tests := map[string]string{
		"not json":      `{`,
		"wrong version": `{"v":1,"proposer":"n1","proposals":[{"group":"g","node":"n1","from_seq":1}]}`,
		"no proposer":   `{"v":2,"proposals":[{"group":"g","node":"n1","from_seq":1}]}`,
		"bad proposer":  `{"v":2,"proposer":"n 1","proposals":[{"group":"g","node":"n1","from_seq":1}]}`,
		"no proposals":  `{"v":2,"proposer":"n1","proposals":[]}`,
		"too many":      `{"v":2,"proposer":"n1","proposals":[` + strings.Repeat(`{"group":"g","node":"n1","from_seq":1},`, MaxProposalsPerRequest) + `{"group":"g","node":"n1","from_seq":1}]}`,
		"wrong types":   `{"v":"1","proposer":"n1"}`,
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodeRequest([]byte(in)); !errors.Is(err, ErrBadMessage) {
				t.Errorf("DecodeRequest error = %v, want ErrBadMessage", err)
			}
		})
	}
}

func TestEncodeRequestValidatesProposals(t *testing.T) {
	for name, p := range map[string]Proposal{
		"bad node":   {Group: "g", Node: "a.b", FromSeq: 1},
		"zero seq":   {Group: "g", Node: "n1"},
		"long group": {Group: strings.Repeat("x", kvbinding.MaxGroupIDLen+1), Node: "n1", FromSeq: 1},
		"bad utf8":   {Group: "\xff", Node: "n1", FromSeq: 1},
	} {
		if _, err := EncodeRequest(Request{Proposer: "n1", Proposals: []Proposal{p}}); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: EncodeRequest error = %v, want ErrBadMessage", name, err)
		}
	}
}

func TestDecodeReplyChecksEveryDecision(t *testing.T) {
	req := Request{Proposer: "n1", Proposals: []Proposal{{Group: "g", Node: "n1", FromSeq: 1}}}
	b := kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n1", FromSeq: 1}
	good := Reply{Version: ProtocolVersion, Decisions: []Decision{{Group: "g", Outcome: Accepted, Binding: &b, Revision: 3}}}
	data, _ := json.Marshal(good)
	r, err := DecodeReply(data, req)
	if err != nil || r.Decisions[0].Binding.Revision != 3 {
		t.Fatalf("good reply: %+v, %v", r, err)
	}
	other := b
	other.Group = "h"
	bad := map[string]Reply{
		"count":                    {Version: ProtocolVersion},
		"wrong group":              {Version: ProtocolVersion, Decisions: []Decision{{Group: "h", Outcome: Accepted, Binding: &b, Revision: 3}}},
		"binding missing":          {Version: ProtocolVersion, Decisions: []Decision{{Group: "g", Outcome: Accepted, Revision: 3}}},
		"binding of another group": {Version: ProtocolVersion, Decisions: []Decision{{Group: "g", Outcome: Rejected, Binding: &other, Revision: 3}}},
		"no revision":              {Version: ProtocolVersion, Decisions: []Decision{{Group: "g", Outcome: Accepted, Binding: &b}}},
		"unknown outcome":          {Version: ProtocolVersion, Decisions: []Decision{{Group: "g", Outcome: "maybe"}}},
		"version":                  {Version: 9, Decisions: good.Decisions},
	}
	for name, rep := range bad {
		data, _ := json.Marshal(rep)
		if _, err := DecodeReply(data, req); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: error = %v, want ErrBadMessage", name, err)
		}
	}
	data, _ = json.Marshal(Reply{Version: ProtocolVersion, Error: "boom"})
	if _, err := DecodeReply(data, req); !errors.Is(err, ErrHandlerFailed) {
		t.Errorf("handler error: %v, want ErrHandlerFailed", err)
	}
}

// FuzzDecodeRequest: decoding arbitrary bytes never panics, and whatever
// decodes re-encodes (after dropping invalid proposals) and decodes again
// to the same request.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"v":2,"proposer":"n1","proposals":[{"group":"g","node":"n1","from_seq":1}]}`))
	f.Add([]byte(`{"v":2,"proposer":"n1","proposals":[{"group":"\u00ff.*>","node":"n-_1","from_seq":18446744073709551615}]}`))
	f.Add([]byte(`{"v":2,"proposer":"","proposals":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		// The reflection-free path agrees with encoding/json on whatever
		// it accepts.
		if fast, ok := scanRequest(data); ok {
			var slow Request
			if err := json.Unmarshal(data, &slow); err != nil {
				t.Fatalf("fast path accepted %q, encoding/json: %v", data, err)
			}
			if !reflect.DeepEqual(fast, slow) && !(len(fast.Proposals) == 0 && len(slow.Proposals) == 0) {
				t.Fatalf("fast %+v != encoding/json %+v", fast, slow)
			}
		}
		req, err := DecodeRequest(data)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			return
		}
		var valid []Proposal
		for _, p := range req.Proposals {
			if p.Validate() == nil {
				valid = append(valid, p)
			}
		}
		if len(valid) == 0 {
			return
		}
		req.Proposals = valid
		enc, err := EncodeRequest(req)
		if err != nil {
			t.Fatalf("re-encode of valid proposals: %v", err)
		}
		again, err := DecodeRequest(enc)
		if err != nil || len(again.Proposals) != len(valid) {
			t.Fatalf("decode of re-encoded: %v", err)
		}
		for i := range valid {
			if again.Proposals[i] != valid[i] {
				t.Fatalf("proposal %d changed: %+v -> %+v", i, valid[i], again.Proposals[i])
			}
		}
	})
}

// FuzzDecodeReply: arbitrary replies never panic, and an accepted reply
// always carries a valid binding for the proposed group.
func FuzzDecodeReply(f *testing.F) {
	f.Add([]byte(`{"v":2,"decisions":[{"group":"g","outcome":"accepted","binding":{"group":"g","state":"bound","node":"n1","from_seq":1},"revision":3}]}`))
	f.Add([]byte(`{"v":2,"error":"x"}`))
	f.Add([]byte(`{"v":2,"handler":"h","decided_at":"2026-11-30T07:00:00.5Z","decisions":[{"group":"g","outcome":"accepted","revision":3}]}`))
	f.Add([]byte(`{"v":2,"handler":"h","decisions":[{"group":"g","outcome":"rejected","binding":{"group":"g","state":"bound","node":"n2","from_seq":1,"decided_at":"2026-11-30T07:00:00Z","decided_by":"h","drain":["n1"]},"revision":3}]}`))
	req := Request{Proposer: "n1", Proposals: []Proposal{{Group: "g", Node: "n1", FromSeq: 1}}}
	f.Fuzz(func(t *testing.T, data []byte) {
		// The reflection-free path agrees with encoding/json on whatever
		// it accepts.
		if fast, ok := scanReply(data, 1); ok {
			slow, err := decodeReplySlow(data)
			if err != nil {
				t.Fatalf("fast path accepted %q, encoding/json: %v", data, err)
			}
			fj, _ := json.Marshal(fast)
			sj, _ := json.Marshal(slow)
			if string(fj) != string(sj) {
				t.Fatalf("fast %s != encoding/json %s", fj, sj)
			}
		}
		r, err := DecodeReply(data, req)
		if err != nil {
			return
		}
		d := r.Decisions[0]
		if d.Outcome != Failed && (d.Binding == nil || d.Binding.Group != "g" || d.Binding.Validate() != nil) {
			t.Fatalf("accepted a bad decision: %+v", d)
		}
	})
}

func TestEncodeReplyRoundTrip(t *testing.T) {
	req := Request{Proposer: "n1", Proposals: []Proposal{{Group: "a\"b\\c ✓ <>&", Node: "n1", FromSeq: 1}, {Group: "g2", Node: "n2", FromSeq: 2}}}
	b := kvbinding.Binding{Group: req.Proposals[0].Group, State: kvbinding.StateBound, Node: "n1", FromSeq: 1, Reason: "tab\there", DecidedBy: "h/n0"}
	in := Reply{Handler: "h/\"n0\"", Decisions: []Decision{
		{Group: b.Group, Outcome: Accepted, Binding: &b, Revision: 9},
		{Group: "g2", Outcome: Failed, Error: "no eligible node\n"},
	}}
	data, err := EncodeReply(in, req)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(data) {
		t.Fatalf("invalid JSON: %s", data)
	}
	out, err := DecodeReply(data, req)
	if err != nil {
		t.Fatal(err)
	}
	if out.Handler != in.Handler || out.Decisions[1].Error != in.Decisions[1].Error || out.Decisions[0].Binding.Reason != b.Reason ||
		out.Decisions[0].Binding.Group != b.Group || out.Decisions[0].Binding.Revision != 9 {
		t.Fatalf("round trip: %+v", out)
	}
}

// TestCompactReply: a binding accepted exactly as proposed travels as its
// revision only and is rebuilt equal; any other binding travels whole.
func TestCompactReply(t *testing.T) {
	at := time.Date(2026, 11, 30, 7, 0, 0, 123456789, time.UTC)
	req := Request{Proposer: "n1", Proposals: []Proposal{
		{Group: "plain", Node: "n1", FromSeq: 5},
		{Group: "redirected", Node: "n1", FromSeq: 6},
		{Group: "reason", Node: "n2", FromSeq: 7},
		{Group: "failed", Node: "n2", FromSeq: 8},
	}}
	plain := rebuild(req.Proposals[0], "n1", "h/n0", at)
	redirected := rebuild(req.Proposals[1], "n1", "h/n0", at)
	redirected.Node = "n2"
	reason := rebuild(req.Proposals[2], "n1", "h/n0", at)
	reason.Reason = "node n3 has no consumer"
	in := Reply{Handler: "h/n0", Decisions: []Decision{
		{Group: "plain", Outcome: Accepted, Binding: &plain, Revision: 11},
		{Group: "redirected", Outcome: Rejected, Binding: &redirected, Revision: 12},
		{Group: "reason", Outcome: Accepted, Binding: &reason, Revision: 13},
		{Group: "failed", Outcome: Failed, Error: "timeout"},
	}}
	data, err := EncodeReply(in, req)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), `"binding":`); n != 2 {
		t.Errorf("%d bindings on the wire, want 2 (all but the plain acceptance): %s", n, data)
	}
	for _, decode := range []func() (Reply, error){
		func() (Reply, error) { return DecodeReply(data, req) },
		func() (Reply, error) { // the encoding/json path gives the same
			r, err := decodeReplySlow(data)
			if err != nil {
				return r, err
			}
			return checkReply(r, req)
		},
	} {
		out, err := decode()
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []*kvbinding.Binding{&plain, &redirected, &reason, nil} {
			got := out.Decisions[i].Binding
			if want == nil {
				if got != nil {
					t.Errorf("decision %d: binding %+v, want none", i, got)
				}
				continue
			}
			w := *want
			w.Revision = in.Decisions[i].Revision
			if got == nil || !got.DecidedAt.Equal(w.DecidedAt) {
				t.Fatalf("decision %d: binding %+v, want %+v", i, got, w)
			}
			g := *got
			g.DecidedAt = w.DecidedAt
			if !reflect.DeepEqual(g, w) {
				t.Errorf("decision %d: binding %+v, want %+v", i, g, w)
			}
		}
	}
	// A reply without decided_at cannot leave a binding out.
	bare := strings.Replace(string(data), `"decided_at":"2026-11-30T07:00:00.123456789Z",`, "", 1)
	if _, err := DecodeReply([]byte(bare), req); !errors.Is(err, ErrBadMessage) {
		t.Errorf("reply without decided_at: %v, want ErrBadMessage", err)
	}
}

// FuzzEventJSON: Event.AppendJSON writes what encoding/json writes (HTML
// escaping aside).
func FuzzEventJSON(f *testing.F) {
	f.Add("0190b5c4-7e3a-7cc1-9f6e-2d3b4a5c6d7e", "bind", "g", "n1", "", uint64(3), "h/n0", "", 0, 0, int64(1_796_000_000_123_456_789))
	f.Add("", "move", "a\"b<>", "n2", "n1", uint64(0), "h", "node n1 gone\n", 2, 7, int64(0))
	f.Add("\u2028<id>", "timeout", "\xff", "", "", uint64(1), "n1", "x", -1, -3, int64(-1))
	f.Fuzz(func(t *testing.T, id, kind, group, node, prev string, seq uint64, by, reason string, attempt, count int, at int64) {
		e := Event{ID: id, Kind: kind, Group: group, Node: node, PrevNode: prev, FromSeq: seq, By: by,
			At: time.Unix(0, at).UTC(), Reason: reason, Attempt: attempt, Count: count}
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(e); err != nil {
			return // a time encoding/json refuses (year outside 0-9999)
		}
		if got := e.AppendJSON(nil); string(got) != strings.TrimSuffix(want.String(), "\n") {
			t.Fatalf("AppendJSON = %s\nencoding/json %s", got, want.String())
		}
	})
}

func TestNewEventID(t *testing.T) {
	seen := make(map[string]bool)
	var prev uuid.UUID
	for i := 0; i < 1000; i++ {
		s := NewEventID()
		id, err := uuid.Parse(s)
		if err != nil {
			t.Fatalf("id %q: %v", s, err)
		}
		if id.Version() != 7 || id.Variant() != uuid.RFC4122 || id.String() != s {
			t.Fatalf("id %q: version %d, variant %v", s, id.Version(), id.Variant())
		}
		if seen[s] {
			t.Fatalf("id %q twice", s)
		}
		seen[s] = true
		// Version 7 ids of one process sort by creation (the library
		// orders ids made within one millisecond too).
		if i > 0 && bytes.Compare(prev[:], id[:]) >= 0 {
			t.Fatalf("id %s not after %s", id, prev)
		}
		prev = id
	}
}

func TestEventPublishSetsID(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := srv.Connect()
	sub, err := nc.SubscribeSync(SubjectEventsPrefix + ">")
	if err != nil {
		t.Fatal(err)
	}
	Event{Kind: EventBind, Group: "g", Node: "n1", By: "h/n0"}.Publish(nc)
	Event{Kind: EventBind, Group: "g", Node: "n1", By: "h/n0", ID: "given"}.Publish(nc)
	var ids []string
	for range 2 {
		msg, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var e Event
		if err := json.Unmarshal(msg.Data, &e); err != nil {
			t.Fatalf("%v in %s", err, msg.Data)
		}
		if e.At.IsZero() || e.Kind != EventBind || msg.Subject != SubjectEventsPrefix+EventBind {
			t.Errorf("event %s on %s", msg.Data, msg.Subject)
		}
		ids = append(ids, e.ID)
	}
	if id, err := uuid.Parse(ids[0]); err != nil || id.Version() != 7 {
		t.Errorf("id %q not a UUIDv7 (%v)", ids[0], err)
	}
	if ids[1] != "given" {
		t.Errorf("id %q, want the event's own", ids[1])
	}
}
