package proposals

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// checkedQueues checks, at each call, that no other call is in flight and
// that a resume is never made while a writer whose pause of the queue was
// done has not ended its drain (draining counts them, per node).
type checkedQueues struct {
	h        *Handler
	draining sync.Map // node -> *atomic.Int32
	inFlight atomic.Int32
	pauses   atomic.Int32
	resumes  atomic.Int32
	mu       sync.Mutex
	errs     []string
}

func (q *checkedQueues) fail(format string, args ...any) {
	q.mu.Lock()
	q.errs = append(q.errs, fmt.Sprintf(format, args...))
	q.mu.Unlock()
}

func (q *checkedQueues) call() func() {
	if n := q.inFlight.Add(1); n > 1 {
		q.fail("%d pause or resume calls in flight at once", n)
	}
	time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond) // the call's round trip
	return func() { q.inFlight.Add(-1) }
}

func (q *checkedQueues) Pause(ctx context.Context, node string, until time.Time) error {
	defer q.call()()
	q.pauses.Add(1)
	return nil
}

func (q *checkedQueues) Resume(ctx context.Context, node string) error {
	if n := q.drains(node).Load(); n > 0 {
		q.fail("resume of %s while %d writers that paused it drain it", node, n)
	}
	defer q.call()()
	q.resumes.Add(1)
	return nil
}

func (q *checkedQueues) drains(node string) *atomic.Int32 {
	v, _ := q.draining.LoadOrStore(node, new(atomic.Int32))
	return v.(*atomic.Int32)
}

func (q *checkedQueues) IngressLast(ctx context.Context) (uint64, error) { return 0, nil }

// TestPauserOrdersCalls runs writers that pause a node's queue and write a
// drain record (then end it) against the keeper resuming queues nobody
// drains: one call at a time, and no resume while a drain is in flight or
// recorded.
func TestPauserOrdersCalls(t *testing.T) {
	cache := kvbinding.NewCache(kvbinding.CacheConfig{})
	q := &checkedQueues{}
	h := NewHandler(nil, nil, cache, nil, HandlerConfig{Name: "g", Node: "n0", Queues: q})
	q.h = h
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	h.pauserRunning.Store(true)
	wg.Add(1)
	go func() {
		defer wg.Done()
		h.runPauser(ctx)
	}()
	nodes := []string{"n1", "n2"}
	var rev atomic.Uint64
	var writers sync.WaitGroup
	for w := 0; w < 8; w++ {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := 0; i < 40; i++ {
				node := nodes[rand.IntN(len(nodes))]
				group := fmt.Sprintf("g%d", w)
				h.pausingFor([]string{node}, 1)
				if err := h.pause(ctx, node); err != nil {
					t.Error(err)
				}
				q.drains(node).Add(1)
				cache.Apply(kvbinding.Binding{Group: group, State: kvbinding.StateBound, Node: "n0", PrevNode: node, FromSeq: 1,
					Step: kvbinding.StepDrain, Drain: []string{node}, Revision: rev.Add(1)})
				h.pausingFor([]string{node}, -1)
				time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
				q.drains(node).Add(-1)
				cache.Apply(kvbinding.Binding{Group: group, State: kvbinding.StateBound, Node: "n0", FromSeq: 1, Revision: rev.Add(1)})
				h.keepPaused()
				if i%8 == 0 {
					// A pause window gone by: the next pause calls again.
					h.mon.mu.Lock()
					clear(h.mon.paused)
					h.mon.mu.Unlock()
				}
			}
		}()
	}
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Microsecond):
				h.keepPaused()
			}
		}
	}()
	writers.Wait()
	close(stop)
	cancel()
	wg.Wait()
	for _, e := range q.errs {
		t.Error(e)
	}
	if q.pauses.Load() == 0 || q.resumes.Load() == 0 {
		t.Fatalf("%d pauses and %d resumes: the test exercised nothing", q.pauses.Load(), q.resumes.Load())
	}
	t.Logf("%d pauses, %d resumes", q.pauses.Load(), q.resumes.Load())
}

// recordedQueues records resumes.
type recordedQueues struct {
	resumed chan string
}

func (q *recordedQueues) Pause(ctx context.Context, node string, until time.Time) error { return nil }
func (q *recordedQueues) Resume(ctx context.Context, node string) error {
	select {
	case q.resumed <- node:
	default:
	}
	return nil
}
func (q *recordedQueues) IngressLast(ctx context.Context) (uint64, error) { return 1 << 40, nil }

// A drained queue stays paused through the catch-up that follows its
// drain, and the write that ends that catch-up (reported done) has it
// resumed at once, not at the handler's next tick: every moment it stays
// paused holds back all of its node's groups.
func TestDrainedQueueResumedAtOnceAfterItsCatchUp(t *testing.T) {
	s := natstest.RunServer(t)
	q := &recordedQueues{resumed: make(chan string, 8)}
	e := startHandler(t, s, "n0", liveNodes, func(c *HandlerConfig) {
		c.Queues = q
		c.LeaseTTL = 20 * time.Second // ticks 5 s apart: none resumes within the test
	})
	natstest.Eventually(t, 5*time.Second, func() error {
		if !e.h.Active() {
			return natstest.ErrNotYet
		}
		return nil
	})
	ctx := context.Background()
	b, err := e.h.store.Create(ctx, kvbinding.Binding{Group: "g", State: kvbinding.StateBound, Node: "n2", PrevNode: "n1", FromSeq: 1,
		Step: kvbinding.StepDrain, Drain: []string{"n1"}})
	if err != nil {
		t.Fatal(err)
	}
	natstest.Eventually(t, 5*time.Second, func() error {
		if r, ok := e.h.cache.Lookup("g"); !ok || r.Revision != b.Revision {
			return natstest.ErrNotYet
		}
		return nil
	})
	if err := e.h.pause(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	c := NewClient(s.Connect(), "n2", 5*time.Second)
	report := func(op Op, rev uint64) uint64 {
		t.Helper()
		ds, err := c.Propose(ctx, []Proposal{{Op: op, Group: "g", Rev: rev}})
		if err != nil {
			t.Fatal(err)
		}
		if ds[0].Outcome != Accepted {
			t.Fatalf("%s report: %+v", op, ds[0])
		}
		return ds[0].Revision
	}
	rev := report(OpDrained, b.Revision)
	// A keeper's run, as at its tick, then a pause the pauser takes after
	// it.
	e.h.keepPaused()
	if err := e.h.pause(ctx, "n3"); err != nil {
		t.Fatal(err)
	}
	select {
	case node := <-q.resumed:
		t.Fatalf("%s resumed while the group is caught up from n1", node)
	default:
	}
	natstest.Eventually(t, 5*time.Second, func() error {
		if r, ok := e.h.cache.Lookup("g"); !ok || r.Revision != rev {
			return natstest.ErrNotYet
		}
		return nil
	})
	report(OpCaughtUp, rev)
	select {
	case node := <-q.resumed:
		if node != "n1" && node != "n3" {
			t.Fatalf("resumed %s, want n1", node)
		}
		if node == "n3" {
			if node = <-q.resumed; node != "n1" {
				t.Fatalf("resumed %s, want n1", node)
			}
		}
	case <-time.After(2 * time.Second):
		t.Fatal("n1's queue not resumed within 2 s of its catch-up's end")
	}
}

func TestEndsPause(t *testing.T) {
	drain := &kvbinding.Binding{State: kvbinding.StateBound, Step: kvbinding.StepDrain, PrevNode: "n1", Drain: []string{"n1", "n2"}}
	catchUp := func(prev string) kvbinding.Binding {
		return kvbinding.Binding{State: kvbinding.StateBound, Step: kvbinding.StepCatchUp, PrevNode: prev}
	}
	for _, tt := range []struct {
		name string
		cur  *kvbinding.Binding
		next kvbinding.Binding
		want bool
	}{
		{"no record", nil, kvbinding.Binding{}, false},
		{"nothing paused", &kvbinding.Binding{}, kvbinding.Binding{}, false},
		{"the same drain", drain, kvbinding.Binding{Drain: []string{"n1", "n2"}}, false},
		{"a wider drain", drain, kvbinding.Binding{Drain: []string{"n2", "n1", "n3"}}, false},
		{"a queue left out", drain, kvbinding.Binding{Drain: []string{"n1"}}, true},
		{"no drain", drain, kvbinding.Binding{}, true},
		{"a catch-up from the only drained queue", &kvbinding.Binding{State: kvbinding.StateBound, Step: kvbinding.StepDrain,
			PrevNode: "n1", Drain: []string{"n1"}}, catchUp("n1"), false},
		{"a catch-up from one of two drained queues", drain, catchUp("n1"), true},
		{"the catch-up done", &kvbinding.Binding{State: kvbinding.StateBound, Step: kvbinding.StepCatchUp, PrevNode: "n1"},
			kvbinding.Binding{State: kvbinding.StateBound, PrevNode: "n1"}, true},
		{"the catch-up goes on", &kvbinding.Binding{State: kvbinding.StateBound, Step: kvbinding.StepCatchUp, PrevNode: "n1"},
			catchUp("n1"), false},
	} {
		if got := EndsPause(tt.cur, tt.next); got != tt.want {
			t.Errorf("%s: EndsPause = %v, want %v", tt.name, got, tt.want)
		}
	}
}
