package proposals

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

func TestRequestRoundTrip(t *testing.T) {
	req := Request{Proposer: "n1", Proposals: []Proposal{
		{Group: "order:42", Node: "n2", Seq: 17},
		{Group: "Zürich ✓ a.b > *", Node: "n0", Seq: 18},
		{Group: "", Node: "n1", Seq: 19},
		{Op: OpFence, Group: "g", Seq: 40, Rev: 12},
		{Op: OpRelease, Group: "h", Seq: 41, Rev: 13, Kind: EventClose, Reason: "closed \"x\""},
		{Op: OpDeadLetter, Group: "d", Seq: 42, Reason: "no decision", Count: 3},
		{Op: OpCaughtUp, Group: "c", Rev: 9, Count: 7},
	}}
	data, err := EncodeRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRequest(data)
	if err != nil {
		t.Fatal(err)
	}
	if got.Proposer != "n1" || !reflect.DeepEqual(got.Proposals, req.Proposals) {
		t.Fatalf("round trip = %+v", got)
	}
	var slow Request
	if err := json.Unmarshal(data, &slow); err != nil || !reflect.DeepEqual(slow.Proposals, req.Proposals) {
		t.Fatalf("encoding/json reads %s as %+v, %v", data, slow, err)
	}
}

func TestDecodeRequestRejects(t *testing.T) {
	tests := map[string]string{
		"not json":      `{`,
		"wrong version": `{"v":2,"proposer":"n1","proposals":[{"group":"g","node":"n1","seq":1}]}`,
		"no proposer":   `{"v":3,"proposals":[{"group":"g","node":"n1","seq":1}]}`,
		"bad proposer":  `{"v":3,"proposer":"n 1","proposals":[{"group":"g","node":"n1","seq":1}]}`,
		"no proposals":  `{"v":3,"proposer":"n1","proposals":[]}`,
		"too many":      `{"v":3,"proposer":"n1","proposals":[` + strings.Repeat(`{"group":"g","node":"n1","seq":1},`, MaxProposalsPerRequest) + `{"group":"g","node":"n1","seq":1}]}`,
		"wrong types":   `{"v":"1","proposer":"n1"}`,
		"oversized":     `{"v":3,"proposer":"n1","proposals":[{"group":"` + strings.Repeat("x", MaxRequestBytes) + `"}]}`,
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
		"bad node":          {Group: "g", Node: "a.b", Seq: 1},
		"zero seq":          {Group: "g", Node: "n1"},
		"long group":        {Group: strings.Repeat("x", kvbinding.MaxGroupIDLen+1), Node: "n1", Seq: 1},
		"bad utf8":          {Group: "\xff", Node: "n1", Seq: 1},
		"fence without rev": {Op: OpFence, Group: "g", Seq: 3},
		"step with a node":  {Op: OpDrained, Group: "g", Node: "n1", Rev: 3},
		"operator op":       {Op: OpMove, Group: "g", Node: "n1"},
		"unknown op":        {Op: "explode", Group: "g"},
		"long reason":       {Op: OpDeadLetter, Group: "g", Seq: 1, Reason: strings.Repeat("r", 600)},
	} {
		if _, err := EncodeRequest(Request{Proposer: "n1", Proposals: []Proposal{p}}); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: EncodeRequest error = %v, want ErrBadMessage", name, err)
		}
	}
}

func TestDecodeReplyChecksEveryDecision(t *testing.T) {
	req := Request{Proposer: "n1", Proposals: []Proposal{{Group: "g", Node: "n1", Seq: 1}}}
	good := Reply{Version: ProtocolVersion, Decisions: []Decision{{Group: "g", Outcome: Accepted, Revision: 3}}}
	data, _ := json.Marshal(good)
	r, err := DecodeReply(data, req)
	if err != nil || r.Decisions[0].Revision != 3 {
		t.Fatalf("good reply: %+v, %v", r, err)
	}
	bad := map[string]Reply{
		"count":           {Version: ProtocolVersion},
		"wrong group":     {Version: ProtocolVersion, Decisions: []Decision{{Group: "h", Outcome: Accepted, Revision: 3}}},
		"no revision":     {Version: ProtocolVersion, Decisions: []Decision{{Group: "g", Outcome: Accepted}}},
		"rejected bare":   {Version: ProtocolVersion, Decisions: []Decision{{Group: "g", Outcome: Rejected}}},
		"unknown outcome": {Version: ProtocolVersion, Decisions: []Decision{{Group: "g", Outcome: "maybe"}}},
		"version":         {Version: 9, Decisions: good.Decisions},
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

// FuzzDecodeRequest: decoding arbitrary bytes never panics, the
// reflection-free path agrees with encoding/json, and whatever decodes
// re-encodes (after dropping invalid proposals) and decodes again to the
// same request.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"v":3,"proposer":"n1","proposals":[{"group":"g","node":"n1","seq":1}]}`))
	f.Add([]byte(`{"v":3,"proposer":"n1","proposals":[{"group":"\u00ff.*>","node":"n-_1","seq":18446744073709551615}]}`))
	f.Add([]byte(`{"v":3,"proposer":"n1","proposals":[{"op":"fence","group":"g","seq":4,"rev":9},{"op":"release","group":"h","seq":5,"rev":2,"kind":"close","reason":"x"}]}`))
	f.Add([]byte(`{"v":3,"proposer":"n1","proposals":[{"op":"fence","group":"g","seq":4,"rev":9,"clean":true}]}`))
	f.Add([]byte(`{"v":3,"proposer":"","proposals":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
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
		if err != nil || !reflect.DeepEqual(again.Proposals, valid) {
			t.Fatalf("decode of re-encoded: %+v, %v", again.Proposals, err)
		}
	})
}

// FuzzDecodeReply: arbitrary replies never panic, the reflection-free path
// agrees with encoding/json, and a decoded reply answers the group asked
// with a revision whenever a record stands.
func FuzzDecodeReply(f *testing.F) {
	f.Add([]byte(`{"v":3,"handler":"h","decisions":[{"group":"g","outcome":"accepted","revision":3}]}`))
	f.Add([]byte(`{"v":3,"error":"x"}`))
	f.Add([]byte(`{"v":3,"handler":"h","decisions":[{"group":"g","outcome":"refused","error":"stale"}]}`))
	f.Add([]byte(`{"v":3,"handler":"h","decisions":[{"group":"g","outcome":"refused","error":"below","floor":12}]}`))
	req := Request{Proposer: "n1", Proposals: []Proposal{{Group: "g", Node: "n1", Seq: 1}}}
	f.Fuzz(func(t *testing.T, data []byte) {
		if fast, ok := scanReply(data, 1); ok {
			var slow Reply
			if err := json.Unmarshal(data, &slow); err != nil {
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
		if d.Group != "g" || ((d.Outcome == Accepted || d.Outcome == Rejected) && d.Revision == 0) {
			t.Fatalf("accepted a bad decision: %+v", d)
		}
	})
}

func TestEncodeReplyRoundTrip(t *testing.T) {
	req := Request{Proposer: "n1", Proposals: []Proposal{{Group: "a\"b\\c ✓ <>&", Node: "n1", Seq: 1}, {Group: "g2", Node: "n2", Seq: 2},
		{Group: "g3", Node: "n2", Seq: 3}, {Group: "g4", Node: "n2", Seq: 4}}}
	in := Reply{Handler: "h/\"n0\"", Decisions: []Decision{
		{Group: req.Proposals[0].Group, Outcome: Accepted, Revision: 9},
		{Group: "g2", Outcome: Failed, Error: "no eligible node\n"},
		{Group: "g3", Outcome: Refused, Error: "below the floor", Floor: 17},
		{Group: "g4", Outcome: Refused, Error: "at the limit", Limit: 1000000},
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
	in.Version = ProtocolVersion
	if !reflect.DeepEqual(out, in) {
		t.Fatalf("round trip: %+v, want %+v", out, in)
	}
}

func TestProposerOf(t *testing.T) {
	for subject, want := range map[string]string{
		"grouping.propose.n1":   "n1",
		"grouping.propose.a-_9": "a-_9",
		"grouping.propose.":     "",
		"grouping.propose.a.b":  "",
		"grouping.propose":      "",
		"grouping.admin":        "",
		"grouping.propose.*":    "",
	} {
		got, ok := ProposerOf(subject)
		if got != want || ok != (want != "") {
			t.Errorf("ProposerOf(%q) = %q, %v; want %q", subject, got, ok, want)
		}
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

// FuzzProposalEncodedLen: EncodedLen is the length appendJSON writes, for
// any proposal (escapes, long ids, every optional field).
func FuzzProposalEncodedLen(f *testing.F) {
	f.Add("", "order-1", "n1", uint64(1), uint64(0), uint64(0), "", "", 0, false)
	f.Add("fence", "ü\"\\\n\x00\xff\u2028", "", uint64(0), uint64(3), uint64(18446744073709551615), "expire", "a \"reason\"", -12, true)
	f.Add("deadletter", strings.Repeat("x", 1024), "", uint64(99), uint64(10), uint64(0), "", "no decision", 7, false)
	f.Fuzz(func(t *testing.T, op, group, node string, seq, first, rev uint64, kind, reason string, count int, clean bool) {
		p := Proposal{Op: Op(op), Group: group, Node: node, Seq: seq, First: first, Rev: rev, Kind: kind, Reason: reason, Count: count, Clean: clean}
		if got, want := p.EncodedLen(), len(p.appendJSON(nil)); got != want {
			t.Fatalf("EncodedLen(%+v) = %d, appendJSON wrote %d", p, got, want)
		}
	})
}

// TestWireVersions: a request of the next release's version, with a field
// this release does not know, is read (a rolling upgrade); one two
// versions ahead, or older than the oldest read, is refused.
func TestWireVersions(t *testing.T) {
	data, err := EncodeRequest(Request{Proposer: "n1", Proposals: []Proposal{{Group: "g", Node: "n1", Seq: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	cur := `{"v":` + strconv.Itoa(ProtocolVersion) + `,`
	if !strings.HasPrefix(string(data), cur) {
		t.Fatalf("request %s does not start with %s", data, cur)
	}
	for _, tc := range []struct {
		v     int
		extra string
		ok    bool
	}{
		{ProtocolVersion, "", true},
		{ProtocolVersion + 1, `"later":{"x":1},`, true},
		{ProtocolVersion + 2, "", false},
		{MinProtocolVersion - 1, "", false},
	} {
		msg := strings.Replace(string(data), cur, `{"v":`+strconv.Itoa(tc.v)+`,`+tc.extra, 1)
		req, err := DecodeRequest([]byte(msg))
		if (err == nil) != tc.ok {
			t.Errorf("version %d: DecodeRequest(%s) = %v, want ok %v", tc.v, msg, err, tc.ok)
		}
		if err == nil && (len(req.Proposals) != 1 || req.Proposals[0].Group != "g") {
			t.Errorf("version %d: decoded %+v", tc.v, req)
		}
	}
}
