package router

import (
	"testing"
	"time"
)

func TestWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type step struct {
		sent, answered    int
		timedOut, failure bool
		at                time.Duration
		wantLimit         int
		wantRoom          int
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"starts wide open", []step{{sent: 100, wantLimit: 1000, wantRoom: 900}}},
		{"full window has no room", []step{{sent: 1000, wantLimit: 1000, wantRoom: 0}}},
		{"a timeout halves it", []step{
			{sent: 1000, answered: 100, timedOut: true, wantLimit: 500, wantRoom: 0},
			{answered: 600, wantLimit: 620, wantRoom: 320}}},
		{"timeouts within the quiet time cut once", []step{
			{sent: 1000, answered: 100, timedOut: true, wantLimit: 500, wantRoom: 0},
			{answered: 100, timedOut: true, at: time.Second, wantLimit: 500, wantRoom: 0},
			{answered: 100, timedOut: true, at: 5 * time.Second, wantLimit: 250, wantRoom: 0}}},
		{"never below min", []step{
			{sent: 10, answered: 1, timedOut: true, wantLimit: 500, wantRoom: 491},
			{answered: 1, timedOut: true, at: 5 * time.Second, wantLimit: 250, wantRoom: 242},
			{answered: 1, timedOut: true, at: 10 * time.Second, wantLimit: 125, wantRoom: 118},
			{answered: 1, timedOut: true, at: 15 * time.Second, wantLimit: 100, wantRoom: 94},
			{answered: 1, timedOut: true, at: 20 * time.Second, wantLimit: 100, wantRoom: 95}}},
		{"replies widen it by a step per window", []step{
			{sent: 600, answered: 100, timedOut: true, wantLimit: 500, wantRoom: 0},
			{answered: 500, wantLimit: 600, wantRoom: 600}}},
		{"never above max", []step{{sent: 1000, answered: 1000, wantLimit: 1000, wantRoom: 1000}}},
		{"other failures leave it", []step{
			{sent: 300, answered: 300, failure: true, wantLimit: 1000, wantRoom: 1000}}},
		{"unanswered proposals never go negative", []step{
			{answered: 50, wantLimit: 1000, wantRoom: 1000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWindow(100, 1000, 100)
			for i, s := range tc.steps {
				w.sent(s.sent)
				if s.answered > 0 {
					w.answered(s.answered, s.timedOut, s.failure, 5*time.Second, t0.Add(s.at))
				}
				if got := int(w.limit); got != s.wantLimit {
					t.Fatalf("step %d: limit %d, want %d", i, got, s.wantLimit)
				}
				if got := w.room(); got != s.wantRoom {
					t.Fatalf("step %d: room %d, want %d", i, got, s.wantRoom)
				}
			}
		})
	}
}
