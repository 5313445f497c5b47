package kvbinding

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/grouprouter/grouprouter/internal/natstest"
)

// TestStoreAdvance: Advance writes the fill key until the bucket's last
// revision reaches the one asked for (more than one pipelined round), and
// does nothing but one write when the bucket is past it already; a watching
// cache and List ignore the fill key, and the next record's revision is
// past the one asked for.
func TestStoreAdvance(t *testing.T) {
	st, _ := openTestStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cache := NewCache(CacheConfig{})
	go func() { _ = cache.Run(ctx, st) }()
	<-cache.Ready()
	first, err := st.Create(ctx, bound("a", "n1", 1, 0))
	if err != nil {
		t.Fatal(err)
	}
	through := first.Revision + 2*advanceWindow + 10
	last, err := st.Advance(ctx, through)
	if err != nil || last < through {
		t.Fatalf("Advance(%d) = %d, %v", through, last, err)
	}
	if again, err := st.Advance(ctx, through); err != nil || again != last+1 {
		t.Fatalf("Advance(%d) again = %d, %v; want one write, %d", through, again, err, last+1)
	}
	b, err := st.Create(ctx, bound("b", "n1", 2, 0))
	if err != nil || b.Revision <= through {
		t.Fatalf("next record at revision %d (%v), want past %d", b.Revision, err, through)
	}
	natstest.Eventually(t, 10*time.Second, func() error {
		if n := cache.Len(); n != 2 || len(cache.Bad()) != 0 {
			return fmt.Errorf("cache holds %d records (bad %v), want a and b", n, cache.Bad())
		}
		if d := cache.Delivered(); d < b.Revision {
			return fmt.Errorf("cache read through %d of %d", d, b.Revision)
		}
		return nil
	})
	bs, err := st.List(ctx)
	if err != nil || len(bs) != 2 {
		t.Fatalf("List = %v, %v; want a and b", bs, err)
	}
}
