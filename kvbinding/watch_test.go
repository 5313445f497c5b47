package kvbinding

import "testing"

func TestTailRewound(t *testing.T) {
	read := &storedMsg{subj: "$KV.b.r.a", data: []byte(`{"v":1}`)}
	for _, tc := range []struct {
		name string
		last uint64
		at   *storedMsg
		want bool
	}{
		{"the stream ends at what was read", 10, read, false},
		{"the stream went on", 12, read, false},
		{"the stream ends below it", 9, nil, true},
		{"the stream is empty again", 0, nil, true},
		{"replaced by a newer record of its key", 12, nil, false},
		{"nothing there, the stream ends there", 10, nil, false},
		{"another key at the sequence", 10, &storedMsg{subj: "$KV.b.r.b", data: read.data}, true},
		{"another value of the key at the sequence", 11, &storedMsg{subj: read.subj, data: []byte(`{"v":2}`)}, true},
	} {
		if got := tailRewound(10, read.subj, read.data, tc.last, tc.at); got != tc.want {
			t.Errorf("%s: tailRewound = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A stream's end read below what a watch delivered decides nothing until
// it has lasted rewindConfirm: a stream leader applies records later than
// the follower the watch's consumer may read from, and a member of a group
// without a leader answers from its own store. What a leader shows at or
// past the sequence decides at once, a loss included.
func TestTailVerdict(t *testing.T) {
	read := &storedMsg{subj: "$KV.b.r.a", data: []byte(`{"v":1}`)}
	other := &storedMsg{subj: "$KV.b.r.b", data: read.data}
	for _, tc := range []struct {
		name                 string
		last                 uint64
		at                   *storedMsg
		leader, final        bool
		wantRewound, decided bool
	}{
		{"a leader behind, first reads", 9, nil, true, false, false, false},
		{"a leader behind, still at the deadline", 9, nil, true, true, true, true},
		{"a leader caught up, the record there", 12, read, true, false, false, true},
		{"a leader caught up, nothing there", 12, nil, true, false, false, true},
		{"a leader, another record there", 12, other, true, false, true, true},
		{"no leader, behind", 9, nil, false, false, false, false},
		{"no leader, behind at the deadline", 9, nil, false, true, false, false},
		{"no leader, another record there", 12, other, false, true, false, false},
	} {
		rewound, decided := tailVerdict(10, read.subj, read.data, tc.last, tc.at, tc.leader, tc.final)
		if rewound != tc.wantRewound || decided != tc.decided {
			t.Errorf("%s: tailVerdict = %v, %v; want %v, %v", tc.name, rewound, decided, tc.wantRewound, tc.decided)
		}
	}
}
