package router

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestTopKKeepsTheSmallest(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 5, 99, 100, 101, 1000} {
		for _, k := range []int{0, 1, 3, 100} {
			vals := make([]int, n)
			for i := range vals {
				vals[i] = rng.IntN(50) // duplicates too
			}
			tk := newTopK(k, func(a, b int) bool { return a < b })
			for _, v := range vals {
				tk.offer(v)
			}
			want := slices.Clone(vals)
			slices.Sort(want)
			want = want[:min(k, n)]
			if got := tk.sorted(); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
				t.Fatalf("n=%d k=%d: got %v, want %v", n, k, got, want)
			}
			if tk.seen != n {
				t.Fatalf("n=%d k=%d: seen %d", n, k, tk.seen)
			}
		}
	}
}
