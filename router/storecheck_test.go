package router

import "testing"

func TestQueueLost(t *testing.T) {
	for _, tc := range []struct {
		name     string
		last     uint64
		found    bool
		atID     string
		lo, hi   uint64
		wantLost bool
	}{
		{"still there", 10, true, "GROUPING_INGRESS:7", 0, 0, false},
		{"consumed (a work queue deleted it)", 10, false, "", 0, 0, false},
		{"the stream went on", 30, false, "", 0, 0, false},
		{"the stream ends below it", 6, false, "", 7, 10, true},
		{"the stream is empty again", 0, false, "", 1, 10, true},
		{"another message at its sequence", 12, true, "GROUPING_INGRESS:99", 10, 10, true},
	} {
		lo, hi, lost := queueLost(10, "GROUPING_INGRESS:7", tc.last, tc.found, tc.atID)
		if lost != tc.wantLost || lo != tc.lo || hi != tc.hi {
			t.Errorf("%s: queueLost = %d-%d %v, want %d-%d %v", tc.name, lo, hi, lost, tc.lo, tc.hi, tc.wantLost)
		}
	}
}
