package router

// topK keeps the k smallest of the values offered to it under less, in
// O(log k) per offer, so that a list of the first k of hundreds of
// thousands of lanes (an announcement's busy and waiting groups) costs
// neither a sort of them all nor a copy of each.
type topK[T any] struct {
	k    int
	less func(a, b T) bool
	h    []T // a max-heap under less: the largest kept value at h[0]
	seen int // values offered
}

func newTopK[T any](k int, less func(a, b T) bool) *topK[T] {
	return &topK[T]{k: k, less: less}
}

// offer considers v.
func (t *topK[T]) offer(v T) {
	t.seen++
	if t.k <= 0 {
		return
	}
	if len(t.h) < t.k {
		t.h = append(t.h, v)
		t.up(len(t.h) - 1)
		return
	}
	if !t.less(v, t.h[0]) {
		return
	}
	t.h[0] = v
	t.down(0)
}

// sorted returns the kept values, smallest first. The topK must not be
// used afterwards.
func (t *topK[T]) sorted() []T {
	out := make([]T, len(t.h))
	for i := len(t.h) - 1; i >= 0; i-- {
		out[i] = t.h[0]
		last := len(t.h) - 1
		t.h[0] = t.h[last]
		t.h = t.h[:last]
		t.down(0)
	}
	return out
}

func (t *topK[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !t.less(t.h[p], t.h[i]) {
			return
		}
		t.h[p], t.h[i] = t.h[i], t.h[p]
		i = p
	}
}

func (t *topK[T]) down(i int) {
	n := len(t.h)
	for {
		big := i
		if l := 2*i + 1; l < n && t.less(t.h[big], t.h[l]) {
			big = l
		}
		if r := 2*i + 2; r < n && t.less(t.h[big], t.h[r]) {
			big = r
		}
		if big == i {
			return
		}
		t.h[i], t.h[big] = t.h[big], t.h[i]
		i = big
	}
}
