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
