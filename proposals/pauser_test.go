package proposals

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
