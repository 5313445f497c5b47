package kvbinding

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func longID(c string) string { return strings.Repeat(c, 1000) }

// TestCacheDigestKeys: a record under a digest key is cached under the
// group its value names, and its delete (which carries no value) removes
// it; a record whose group's key is another, or that names another group
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
	c.applyEntry(ka, opPut, val(a, "n1"), 1)
	if r, ok := c.Lookup(a); !ok || r.Node != "n1" || r.Revision != 1 {
		t.Fatalf("Lookup(a) = %+v, %v", r, ok)
	}
	// A fake collision: a's record under b's key. b is not routed by it,
	// and a's record stands.
	c.applyEntry(kb, opPut, val(a, "n2"), 2)
	if _, ok := c.Lookup(b); ok {
		t.Fatal("b is routed by a record of a under b's key")
	}
	if r, _ := c.Lookup(a); r.Node != "n1" || r.Revision != 1 {
		t.Fatalf("a's record changed by a record under another key: %+v", r)
	}
	// The key of a, holding b's record afterwards (forged): refused, a
	// marked as having a bad value, b not routed.
	c.applyEntry(ka, opPut, val(b, "n2"), 3)
	if _, ok := c.Lookup(b); ok {
		t.Fatal("b is routed by a record under a's key")
	}
	if c.Bad()[a] != 3 {
		t.Fatalf("Bad = %v, want a at 3", c.Bad())
	}
	if c.Ignored() != 2 {
		t.Fatalf("Ignored = %d, want 2", c.Ignored())
	}
	// The delete of a's key names no group: the cache knows it.
	c.applyEntry(ka, opDelete, nil, 4)
	if _, ok := c.Lookup(a); ok {
		t.Fatal("a's record outlived the delete of its digest key")
	}
	if len(c.digests) != 0 {
		t.Fatalf("digests after the delete: %v", c.digests)
	}
	// A delete of a digest key the cache never held changes nothing.
	c.applyEntry(kb, opDelete, nil, 5)
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
	c.applyEntry(full, opPut, v, 1)
	if r, ok := c.Lookup(a); !ok || r.Node != "n1" {
		t.Fatalf("Lookup = %+v, %v", r, ok)
	}
	if k, ok := c.LegacyKey(a); !ok || k != full {
		t.Fatalf("LegacyKey = %.20q, %v; want the full key", k, ok)
	}
	c.applyEntry(full, opDelete, nil, 2)
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
