package proposals

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

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
		"wrong version": `{"v":2,"proposer":"n1","proposals":[{"group":"g","node":"n1","from_seq":1}]}`,
		"no proposer":   `{"v":1,"proposals":[{"group":"g","node":"n1","from_seq":1}]}`,
		"bad proposer":  `{"v":1,"proposer":"n 1","proposals":[{"group":"g","node":"n1","from_seq":1}]}`,
		"no proposals":  `{"v":1,"proposer":"n1","proposals":[]}`,
		"too many":      `{"v":1,"proposer":"n1","proposals":[` + strings.Repeat(`{"group":"g","node":"n1","from_seq":1},`, MaxProposalsPerRequest) + `{"group":"g","node":"n1","from_seq":1}]}`,
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
	good := Reply{Version: 1, Decisions: []Decision{{Group: "g", Outcome: Accepted, Binding: &b, Revision: 3}}}
	data, _ := json.Marshal(good)
	r, err := DecodeReply(data, req)
	if err != nil || r.Decisions[0].Binding.Revision != 3 {
		t.Fatalf("good reply: %+v, %v", r, err)
	}
	other := b
	other.Group = "h"
	bad := map[string]Reply{
		"count":                    {Version: 1},
		"wrong group":              {Version: 1, Decisions: []Decision{{Group: "h", Outcome: Accepted, Binding: &b, Revision: 3}}},
		"binding missing":          {Version: 1, Decisions: []Decision{{Group: "g", Outcome: Accepted, Revision: 3}}},
		"binding of another group": {Version: 1, Decisions: []Decision{{Group: "g", Outcome: Rejected, Binding: &other, Revision: 3}}},
		"no revision":              {Version: 1, Decisions: []Decision{{Group: "g", Outcome: Accepted, Binding: &b}}},
		"unknown outcome":          {Version: 1, Decisions: []Decision{{Group: "g", Outcome: "maybe"}}},
		"version":                  {Version: 9, Decisions: good.Decisions},
	}
	for name, rep := range bad {
		data, _ := json.Marshal(rep)
		if _, err := DecodeReply(data, req); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: error = %v, want ErrBadMessage", name, err)
		}
	}
	data, _ = json.Marshal(Reply{Version: 1, Error: "boom"})
	if _, err := DecodeReply(data, req); !errors.Is(err, ErrHandlerFailed) {
		t.Errorf("handler error: %v, want ErrHandlerFailed", err)
	}
}

// FuzzDecodeRequest: decoding arbitrary bytes never panics, and whatever
// decodes re-encodes (after dropping invalid proposals) and decodes again
// to the same request.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"v":1,"proposer":"n1","proposals":[{"group":"g","node":"n1","from_seq":1}]}`))
	f.Add([]byte(`{"v":1,"proposer":"n1","proposals":[{"group":"\u00ff.*>","node":"n-_1","from_seq":18446744073709551615}]}`))
	f.Add([]byte(`{"v":1,"proposer":"","proposals":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
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
	f.Add([]byte(`{"v":1,"decisions":[{"group":"g","outcome":"accepted","binding":{"group":"g","state":"bound","node":"n1","from_seq":1},"revision":3}]}`))
	f.Add([]byte(`{"v":1,"error":"x"}`))
	req := Request{Proposer: "n1", Proposals: []Proposal{{Group: "g", Node: "n1", FromSeq: 1}}}
	f.Fuzz(func(t *testing.T, data []byte) {
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
	data, err := EncodeReply(in)
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
