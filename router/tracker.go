package router

import "grouprouter/kvbinding"

// tracker records which ingress sequences are done (routed, skipped or
// dead-lettered) so that a checkpoint can say exactly what is left. Sequences
// are added in increasing order; gaps (deleted or expired messages) count as done.
type tracker struct {
	base uint64 // sequence of done[0]
	done []bool
}

// next returns the next sequence expected.
func (t *tracker) next() uint64 { return t.base + uint64(len(t.done)) }

// add records that seq was read and is not done yet.
func (t *tracker) add(seq uint64) {
	if t.base == 0 {
		t.base = seq
	}
	for t.next() < seq {
		t.done = append(t.done, true)
	}
	if seq < t.next() {
		return // redelivered: already tracked
	}
	t.done = append(t.done, false)
	t.compact()
}

// resolve marks seq done.
func (t *tracker) resolve(seq uint64) {
	if seq < t.base || seq >= t.next() {
		return
	}
	t.done[seq-t.base] = true
	t.compact()
}

func (t *tracker) compact() {
	i := 0
	for i < len(t.done) && t.done[i] {
		i++
	}
	if i > 0 {
		t.done = t.done[i:]
		t.base += uint64(i)
	}
}

// maxPendingRanges bounds a checkpoint's size; past it the checkpoint keeps
// only the low watermark (resuming then re-routes more, which the queue
// stream's duplicate window absorbs).
const maxPendingRanges = 4096

// checkpoint returns what is left to do: every sequence below Next is done
// except the Pending ranges.
func (t *tracker) checkpoint() kvbinding.Checkpoint {
	c := kvbinding.Checkpoint{Next: t.next()}
	if c.Next == 0 {
		return c
	}
	for i := 0; i < len(t.done); i++ {
		if t.done[i] {
			continue
		}
		j := i
		for j+1 < len(t.done) && !t.done[j+1] {
			j++
		}
		c.Pending = append(c.Pending, [2]uint64{t.base + uint64(i), t.base + uint64(j)})
		if len(c.Pending) > maxPendingRanges {
			return kvbinding.Checkpoint{Next: t.base}
		}
		i = j
	}
	return c
}

// resumePoint is where to start reading to honour a checkpoint, and which
// sequences before c.Next are to be skipped.
type resumePoint struct {
	ckpt kvbinding.Checkpoint
}

// start returns the first sequence to read.
func (r resumePoint) start() uint64 {
	if len(r.ckpt.Pending) > 0 {
		return r.ckpt.Pending[0][0]
	}
	return r.ckpt.Next
}

// done reports whether seq was finished before the checkpoint was taken.
func (r resumePoint) done(seq uint64) bool {
	if seq >= r.ckpt.Next {
		return false
	}
	for _, p := range r.ckpt.Pending {
		if seq >= p[0] && seq <= p[1] {
			return false
		}
	}
	return true
}
