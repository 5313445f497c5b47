package router

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// A node names, in its checkpoints, each group taken from it with the
// last message of it it stored on its queue and the epoch of the record
// that took it; a group it did not route lately is not named; a later
// take-over (a higher epoch) replaces the entry; the names last lostKeep,
// what it routed routedKeep at most, and a restarted node keeps naming
// what its earlier run named.
func TestLostBook(t *testing.T) {
	cache := kvbinding.NewCache(kvbinding.CacheConfig{})
	e := newEngine(engineConfig{node: "n1", maxHeldMessages: 100, maxHeldBytes: 1 << 20, maxInFlight: 100, timeout: time.Second},
		cache, rand.New(rand.NewPCG(1, 2)))
	now := time.Unix(1000, 0)
	at := now // when the node learns of a take-over
	e.begin(resumePoint{ckpt: kvbinding.Checkpoint{Next: 1, Lost: map[string]kvbinding.LostPos{"old": {2, 3, 4}}}}, 0)
	e.lost.routed("g", 3, 10)
	e.lost.routed("g", 4, 12)
	e.lost.routed("g", 2, 9) // an earlier publish's late outcome
	e.lost.routed("h", 5, 0) // a PubAck without a sequence
	e.lost.routed("k", 6, 13)
	take := func(group, node string, rev, epoch uint64) {
		t.Helper()
		if !cache.Apply(kvbinding.Binding{Group: group, State: kvbinding.StateBound, Node: node, PrevNode: "n1", FromSeq: 1,
			Step: kvbinding.StepDrain, Drain: []string{"n1"}, Reason: "node n1 gone", Ckpt: 5, Revision: rev, Epoch: epoch}) {
			t.Fatalf("record of %s not applied", group)
		}
		e.changed(group, at)
	}
	take("g", "n2", 20, 0)
	take("h", "n2", 21, 0)
	take("x", "n2", 22, 0) // never routed here
	// A move that is not an evacuation from this node's checkpoint (a
	// rebalance: its catch-up starts at the fence, which this node
	// reported) is not named.
	e.lost.routed("r", 8, 15)
	if !cache.Apply(kvbinding.Binding{Group: "r", State: kvbinding.StateBound, Node: "n2", PrevNode: "n1", FromSeq: 9,
		Step: kvbinding.StepDrain, Drain: []string{"n1"}, Revision: 23}) {
		t.Fatal("record of r not applied")
	}
	e.changed("r", at)
	check := func(at time.Time, want string) {
		t.Helper()
		if got := fmt.Sprint(e.lost.snapshot(at)); got != want {
			t.Errorf("at +%v: lost %s, want %s", at.Sub(now), got, want)
		}
	}
	check(now, "map[g:[4 12 20] old:[2 3 4]]")
	take("g", "n3", 25, 24) // moved on before its catch-up: the new epoch
	check(now, "map[g:[4 12 24] old:[2 3 4]]")
	take("g", "n3", 26, 23) // an older epoch's record changes nothing
	check(now, "map[g:[4 12 24] old:[2 3 4]]")
	// k is remembered across one rotation, not two.
	check(now.Add(routedKeep/2), "map[g:[4 12 24] old:[2 3 4]]")
	at = now.Add(routedKeep / 2)
	take("k", "n2", 30, 0)
	check(now.Add(routedKeep/2), "map[g:[4 12 24] k:[6 13 30] old:[2 3 4]]")
	check(now.Add(lostKeep+time.Second), "map[k:[6 13 30]]")
	e.lost.routed("m", 7, 14)
	check(now.Add(routedKeep*3/2), "map[k:[6 13 30]]")
	check(now.Add(routedKeep*2), "map[]")
	check(now.Add(routedKeep*5/2), "map[]")
	at = now.Add(routedKeep * 5 / 2)
	take("m", "n2", 31, 0)
	check(now.Add(routedKeep*5/2), "map[]")
}
