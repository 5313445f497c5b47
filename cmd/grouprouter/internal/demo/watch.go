package demo

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/localnats"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
)

// watcher sees the cluster as an operator would: the bindings bucket (a
// watched cache of it: groups per node, hand-overs in progress) and the
// events on grouping.events.>.
type watcher struct {
	nc    *nats.Conn
	cache *kvbinding.Cache
	sub   *nats.Subscription
	stop  context.CancelFunc
	done  chan struct{}

	mu    sync.Mutex
	kinds map[string]int // events by kind
	why   map[string]int // move events by reason
	// rebalancedTo counts the rebalance moves by target node.
	rebalancedTo map[string]int
	fresh        []proposals.Event          // events not shown yet (moves, hand-overs, timeouts...)
	latest       map[string]proposals.Event // each node's latest progress event
}

func startWatcher(ctx context.Context, c *localnats.Cluster) (*watcher, error) {
	nc, err := c.Connect(0, "demo-watcher")
	if err != nil {
		return nil, err
	}
	w := &watcher{nc: nc, kinds: map[string]int{}, why: map[string]int{}, rebalancedTo: map[string]int{}, latest: map[string]proposals.Event{}, done: make(chan struct{})}
	w.sub, err = nc.Subscribe(proposals.SubjectEventsPrefix+">", w.onEvent)
	if err != nil {
		nc.Close()
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	store, err := kvbinding.OpenStore(sctx, js, kvbinding.StoreConfig{})
	if err != nil {
		nc.Close()
		return nil, err
	}
	w.cache = kvbinding.NewCache(kvbinding.CacheConfig{})
	rctx, stop := context.WithCancel(context.Background())
	w.stop = stop
	go func() {
		defer close(w.done)
		_ = w.cache.Run(rctx, store)
	}()
	select {
	case <-w.cache.Ready():
		return w, nil
	case <-sctx.Done():
		w.close()
		return nil, sctx.Err()
	}
}

func (w *watcher) onEvent(m *nats.Msg) {
	var e proposals.Event
	if json.Unmarshal(m.Data, &e) != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.kinds[e.Kind]++
	switch e.Kind {
	case proposals.EventBind, proposals.EventReject:
		// one per new group: counted, not listed
	case proposals.EventProgress:
		w.latest[e.Node] = e
		w.fresh = append(w.fresh, e)
	case proposals.EventMove:
		why := e.Reason
		if cause, _, ok := strings.Cut(why, ":"); ok && cause == "rebalance" {
			why = cause // its reason says the counts of the moment
			w.rebalancedTo[e.Node]++
		}
		w.why[why]++
		w.fresh = append(w.fresh, e)
	default:
		w.fresh = append(w.fresh, e)
	}
}

// events returns the counts of events by kind, the events not returned
// before (moves, hand-overs, progress, timeouts...) and the latest
// progress event of each node.
func (w *watcher) events() (kinds map[string]int, fresh []proposals.Event, progress map[string]proposals.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	kinds = make(map[string]int, len(w.kinds))
	for k, v := range w.kinds {
		kinds[k] = v
	}
	progress = make(map[string]proposals.Event, len(w.latest))
	for k, v := range w.latest {
		progress[k] = v
	}
	fresh, w.fresh = w.fresh, nil
	return kinds, fresh, progress
}

// unsettled counts the groups in a hand-over by step: moving (the old
// node gives it up), drain and catchup (the new node takes it over).
func (w *watcher) unsettled() map[string]int {
	out := map[string]int{}
	for _, r := range w.cache.Unsettled() {
		switch r.Phase() {
		case kvbinding.PhaseMoving:
			out["moving"]++
		case kvbinding.PhaseDraining, kvbinding.PhaseCatchingUp:
			out[string(r.Step)]++
		}
	}
	return out
}

// rebalanced returns how many rebalance moves had node as their target.
func (w *watcher) rebalanced(node string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rebalancedTo[node]
}

// moveReasons returns the move events by reason.
func (w *watcher) moveReasons() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.why))
	for k, v := range w.why {
		out[k] = v
	}
	return out
}

func (w *watcher) close() {
	if w.stop != nil {
		w.stop()
		<-w.done
	}
	_ = w.sub.Unsubscribe()
	w.nc.Close()
}
