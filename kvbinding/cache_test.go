package kvbinding

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
)

func bound(group, node string, from, rev uint64) Binding {
	return Binding{Group: group, State: StateBound, Node: node, FromSeq: from, Revision: rev}
}

func TestCacheIgnoresRevisionsAlreadyApplied(t *testing.T) {
	c := NewCache(CacheConfig{})
	watch := func(b Binding) { c.mu.Lock(); c.applyLocked(Ref(b.Group), b, true); c.mu.Unlock() }
	watch(bound("g", "n1", 1, 1))
	watch(bound("h", "n2", 2, 2))
	c.mu.Lock()
	c.deleteLocked("h", 3)
	c.mu.Unlock()
	watch(bound("g", "n2", 9, 4)) // a move

	// A watcher that lost its server replays the bucket from revision 1.
	watch(bound("g", "n1", 1, 1))
	watch(bound("h", "n2", 2, 2))
	c.mu.Lock()
	c.deleteLocked("h", 3)
	c.mu.Unlock()

	r, ok := c.Lookup("g")
	if !ok || r.Node != "n2" || r.FromSeq != 9 || r.Revision != 4 {
		t.Fatalf("g = %+v, %v; want n2 from 9 at rev 4", r, ok)
	}
	if _, ok := c.Lookup("h"); ok {
		t.Fatalf("h came back after its delete was replayed")
	}
	if got := c.Counts(); len(got) != 1 || got["n2"] != 1 {
		t.Fatalf("counts = %v, want map[n2:1]", got)
	}
	// Out-of-band Apply of a revision the watch delivers later.
	if !c.Apply(bound("k", "n1", 5, 7)) {
		t.Fatal("Apply of a new revision did nothing")
	}
	if c.Apply(bound("k", "n1", 5, 7)) {
		t.Fatal("Apply of the same revision changed the cache")
	}
	watch(bound("m", "n1", 6, 5)) // earlier revision of another key, delivered after: must apply
	if _, ok := c.Lookup("m"); !ok {
		t.Fatal("watch entry below an out-of-band revision was dropped")
	}
	if c.Count("n1") != 2 {
		t.Fatalf("Count(n1) = %d, want 2", c.Count("n1"))
	}
}

func openTestStore(t *testing.T) (*Store, *natstest.Server) {
	t.Helper()
	s := natstest.RunServer(t)
	js, _ := jetstream.New(s.Connect())
	st, err := OpenStore(context.Background(), js, StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return st, s
}

func TestStoreCreateConverges(t *testing.T) {
	st, _ := openTestStore(t)
	ctx := context.Background()
	// Ten concurrent creates for one group: exactly one wins, all see it.
	var wg sync.WaitGroup
	results := make([]Binding, 10)
	errs := make([]error, 10)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := bound("order:42", fmt.Sprintf("n%d", i), 1, 0)
			b.DecidedAt = time.Now()
			results[i], errs[i] = st.Create(ctx, b)
		}()
	}
	wg.Wait()
	winners := 0
	for i := range results {
		if errs[i] == nil {
			winners++
		} else if !errors.Is(errs[i], ErrExists) {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if results[i].Node != results[0].Node || results[i].Revision != results[0].Revision {
			t.Fatalf("create %d saw %+v, create 0 saw %+v", i, results[i], results[0])
		}
	}
	if winners != 1 {
		t.Fatalf("%d creates won, want 1", winners)
	}
	// Compare-and-set: a stale revision loses and returns the current record.
	cur := results[0]
	moved := bound("order:42", "n9", 5, 0)
	moved.PrevNode = cur.Node
	nb, err := st.Replace(ctx, moved, cur.Revision)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Replace(ctx, bound("order:42", "n8", 6, 0), cur.Revision); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale replace: %v, want ErrConflict", err)
	}
	got, err := st.Get(ctx, "order:42")
	if err != nil || got.Node != "n9" || got.Revision != nb.Revision || got.PrevNode != cur.Node {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	// Create after delete succeeds.
	if err := st.Delete(ctx, "order:42", got.Revision); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, "order:42"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after delete: %v", err)
	}
	if _, err := st.Create(ctx, bound("order:42", "n1", 7, 0)); err != nil {
		t.Fatalf("create after delete: %v", err)
	}
}

func TestCacheFollowsBucketAcrossServerRestart(t *testing.T) {
	st, srv := openTestStore(t)
	ctx := context.Background()
	for i := 0; i < 50; i++ {
		if _, err := st.Create(ctx, bound(fmt.Sprintf("g%d", i), fmt.Sprintf("n%d", i%3), uint64(i+1), 0)); err != nil {
			t.Fatal(err)
		}
	}
	c := NewCache(CacheConfig{})
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = c.Run(runCtx, st) }()
	select {
	case <-c.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("cache not ready")
	}
	if c.Len() != 50 {
		t.Fatalf("cache has %d bindings after load, want 50", c.Len())
	}
	srv.Stop()
	srv.Restart()
	if _, err := st.Create(ctx, bound("after", "n1", 99, 0)); err != nil {
		// The client reconnects; the first write may race the restart.
		natstest.Eventually(t, 10*time.Second, func() error {
			_, err := st.Create(ctx, bound("after", "n1", 99, 0))
			if errors.Is(err, ErrExists) {
				return nil
			}
			return err
		})
	}
	start := time.Now()
	natstest.Eventually(t, 30*time.Second, func() error {
		if _, ok := c.Lookup("after"); !ok {
			return errors.New("write after restart not seen")
		}
		return nil
	})
	t.Logf("write after restart seen after %v", time.Since(start))
	counts := c.Counts()
	if c.Len() != 51 || counts["n0"] != 17 || counts["n1"] != 18 || counts["n2"] != 16 {
		t.Fatalf("after restart: len %d counts %v", c.Len(), counts)
	}
}

func TestCacheOwnersCountsMovesInProgress(t *testing.T) {
	c := NewCache(CacheConfig{})
	c.Apply(bound("a", "n1", 1, 1))
	c.Apply(bound("b", "n2", 1, 2))
	c.Apply(Binding{Group: "b", State: StateMoving, Node: "n3", PrevNode: "n2", FromSeq: 1, Revision: 3})
	c.Apply(bound("", "n4", 1, 4)) // the ungrouped router counts as an owner
	got := c.Owners()
	if len(got) != 3 || !got["n1"] || !got["n2"] || !got["n4"] {
		t.Fatalf("Owners = %v, want n1 n2 n4", got)
	}
	c.Apply(Binding{Group: "b", State: StateBound, Node: "n3", PrevNode: "n2", FromSeq: 9, Step: StepDrain, Drain: []string{"n2"}, Revision: 5})
	got = c.Owners()
	if got["n2"] || !got["n3"] {
		t.Fatalf("after the fence Owners = %v, want n3 and not n2", got)
	}
	if gs := c.RefsOf("n3"); len(gs) != 1 || gs[0] != "b" {
		t.Fatalf("RefsOf(n3) = %v", gs)
	}
	if d := c.Draining(); len(d) != 1 || d["n2"] != 1 {
		t.Fatalf("Draining = %v, want n2: 1", d)
	}
	if u := c.Unsettled(); len(u) != 1 || u["b"].Step != StepDrain {
		t.Fatalf("Unsettled = %v, want b in step drain", u)
	}
	if cu := c.CatchingUp(); len(cu) != 0 {
		t.Fatalf("while it drains CatchingUp = %v, want none", cu)
	}
	c.Apply(Binding{Group: "b", State: StateBound, Node: "n3", PrevNode: "n2", FromSeq: 9, Step: StepCatchUp, Revision: 6})
	if d, cu := c.Draining(), c.CatchingUp(); len(d) != 0 || len(cu) != 1 || cu["n2"] != 1 {
		t.Fatalf("while it catches up Draining = %v, CatchingUp = %v, want n2: 1 catching up", d, cu)
	}
	c.Apply(Binding{Group: "b", State: StateBound, Node: "n3", PrevNode: "n2", FromSeq: 9, Revision: 7})
	if d, cu, u := c.Draining(), c.CatchingUp(), c.Unsettled(); len(d) != 0 || len(cu) != 0 || len(u) != 0 {
		t.Fatalf("after the hand-over Draining = %v, CatchingUp = %v, Unsettled = %v", d, cu, u)
	}
}

// TestCacheReservations: BoundReserved counts a reserved group once: not
// when Bound counts it already, once however often it is reserved, and
// once when its record comes (the reservation ends there); Unreserve ends
// the others.
func TestCacheReservations(t *testing.T) {
	c := NewCache(CacheConfig{})
	c.Apply(bound("a", "n1", 1, 1))
	c.Apply(Binding{Group: "b", State: StateMoving, Node: "n3", PrevNode: "n2", FromSeq: 1, Revision: 2})
	c.Apply(Binding{Group: "c", State: StateReleased, PrevNode: "n1", ThroughSeq: 4, Revision: 3})
	c.Apply(bound("", "n4", 1, 4)) // the ungrouped routing binding is no group
	long := strings.Repeat("x", 100)
	c.Apply(bound(long, "n1", 1, 5))
	step := func(what string, want int) {
		t.Helper()
		if got := c.BoundReserved(); got != want {
			t.Fatalf("%s: BoundReserved = %d, want %d (Bound %d)", what, got, want, c.Bound())
		}
	}
	step("no reservation", 3)
	c.Reserve("a")
	c.Reserve(Ref(long))
	step("bound groups reserved", 3)
	c.Reserve("new")
	c.Reserve("new")
	step("a new group reserved twice", 4)
	c.Reserve("c")
	step("an ended record's group reserved", 5)
	c.Apply(bound("new", "n2", 9, 10))
	step("the new group's record in the cache", 5)
	c.Unreserve("new")
	c.Unreserve("new")
	step("the new group's reservations ended after its record came", 5)
	c.Unreserve("c")
	step("the ended record's group not written", 4)
}

// TestCacheRefusesInvalidValues: a value that does not decode, does not
// validate or names another group than its key is not applied; the group
// counts as unbound at that revision (so the handler can write over it),
// and a later valid revision replaces it.
func TestCacheRefusesInvalidValues(t *testing.T) {
	notify := make(chan string, 16)
	c := NewCache(CacheConfig{Notify: notify})
	c.warm.Store(true)
	good, _ := Binding{Group: "g", State: StateBound, Node: "n1", FromSeq: 3, DecidedBy: "h"}.Marshal()
	// Over a valid record: the record stays, the bad revision is listed.
	c.Feed().Put("r.g", good, 1)
	c.Feed().Put("r.g", []byte(`{"group":"g","state":"bound","node":"n 1","from_seq":3}`), 2)
	if r, _ := c.Lookup("g"); r.Invalid || r.Node != "n1" || r.Revision != 1 {
		t.Fatalf("a bad value replaced the valid record: %+v", r)
	}
	if b := c.Bad(); b["g"] != 2 {
		t.Fatalf("Bad = %v, want g at 2", b)
	}
	// Without a valid record: the group is unbound at the bad revision.
	c.mu.Lock()
	c.deleteLocked("g", 3)
	c.mu.Unlock()
	if len(c.Bad()) != 0 {
		t.Fatalf("Bad after a delete = %v", c.Bad())
	}
	for i, bad := range []string{
		`{"group":"g","state":"bound","node":"n 1","from_seq":3}`,               // not a node id
		`{"group":"g","state":"bound","node":"n1","from_seq":3,"step":"drain"}`, // drain without nodes
		`{"group":"g","state":"bound","node":"n1","from_seq":3,"step":"drain","drain":["x y"]}`,
		`{"group":"other","state":"bound","node":"n1","from_seq":3}`, // another group's record
		`{"group":"g","state":"exploded"}`,
		`not json`,
		`{"group":"g","state":"bound","node":"n1","from_seq":3,"epoch":99999}`, // an epoch past its revision
	} {
		rev := uint64(4 + i)
		c.Feed().Put("r.g", []byte(bad), rev)
		r, ok := c.Lookup("g")
		if !ok || !r.Invalid || r.Revision != rev {
			t.Fatalf("%s: Lookup = %+v, %v; want invalid at revision %d", bad, r, ok, rev)
		}
		if c.Count("n1") != 0 {
			t.Fatalf("%s: an invalid record still counts as bound", bad)
		}
	}
	if c.Ignored() != 8 {
		t.Fatalf("Ignored = %d, want 8", c.Ignored())
	}
	c.Feed().Put("r.g", good, 20)
	if r, _ := c.Lookup("g"); r.Invalid || r.Node != "n1" || r.Revision != 20 {
		t.Fatalf("a valid revision did not replace the invalid one: %+v", r)
	}
	if len(notify) != 9 {
		t.Fatalf("%d notifications, want 9 (one per applied change)", len(notify))
	}
}

// TestCacheEpochs: a record that makes a node the owner has its own
// revision as the group's epoch; later records of the same owner carry it.
func TestCacheEpochs(t *testing.T) {
	c := NewCache(CacheConfig{})
	c.warm.Store(true)
	put := func(b Binding, rev uint64) {
		data, err := b.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		c.Feed().Put("r.g", data, rev)
	}
	put(Binding{Group: "g", State: StateBound, Node: "n1", FromSeq: 3, DecidedBy: "h"}, 5)
	if r, _ := c.Lookup("g"); r.Epoch != 5 {
		t.Fatalf("epoch of a bind = %d, want its revision 5", r.Epoch)
	}
	put(Binding{Group: "g", State: StateBound, Node: "n2", FromSeq: 9, PrevNode: "n1", Step: StepCatchUp, DecidedBy: "h"}, 9)
	put(Binding{Group: "g", State: StateBound, Node: "n2", FromSeq: 9, PrevNode: "n1", Epoch: 9, DecidedBy: "h"}, 11)
	if r, _ := c.Lookup("g"); r.Epoch != 9 || r.Revision != 11 {
		t.Fatalf("settled after a move: epoch %d revision %d, want 9 and 11", r.Epoch, r.Revision)
	}
}

// A record in a hand-over step keeps its Reason in the cache (an
// evacuation's: proposals.Evacuated), and loses it with the step.
func TestCacheKeepsTheReasonAndCheckpointOfARecordInAStep(t *testing.T) {
	c := NewCache(CacheConfig{})
	for _, tt := range []struct {
		b    Binding
		want string
	}{
		{Binding{Group: "g", State: StateBound, Node: "n2", FromSeq: 5, PrevNode: "n1", Step: StepDrain, Drain: []string{"n1"}, Reason: "node n1 gone for 15s", Revision: 3}, "node n1 gone for 15s"},
		{Binding{Group: "g", State: StateBound, Node: "n2", FromSeq: 5, PrevNode: "n1", Step: StepCatchUp, Epoch: 3, Revision: 4}, ""},
		{Binding{Group: "g", State: StateBound, Node: "n2", FromSeq: 5, PrevNode: "n1", Step: StepCatchUp, Reason: "again", Ckpt: 9, Revision: 5}, "again"},
		{Binding{Group: "g", State: StateBound, Node: "n2", FromSeq: 5, Reason: "settled", Revision: 6}, ""},
	} {
		if !c.Apply(tt.b) {
			t.Fatalf("%+v not applied", tt.b)
		}
		got, _ := c.Lookup("g")
		if got.Reason != tt.want {
			t.Errorf("revision %d: Reason %q, want %q", tt.b.Revision, got.Reason, tt.want)
		}
		if want := map[bool]uint64{true: tt.b.Ckpt}[tt.b.Phase().TakingOver()]; got.Ckpt != want {
			t.Errorf("revision %d: Ckpt %d, want %d", tt.b.Revision, got.Ckpt, want)
		}
		if cached := tt.b.Cached(); got.Reason != cached.Reason || got.Ckpt != cached.Ckpt {
			t.Errorf("revision %d: the cache's %+v, Cached %+v", tt.b.Revision, got, cached)
		}
	}
}

// TestCacheFeed: a cache fed by hand (an in-memory bucket) takes the
// watch's rules: Put and Delete report a change and notify it once the
// initial records are in, and a revision already held, whether the watch
// or the writer's Apply brought it, changes nothing.
func TestCacheFeed(t *testing.T) {
	notify := make(chan string, 16)
	c := NewCache(CacheConfig{Notify: notify})
	f := c.Feed()
	val := func(b Binding) []byte {
		v, err := b.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	f.Start(2)
	if !f.Put("r.a", val(bound("a", "n1", 1, 0)), 3) || !f.Put("r.b", val(bound("b", "n2", 1, 0)), 5) {
		t.Fatal("an initial record did not change the cache")
	}
	if len(notify) != 0 {
		t.Fatalf("%d notifications before Ready, want 0", len(notify))
	}
	select {
	case <-c.Ready():
		t.Fatal("ready before Feed.Ready")
	default:
	}
	f.Ready()
	<-c.Ready()

	if f.Put("r.a", val(bound("a", "n2", 1, 0)), 4) {
		t.Fatal("a revision below the last one read changed the cache")
	}
	if !c.Apply(bound("a", "n2", 1, 6)) {
		t.Fatal("the writer's own record was not applied")
	}
	if f.Put("r.a", val(bound("a", "n2", 1, 0)), 6) {
		t.Fatal("the watch's copy of a record already applied changed the cache")
	}
	if !f.Delete("r.b", 7) {
		t.Fatal("a delete marker did not change the cache")
	}
	if _, ok := c.Lookup("b"); ok {
		t.Fatal("b still cached after its delete marker")
	}
	if got := c.Counts(); got["n2"] != 1 || len(got) != 1 {
		t.Fatalf("Counts = %v, want n2: 1", got)
	}
	var got []string
	for len(notify) > 0 {
		got = append(got, <-notify)
	}
	if strings.Join(got, ",") != "a,b" {
		t.Fatalf("notifications %v, want [a b] (the Apply, the delete)", got)
	}
}
