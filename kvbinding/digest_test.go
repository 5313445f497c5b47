package kvbinding

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func longID(c string) string { return strings.Repeat(c, 1000) }

// TestCacheDigestKeys: a record under a digest key is cached under the
// key's ref (never the id its value names), and its delete (which carries
// no value) removes it; a record whose group's key is another, or that names another group
// than the one the key held, is refused and routes nothing.
func TestCacheDigestKeys(t *testing.T) {
	c := NewCache(CacheConfig{})
	c.warm.Store(true)
	a, b := longID("a"), longID("b")
	ka, _ := Key(a)
	kb, _ := Key(b)
	val := func(group, node string) []byte {
		v, err := Binding{Group: group, State: StateBound, Node: node, FromSeq: 3, DecidedBy: "h"}.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	c.Feed().Put(ka, val(a, "n1"), 1)
	if r, ok := c.Lookup(a); !ok || r.Node != "n1" || r.Revision != 1 {
		t.Fatalf("Lookup(a) = %+v, %v", r, ok)
	}
	// A fake collision: a's record under b's key. b is not routed by it,
	// and a's record stands.
	c.Feed().Put(kb, val(a, "n2"), 2)
	if _, ok := c.Lookup(b); ok {
		t.Fatal("b is routed by a record of a under b's key")
	}
	if r, _ := c.Lookup(a); r.Node != "n1" || r.Revision != 1 {
		t.Fatalf("a's record changed by a record under another key: %+v", r)
	}
	// The key of a, holding b's record afterwards (forged): refused, a
	// marked as having a bad value, b not routed.
	c.Feed().Put(ka, val(b, "n2"), 3)
	if _, ok := c.Lookup(b); ok {
		t.Fatal("b is routed by a record under a's key")
	}
	if c.Bad()[Ref(a)] != 3 {
		t.Fatalf("Bad = %v, want a's ref at 3", c.Bad())
	}
	if c.Ignored() != 2 {
		t.Fatalf("Ignored = %d, want 2", c.Ignored())
	}
	// The delete of a's key names no group: the cache knows it.
	c.Feed().Delete(ka, 4)
	if _, ok := c.Lookup(a); ok {
		t.Fatal("a's record outlived the delete of its digest key")
	}
	if len(c.m) != 0 || len(c.bad) != 0 {
		t.Fatalf("entries after the delete: %d, bad %v", len(c.m), c.bad)
	}
	// A delete of a digest key the cache never held changes nothing.
	c.Feed().Delete(kb, 5)
	if c.Len() != 0 {
		t.Fatalf("Len = %d after deletes, want 0", c.Len())
	}
}

// TestCacheLegacyKeys: a record of a long id under its full key (written
// before digest keys) is read, LegacyKey names that key while it stands,
// and forgets it once the record is deleted.
func TestCacheLegacyKeys(t *testing.T) {
	c := NewCache(CacheConfig{})
	a := longID("a")
	full, _ := FullKey(a)
	v, _ := Binding{Group: a, State: StateBound, Node: "n1", FromSeq: 3, DecidedBy: "h"}.Marshal()
	c.Feed().Put(full, v, 1)
	if r, ok := c.Lookup(a); !ok || r.Node != "n1" {
		t.Fatalf("Lookup = %+v, %v", r, ok)
	}
	if k, ok := c.LegacyKey(a); !ok || k != full {
		t.Fatalf("LegacyKey = %.20q, %v; want the full key", k, ok)
	}
	c.Feed().Delete(full, 2)
	if _, ok := c.LegacyKey(a); ok {
		t.Fatal("LegacyKey names a deleted record's key")
	}
}

// TestStoreDigestKeys runs the store on a real bucket: a long id's record
// is written under its digest key and read back; a fake collision (the
// record of another group under the asked group's key) is ErrKeyCollision,
// never the other group's record; a record written before digest keys,
// under the full key, is read, and with the cache's LegacyKey updated in
// place rather than duplicated under the digest key.
func TestStoreDigestKeys(t *testing.T) {
	st, _ := openTestStore(t)
	ctx := context.Background()
	a, b, old := longID("a"), longID("b"), longID("o")

	rec, err := st.Create(ctx, bound(a, "n1", 5, 0))
	if err != nil {
		t.Fatal(err)
	}
	ka, _ := Key(a)
	if e, err := st.KV().Get(ctx, ka); err != nil || e.Revision() != rec.Revision {
		t.Fatalf("the record is not under the digest key %q: %v", ka, err)
	}
	if got, err := st.Get(ctx, a); err != nil || got.Node != "n1" || got.Group != a {
		t.Fatalf("Get(a) = %+v, %v", got, err)
	}

	// Fake collision: a's record under b's key.
	kb, _ := Key(b)
	va, _ := bound(a, "n2", 6, 0).Marshal()
	if _, err := st.KV().Put(ctx, kb, va); err != nil {
		t.Fatal(err)
	}
	if got, err := st.Get(ctx, b); !errors.Is(err, ErrKeyCollision) {
		t.Fatalf("Get(b) = %+v, %v; want ErrKeyCollision", got, err)
	}
	if got, err := st.Create(ctx, bound(b, "n1", 7, 0)); !errors.Is(err, ErrKeyCollision) || got.Group == a {
		t.Fatalf("Create(b) = %+v, %v; want ErrKeyCollision and not a's record", got, err)
	}
	var listed []string
	if err := ScanBindings(ctx, st.js, "", func(r Binding) error { listed = append(listed, r.Group[:1]); return nil }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(listed, ",") != "a" {
		t.Fatalf("ScanBindings listed %v, want only a (the record under b's key is not b's)", listed)
	}

	// A legacy record: old's record under its full key.
	full, _ := FullKey(old)
	vo, _ := bound(old, "n3", 8, 0).Marshal()
	legacyRev, err := st.KV().Put(ctx, full, vo)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := st.Get(ctx, old); err != nil || got.Node != "n3" || got.Revision != legacyRev {
		t.Fatalf("Get(old) without the cache = %+v, %v; want the legacy record", got, err)
	}
	c := NewCache(CacheConfig{})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, st) }()
	defer func() { stop(); <-done }()
	<-c.Ready()
	st.UseLegacyKeys(c.LegacyKey)
	if r, ok := c.Lookup(old); !ok || r.Node != "n3" {
		t.Fatalf("cache Lookup(old) = %+v, %v", r, ok)
	}
	moved := bound(old, "n1", 9, 0)
	up, err := st.Replace(ctx, moved, legacyRev)
	if err != nil {
		t.Fatalf("Replace of the legacy record: %v", err)
	}
	ko, _ := Key(old)
	if _, err := st.KV().Get(ctx, ko); err == nil {
		t.Fatal("the update wrote a second record under the digest key")
	}
	if e, err := st.KV().Get(ctx, full); err != nil || e.Revision() != up.Revision {
		t.Fatalf("the legacy key does not hold the update: %v", err)
	}
	if _, err := st.Create(ctx, bound(old, "n2", 10, 0)); !errors.Is(err, ErrExists) {
		t.Fatalf("Create over the legacy record = %v, want ErrExists", err)
	}
}

// TestRef: a group with a full key is its own ref; a long id's ref is the
// mark and its digest key, the same whether it is plain or not, and never
// a group id.
func TestRef(t *testing.T) {
	for _, tc := range []struct {
		name, group string
		digest      bool
	}{
		{"ungrouped", "", false},
		{"short plain", "order-42", false},
		{"62 plain characters", strings.Repeat("p", 62), false},
		{"63 plain characters", strings.Repeat("p", 63), true},
		{"short, not plain (a base64 key of 62 bytes)", strings.Repeat("é", 22) + "a", false},
		{"47 bytes, not plain (a base64 key of 65 bytes)", "a.b" + strings.Repeat("c", 44), true},
		{"1000 bytes", longID("a"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := Ref(tc.group)
			key, err := Key(tc.group)
			if tc.group != "" && err != nil {
				t.Fatal(err)
			}
			if IsRef(ref) != tc.digest || IsDigestKey(key) != tc.digest {
				t.Fatalf("Ref = %.20q (IsRef %v), Key = %.20q; want digest %v", ref, IsRef(ref), key, tc.digest)
			}
			if tc.digest && (ref != "\xff"+key || ValidateGroupID(ref) == nil) {
				t.Fatalf("Ref = %q, want the mark and key %q, not a group id", ref, key)
			}
			if !tc.digest && ref != tc.group {
				t.Fatalf("Ref = %q, want the id", ref)
			}
		})
	}
}

// TestCacheKeepsNoLongID: the cache holds a settled long id's record by
// its ref, without the id, and notifies the ref; it keeps the id while
// the record is unsettled (the handler's monitor and takeovers need it)
// and drops it once the record settles again.
func TestCacheKeepsNoLongID(t *testing.T) {
	notes := make(chan string, 8)
	c := NewCache(CacheConfig{Notify: notes})
	c.warm.Store(true)
	a := longID("a")
	ka, _ := Key(a)
	put := func(b Binding, rev uint64) {
		t.Helper()
		v, err := b.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		c.Feed().Put(ka, v, rev)
		if got := <-notes; got != Ref(a) {
			t.Fatalf("notified %.20q, want a's ref", got)
		}
	}
	put(Binding{Group: a, State: StateBound, Node: "n1", FromSeq: 3, DecidedBy: "h"}, 1)
	if r, ok := c.Lookup(Ref(a)); !ok || r.Node != "n1" || r.Group != "" {
		t.Fatalf("Lookup(ref) = %+v, %v; want n1's record, no id", r, ok)
	}
	if r, ok := c.Lookup(a); !ok || r.Group != a {
		t.Fatalf("Lookup(a) = %.40q, %v; want the id asked for", r.Group, ok)
	}
	if refs := c.RefsOf("n1"); len(refs) != 1 || refs[0] != Ref(a) {
		t.Fatalf("RefsOf(n1) = %q", refs)
	}
	if len(c.unsettled) != 0 {
		t.Fatalf("a settled record keeps %d ids", len(c.unsettled))
	}
	put(Binding{Group: a, State: StateMoving, Node: "n2", PrevNode: "n1", FromSeq: 5, Epoch: 1, DecidedBy: "h"}, 2)
	if r, _ := c.Lookup(Ref(a)); r.Group != a {
		t.Fatalf("an unsettled record looked up by ref names %.20q", r.Group)
	}
	if u := c.Unsettled(); u[a].State != StateMoving {
		t.Fatalf("Unsettled = %v", u)
	}
	put(Binding{Group: a, State: StateBound, Node: "n2", FromSeq: 5, Epoch: 2, DecidedBy: "h"}, 3)
	if r, _ := c.Lookup(Ref(a)); r.Group != "" || len(c.unsettled) != 0 {
		t.Fatalf("the settled record still names its id (%d kept)", len(c.unsettled))
	}
	c.Feed().Delete(ka, 4)
	if got := <-notes; got != Ref(a) {
		t.Fatalf("the delete notified %.20q, want a's ref", got)
	}
}

// TestStoreNames: Names reads the ids of long refs from the bucket, one by
// one or in one scan, names short ids by themselves, and leaves out a ref
// whose record is gone.
func TestStoreNames(t *testing.T) {
	st, _ := openTestStore(t)
	ctx := context.Background()
	var refs []string
	want := map[string]string{}
	for i := range 12 {
		g := fmt.Sprintf("%02d-", i) + longID("n")[3:]
		if _, err := st.Create(ctx, bound(g, "n1", 1, 0)); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, Ref(g))
		want[Ref(g)] = g
	}
	refs = append(refs, "short", Ref(longID("z"))) // never written
	want["short"] = "short"
	for _, n := range []int{3, len(refs)} { // by Get, then by a scan
		got, err := st.Names(ctx, refs[len(refs)-n:])
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range refs[len(refs)-n:] {
			if got[r] != want[r] {
				t.Fatalf("n=%d: Names[%.12q] = %.12q, want %.12q", n, r, got[r], want[r])
			}
		}
		if _, ok := got[Ref(longID("z"))]; ok {
			t.Fatal("a ref with no record was named")
		}
	}
}
