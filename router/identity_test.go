package router

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

func TestDecideClaim(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	other := kvbinding.NodeInfo{Node: "n1", Instance: "b", Every: time.Second}
	rec := func(rev uint64) liveView { return liveView{found: true, rev: rev, info: other} }
	none := liveView{}
	bad := liveView{found: true, rev: 9, invalid: kvbinding.ErrInvalidNodeInfo}
	for _, tc := range []struct {
		name      string
		first     liveView
		cur       liveView
		elapsed   time.Duration
		want      claimVerdict
		wantWhyIn string
	}{
		{"no record", none, none, 0, claimFree, "no liveness record"},
		{"record of another process: look again", rec(5), rec(5), 0, claimWait, "waiting"},
		{"not renewed yet, just under its TTL", rec(5), rec(5), staleAfter(other) - time.Millisecond, claimWait, "waiting"},
		{"renewed: another process heartbeats", rec(5), rec(6), 100 * time.Millisecond, claimTaken, "wrote"},
		{"renewed after a long wait is still taken", rec(5), rec(7), staleAfter(other) - time.Millisecond, claimTaken, "wrote"},
		{"the old record expired: a crashed process", rec(5), none, 2 * time.Second, claimFree, "expired"},
		{"not renewed within its TTL (the server has not removed it yet)", rec(5), rec(5), staleAfter(other), claimFree, "not renewed"},
		{"malformed record is overwritten", bad, bad, 0, claimFree, "not one a node wrote"},
		{"a record written since an empty first reading", none, rec(1), 0, claimTaken, "wrote"},
		{"a malformed record replaced by a node's", bad, rec(10), 0, claimTaken, "wrote"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := decideClaim(tc.first, tc.cur, t0, t0.Add(tc.elapsed))
			if got != tc.want {
				t.Errorf("verdict %v (%s), want %v", got, why, tc.want)
			}
			if !strings.Contains(why, tc.wantWhyIn) {
				t.Errorf("why %q, want it to contain %q", why, tc.wantWhyIn)
			}
		})
	}
}

func TestStaleAfter(t *testing.T) {
	for _, tc := range []struct {
		every time.Duration
		want  time.Duration
	}{
		{time.Second, 4 * time.Second},               // TTL 3 s + 1 s
		{100 * time.Millisecond, 2 * time.Second},    // TTL at least 1 s
		{400 * time.Millisecond, 3 * time.Second},    // 1.2 s rounds up to 2 s, as the TTL header does
		{0, 4 * time.Second},                         // a record without its period: the default heartbeat
		{-time.Second, 4 * time.Second},              // nonsense: the default
		{time.Hour, maxClaimWait},                    // a foreign record cannot hold a node back long
		{maxClaimWait/3 + time.Second, maxClaimWait}, // the bound applies to the TTL as well
	} {
		if got := staleAfter(kvbinding.NodeInfo{Every: tc.every}); got != tc.want {
			t.Errorf("staleAfter(every %v) = %v, want %v", tc.every, got, tc.want)
		}
	}
	// The start-up wait must outlast what announce writes, or a live
	// node's record could be taken for a crashed one's.
	for _, every := range []time.Duration{50 * time.Millisecond, time.Second, 2500 * time.Millisecond, 9 * time.Second} {
		if got := staleAfter(kvbinding.NodeInfo{Every: every}); got <= kvbinding.NodeTTL(every) {
			t.Errorf("heartbeat %v: staleAfter %v is not beyond the record's TTL %v", every, got, kvbinding.NodeTTL(every))
		}
	}
}

func TestLaterStarter(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name           string
		aStart, bStart time.Time
		aInst, bInst   string
		wantAYields    bool
	}{
		{"a started later", t0.Add(time.Millisecond), t0, "a", "b", true},
		{"a started earlier", t0, t0.Add(time.Second), "z", "b", false},
		{"same instant: the greater instance id yields", t0, t0, "b", "a", true},
		{"same instant, smaller instance id", t0, t0, "a", "b", false},
		{"other without a start time (an older version)", t0, time.Time{}, "a", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := kvbinding.NodeInfo{Started: tc.aStart, Instance: tc.aInst}
			b := kvbinding.NodeInfo{Started: tc.bStart, Instance: tc.bInst}
			got := laterStarter(tc.aStart, tc.aInst, b)
			if got != tc.wantAYields {
				t.Errorf("a yields = %v, want %v", got, tc.wantAYields)
			}
			// Exactly one of two distinct processes yields.
			if back := laterStarter(tc.bStart, tc.bInst, a); back == got {
				t.Errorf("b yields = %v as well", back)
			}
		})
	}
	if laterStarter(t0, "a", kvbinding.NodeInfo{Started: t0.Add(-time.Hour), Instance: "a"}) {
		t.Error("a process yields to its own record")
	}
}

// TestStalePredecessor: the record of the process the start-up check found
// gone is not another process while it stays the one the check read (or
// an older one); renewed, it is; another instance's record always is.
func TestStalePredecessor(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	pred := kvbinding.NodeInfo{Instance: "old", Heartbeat: t0}
	for _, tc := range []struct {
		name  string
		pred  kvbinding.NodeInfo
		other kvbinding.NodeInfo
		want  bool
	}{
		{"the record the check read", pred, kvbinding.NodeInfo{Instance: "old", Heartbeat: t0}, true},
		{"an older record of it", pred, kvbinding.NodeInfo{Instance: "old", Heartbeat: t0.Add(-time.Second)}, true},
		{"renewed since: a live process", pred, kvbinding.NodeInfo{Instance: "old", Heartbeat: t0.Add(time.Millisecond)}, false},
		{"another instance", pred, kvbinding.NodeInfo{Instance: "other", Heartbeat: t0}, false},
		{"no predecessor (the id was free)", kvbinding.NodeInfo{}, kvbinding.NodeInfo{Instance: "old", Heartbeat: t0}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := stalePredecessor(tc.pred, tc.other); got != tc.want {
				t.Errorf("stalePredecessor = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNodeIDInUseError(t *testing.T) {
	started := time.Date(2026, 12, 1, 23, 59, 1, 0, time.UTC)
	err := error(&NodeIDInUseError{Node: "n1", Other: kvbinding.NodeInfo{Host: "h1", PID: 4242, Started: started, Instance: "0193"}})
	if !errors.Is(err, ErrNodeIDInUse) {
		t.Error("does not match ErrNodeIDInUse")
	}
	want := `node id "n1" is in use by another live process (host h1, pid 4242, started 2026-12-01T23:59:01Z, instance 0193): stop it, or give this node another id`
	if err.Error() != want {
		t.Errorf("got  %s\nwant %s", err, want)
	}
}
