package consumer

import (
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"
)

// step is one input to a laneSet in a table test.
type step struct {
	op      string // "arrive", "next", "ok", "fail", "terminal", "barrier", "lift", "park", "release"
	group   string
	seq     uint64
	epoch   uint64
	want    verdict  // for arrive
	stale   []uint64 // for arrive: held copies dropped
	cancel  bool     // for arrive: the running one became stale
	next    uint64   // for next: seq taken (0: none)
	nextG   string   // for next: its group
	parkIt  bool     // for next: to be parked
	after   time.Duration
	parked  bool // for fail: the lane parks now
	retryIn time.Duration
	replay  bool          // for next: the group's replay job is taken
	st      parkState     // for endReplay; for record
	mine    bool          // for record: the replay is this node's
	claim   time.Duration // for record: another claim stands this long
}

func TestLanes(t *testing.T) {
	backoff := func(n int) time.Duration { return time.Duration(n) * 100 * time.Millisecond }
	tests := []struct {
		name  string
		steps []step
	}{
		{"one at a time in seq order", []step{
			{op: "arrive", group: "g", seq: 5, want: held},
			{op: "arrive", group: "g", seq: 3, want: held},
			{op: "next", next: 3, nextG: "g"},
			{op: "next"}, // g is running
			{op: "ok", group: "g"},
			{op: "next", next: 5, nextG: "g"},
		}},
		{"groups in parallel, FIFO", []step{
			{op: "arrive", group: "a", seq: 1, want: held},
			{op: "arrive", group: "b", seq: 2, want: held},
			{op: "arrive", group: "a", seq: 3, want: held},
			{op: "next", next: 1, nextG: "a"},
			{op: "next", next: 2, nextG: "b"},
			{op: "next"},
		}},
		{"done mark drops a redelivery", []step{
			{op: "arrive", group: "g", seq: 1, want: held},
			{op: "next", next: 1, nextG: "g"},
			{op: "ok", group: "g"},
			{op: "arrive", group: "g", seq: 1, want: dropDone},
		}},
		{"redelivery of a held or running message takes its place", []step{
			{op: "arrive", group: "g", seq: 1, want: held},
			{op: "arrive", group: "g", seq: 2, want: held},
			{op: "next", next: 1, nextG: "g"},
			{op: "arrive", group: "g", seq: 1, want: tookOver},
			{op: "arrive", group: "g", seq: 2, want: tookOver},
			{op: "ok", group: "g"},
			{op: "next", next: 2, nextG: "g"},
			{op: "next"},
		}},
		{"barrier holds later messages until it arrives", []step{
			{op: "barrier", group: "g", seq: 4},
			{op: "arrive", group: "g", seq: 6, want: held},
			{op: "next"},
			{op: "arrive", group: "g", seq: 2, want: held},
			{op: "next", next: 2, nextG: "g"},
			{op: "ok", group: "g"},
			{op: "next"},
			{op: "arrive", group: "g", seq: 4, want: held},
			{op: "next", next: 4, nextG: "g"},
		}},
		{"barrier lifted when its message is gone", []step{
			{op: "barrier", group: "g", seq: 4},
			{op: "arrive", group: "g", seq: 6, want: held},
			{op: "next"},
			{op: "lift", group: "g", seq: 4},
			{op: "next", next: 6, nextG: "g"},
		}},
		{"older epoch dropped, newer drops held ones and the running one", []step{
			{op: "arrive", group: "g", seq: 1, epoch: 5, want: held},
			{op: "arrive", group: "g", seq: 2, epoch: 5, want: held},
			{op: "arrive", group: "g", seq: 3, epoch: 5, want: held},
			{op: "next", next: 1, nextG: "g"},
			{op: "arrive", group: "g", seq: 4, epoch: 7, want: held, stale: []uint64{2, 3}, cancel: true},
			{op: "arrive", group: "g", seq: 5, epoch: 5, want: dropStale},
			{op: "arrive", group: "g", seq: 6, want: held}, // no epoch: not fenced
			{op: "ok", group: "g"},
			{op: "next", next: 4, nextG: "g"},
		}},
		{"retry after backoff, other groups go on, then park in order", []step{
			{op: "arrive", group: "g", seq: 1, want: held},
			{op: "arrive", group: "g", seq: 2, want: held},
			{op: "arrive", group: "h", seq: 3, want: held},
			{op: "next", next: 1, nextG: "g"},
			{op: "fail", group: "g", retryIn: 100 * time.Millisecond},
			{op: "next", next: 3, nextG: "h"},
			{op: "next"}, // g backs off
			{op: "next", after: 100 * time.Millisecond, next: 1, nextG: "g"},
			{op: "fail", group: "g", parked: true}, // attempt 2 of 2
			{op: "next", next: 1, nextG: "g", parkIt: true},
			{op: "ok", group: "g"},
			{op: "next", next: 2, nextG: "g", parkIt: true},
			{op: "ok", group: "g"},
			{op: "arrive", group: "g", seq: 7, want: held},
			{op: "next", next: 7, nextG: "g", parkIt: true},
		}},
		{"terminal parks at once; release resumes", []step{
			{op: "arrive", group: "g", seq: 1, want: held},
			{op: "next", next: 1, nextG: "g"},
			{op: "terminal", group: "g", parked: true},
			{op: "release", group: "g"},
			{op: "next", next: 1, nextG: "g"},
		}},
		{"a lane of one ungrouped message is forgotten once done", []step{
			{op: "arrive", group: "\x00u7", seq: 7, want: held},
			{op: "next", next: 7, nextG: "\x00u7"},
			{op: "ok", group: "\x00u7"},
			{op: "gone", group: "\x00u7"},
		}},
		{"a replay asked for here runs before held arrivals, which wait meanwhile", []step{
			{op: "park", group: "g"},
			{op: "arrive", group: "g", seq: 10, want: held},
			{op: "record", group: "g", st: replayState, mine: true},
			{op: "next", nextG: "g", replay: true},
			{op: "next"}, // g replays: 10 waits
			{op: "arrive", group: "g", seq: 11, want: held},
			{op: "endReplay", group: "g", st: notParked, seq: 9},
			{op: "next", next: 10, nextG: "g"},
			{op: "arrive", group: "g", seq: 9, want: dropDone},
		}},
		{"a replay on another node holds the arrivals until the record goes", []step{
			{op: "record", group: "g", st: replayState},
			{op: "arrive", group: "g", seq: 10, want: held},
			{op: "next"},
			{op: "record", group: "g", st: notParked},
			{op: "next", next: 10, nextG: "g"},
		}},
		{"a replay parked again parks the held arrivals behind it", []step{
			{op: "record", group: "g", st: replayState, mine: true},
			{op: "arrive", group: "g", seq: 10, want: held},
			{op: "next", nextG: "g", replay: true},
			{op: "endReplay", group: "g", st: parkedState, seq: 4},
			{op: "next", next: 10, nextG: "g", parkIt: true},
		}},
		{"another process's claim is waited out, then taken over", []step{
			{op: "record", group: "g", st: replayState, mine: true, claim: time.Minute},
			{op: "arrive", group: "g", seq: 10, want: held},
			{op: "next"},
			{op: "due", after: 59 * time.Second},
			{op: "next"},
			{op: "due", after: time.Second},
			{op: "next", nextG: "g", replay: true},
			{op: "endReplay", group: "g", st: replayState},
			{op: "next"}, // tried again after replayRetry
		}},
		// A replay job whose read of the record was older than the watch's
		// ends "not done": it is taken again once replayRetry has passed,
		// and the arrivals keep waiting meanwhile.
		{"a replay that read a stale record is tried again", []step{
			{op: "record", group: "g", st: replayState, mine: true},
			{op: "arrive", group: "g", seq: 10, want: held},
			{op: "next", nextG: "g", replay: true},
			{op: "endReplay", group: "g", st: replayState},
			{op: "next"},
			{op: "due", after: replayRetry},
			{op: "next", nextG: "g", replay: true},
		}},
		// The record changed while the job ran (parked again, say): the
		// job's "not done" does not hold the arrivals back.
		{"a replay ended not done after the record went back to parked releases its arrivals", []step{
			{op: "record", group: "g", st: replayState, mine: true},
			{op: "arrive", group: "g", seq: 10, want: held},
			{op: "next", nextG: "g", replay: true},
			{op: "record", group: "g", st: parkedState},
			{op: "endReplay", group: "g", st: replayState},
			{op: "next", next: 10, nextG: "g", parkIt: true},
		}},
		{"a group parked elsewhere parks its arrivals", []step{
			{op: "park", group: "g"},
			{op: "arrive", group: "g", seq: 1, want: held},
			{op: "next", next: 1, nextG: "g", parkIt: true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newLaneSet()
			now := time.Unix(1000, 0)
			for i, st := range tt.steps {
				now = now.Add(st.after)
				switch st.op {
				case "arrive":
					v, stale, cancel := s.arrive(st.group, &delivery{seq: st.seq, epoch: st.epoch, streamSeq: st.seq}, now)
					var staleSeqs []uint64
					for _, d := range stale {
						staleSeqs = append(staleSeqs, d.seq)
					}
					if v != st.want || !slices.Equal(staleSeqs, st.stale) || cancel != st.cancel {
						t.Fatalf("step %d: arrive %s/%d = %v, stale %v, cancel %v; want %v, %v, %v", i, st.group, st.seq, v, staleSeqs, cancel, st.want, st.stale, st.cancel)
					}
				case "next":
					if st.after > 0 {
						s.kickAll(now) // the shell's backoff timer
					}
					l, d, park := s.next(now)
					switch {
					case st.replay && (l == nil || l.group != st.nextG || d != nil):
						t.Fatalf("step %d: next = %v, %v; want the replay of %s", i, l, d, st.nextG)
					case st.replay:
					case st.next == 0 && l != nil:
						t.Fatalf("step %d: next took %s/%d, want none", i, l.group, d.seq)
					case st.next != 0 && (l == nil || l.group != st.nextG || d.seq != st.next || park != st.parkIt):
						t.Fatalf("step %d: next = %v, want %s/%d park=%v", i, d, st.nextG, st.next, st.parkIt)
					}
				case "ok", "fail", "terminal":
					o := map[string]outcome{"ok": succeeded, "fail": failed, "terminal": failedTerminal}[st.op]
					parked, retryAt := s.finish(s.lanes[st.group], o, 2, backoff, now)
					if parked != st.parked {
						t.Fatalf("step %d: parked = %v, want %v", i, parked, st.parked)
					}
					if st.retryIn > 0 && !retryAt.Equal(now.Add(st.retryIn)) {
						t.Fatalf("step %d: retry at %v, want in %v", i, retryAt.Sub(now), st.retryIn)
					}
					s.kickAll(now)
				case "barrier":
					s.addBarrier(st.group, barrier{seq: st.seq, streamSeq: st.seq, since: now}, now)
				case "lift":
					s.liftBarrier(st.group, st.seq, now)
				case "gone":
					if _, ok := s.lanes[st.group]; ok {
						t.Fatalf("step %d: lane %q kept", i, st.group)
					}
				case "record":
					s.setRecord(st.group, st.st, st.mine, now.Add(st.claim), now)
				case "due":
					s.replaysDue(now)
				case "endReplay":
					s.endReplay(s.lanes[st.group], st.st, st.seq, now.Add(replayRetry), now)
				case "park":
					s.setParked(st.group, true, now)
				case "release":
					s.setParked(st.group, false, now)
				}
				if s.held < 0 || s.running < 0 {
					t.Fatalf("step %d: counts went negative: held %d running %d", i, s.held, s.running)
				}
			}
		})
	}
}

func TestLanesSweepAndProgress(t *testing.T) {
	s := newLaneSet()
	now := time.Unix(1000, 0)
	s.arrive("idle", &delivery{seq: 1, touched: now}, now)
	s.arrive("busy", &delivery{seq: 2, touched: now}, now)
	l, _, _ := s.next(now)
	s.finish(l, succeeded, 3, nil, now)
	s.setParked("parked", true, now)
	if due := s.progressDue(now.Add(time.Second), 2*time.Second); len(due) != 0 {
		t.Fatalf("progress due after 1s of 2s: %d", len(due))
	}
	if due := s.progressDue(now.Add(3*time.Second), 2*time.Second); len(due) != 1 || due[0].seq != 2 {
		t.Fatalf("progress due after 3s: %v, want message 2", due)
	}
	if n := s.sweep(now.Add(time.Minute), time.Minute); n != 1 {
		t.Fatalf("swept %d lanes, want 1 (the idle one; not the busy or parked one)", n)
	}
	if _, ok := s.lanes["idle"]; ok {
		t.Fatal("the idle lane was kept")
	}
}

func TestFence(t *testing.T) {
	a, b, c := Fence{Epoch: 2, IngressSeq: 900}, Fence{Epoch: 10, IngressSeq: 1}, Fence{Epoch: 10, IngressSeq: 2}
	if !a.Less(b) || !b.Less(c) || c.Less(a) || a.Less(a) {
		t.Fatal("fences do not order by epoch then ingress seq")
	}
	if !(a.String() < b.String() && b.String() < c.String()) {
		t.Fatalf("fence strings do not sort as fences: %s %s %s", a, b, c)
	}
}

func TestWarningsRateLimited(t *testing.T) {
	var w warnings
	now := time.Unix(1000, 0)
	steps := []struct {
		kind       string
		after      time.Duration
		ok         bool
		suppressed int
	}{
		{"a", 0, true, 0},
		{"a", time.Second, false, 0},
		{"b", 0, true, 0}, // kinds apart
		{"a", time.Second, false, 0},
		{"a", warnEvery, true, 2},
		{"a", time.Second, false, 0},
	}
	for i, st := range steps {
		now = now.Add(st.after)
		ok, n := w.allow(st.kind, now)
		if ok != st.ok || n != st.suppressed {
			t.Fatalf("step %d: allow(%s) = %v, %d; want %v, %d", i, st.kind, ok, n, st.ok, st.suppressed)
		}
	}
}

// BenchmarkIdleLaneMemory reports the heap an idle group's lane keeps (its
// done mark and epoch, until WithIdleLane), over 100,000 groups.
func BenchmarkIdleLaneMemory(b *testing.B) {
	const groups = 100_000
	names := make([]string, groups)
	for i := range names {
		names[i] = "order-" + strconv.Itoa(1_000_000+i)
	}
	var perLane float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := newLaneSet()
		now := time.Unix(1000, 0)
		for i, g := range names {
			s.arrive(g, &delivery{seq: uint64(i + 1), epoch: 3}, now)
			l, _, _ := s.next(now)
			s.finish(l, succeeded, 1, nil, now)
		}
		s.ready = nil
		runtime.GC()
		runtime.ReadMemStats(&after)
		perLane = float64(after.HeapAlloc-before.HeapAlloc) / groups
		runtime.KeepAlive(s)
	}
	b.ReportMetric(perLane, "bytes/idle-group")
}

func TestParkedSubjects(t *testing.T) {
	tests := []struct {
		lane, want string
	}{
		{"order-7", "r.order-7"},
		{"order 7.x", "b.b3JkZXIgNy54"},
		{ungroupedPrefix + "12", "u._"},
		{malformedPrefix + "3", "m._"},
	}
	for _, tt := range tests {
		key := parkedKeyTokens(tt.lane)
		if key != tt.want {
			t.Errorf("parkedKeyTokens(%q) = %q, want %q", tt.lane, key, tt.want)
		}
		node, gotKey, subject, ok := parkedSubjectParts(ParkedSubjectPrefix + "n1." + key + ".jms.orders.eu")
		if !ok || node != "n1" || gotKey != key || subject != "jms.orders.eu" {
			t.Errorf("parts of %q: %q %q %q %v", key, node, gotKey, subject, ok)
		}
	}
	if _, _, _, ok := parkedSubjectParts(ParkedSubjectPrefix + "n1.r.g"); ok {
		t.Error("a parked subject without an ingress subject parsed")
	}
	if f, err := ParkedFilter("order-7"); err != nil || f != "grouping.parked.*.r.order-7.>" {
		t.Errorf("ParkedFilter = %q, %v", f, err)
	}
}
