package proposals

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/kvbinding"
)

// TestEvacuationNamesLongIDs: the cache keeps no settled long id, so the
// evacuation of a gone node reads the ids of its long groups back from
// their records: every group of the node, long or short, is moved off it,
// and the records written name the full ids.
func TestEvacuationNamesLongIDs(t *testing.T) {
	s := natstest.RunServer(t)
	env := startHandler(t, s, "n2", liveNodes)
	h := env.h
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, _ := jetstream.New(env.nc)
	st, err := kvbinding.OpenStore(ctx, js, kvbinding.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	groups := []string{"short-1"}
	for i := range 12 { // more than Names reads one by one
		groups = append(groups, fmt.Sprintf("long-%02d-", i)+strings.Repeat("x", 990))
	}
	for _, g := range groups {
		if _, err := st.Create(ctx, kvbinding.Binding{Group: g, State: kvbinding.StateBound, Node: "n1", FromSeq: 1, DecidedBy: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	// (The handler may rebalance some of them meanwhile: n2 has none.)
	natstest.Eventually(t, 10*time.Second, func() error {
		for _, g := range groups {
			if _, ok := h.cache.Lookup(g); !ok {
				return fmt.Errorf("%.12s not in the cache yet", g)
			}
		}
		return nil
	})
	h.evacuate(ctx, "n1", nil, "test: n1 gone", causeNodeGone)
	for _, g := range groups {
		r, err := st.Get(ctx, g)
		if err != nil {
			t.Fatalf("%.12s: %v", g, err)
		}
		if r.Group != g || (r.Settled() && r.Node == "n1") {
			t.Fatalf("%.12s is still on n1 after the evacuation: %+v", g, r)
		}
	}
}
