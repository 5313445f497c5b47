package router

import (
	"sort"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// tracker records which ingress sequences are done (routed, skipped or
// dead-lettered) so that a checkpoint can say exactly what is left.
// Sequences are added in increasing order; gaps (deleted, expired or purged
// messages) count as done and cost no memory: the sequences since the
// oldest one not done are kept in segments that start after each gap.
type tracker struct {
	segs []segment
	// nextSeq is the next sequence expected (0: nothing added yet).
	nextSeq uint64
}

// segment is a run of consecutive sequences from base.
type segment struct {
	base uint64
	done []bool
}

// next returns the next sequence expected.
func (t *tracker) next() uint64 { return t.nextSeq }

// add records that seq was read and is not done yet.
func (t *tracker) add(seq uint64) {
	if seq < t.nextSeq {
		return // redelivered: already tracked
	}
	if n := len(t.segs); n > 0 && seq == t.nextSeq {
		t.segs[n-1].done = append(t.segs[n-1].done, false)
	} else {
		t.segs = append(t.segs, segment{base: seq, done: []bool{false}})
	}
	t.nextSeq = seq + 1
}

// resolve marks seq done.
func (t *tracker) resolve(seq uint64) {
	i := sort.Search(len(t.segs), func(i int) bool { return t.segs[i].base > seq }) - 1
	if i < 0 {
		return
	}
	s := &t.segs[i]
	if seq >= s.base+uint64(len(s.done)) {
		return
	}
	s.done[seq-s.base] = true
	if i == 0 {
		t.compact()
	}
}

// compact drops the done sequences at the front.
func (t *tracker) compact() {
	for len(t.segs) > 0 {
		s := &t.segs[0]
		j := 0
		for j < len(s.done) && s.done[j] {
			j++
		}
		if j < len(s.done) {
			if j > 0 {
				s.done = s.done[j:]
				s.base += uint64(j)
			}
			return
		}
		t.segs[0] = segment{}
		t.segs = t.segs[1:]
	}
}

// maxPendingRanges bounds a checkpoint's size; past it the checkpoint keeps
// only the low watermark (resuming then re-routes more, which the queue
// stream's duplicate window absorbs).
const maxPendingRanges = 4096

// checkpoint returns what is left to do: every sequence below Next is done
// except the Pending ranges.
func (t *tracker) checkpoint() kvbinding.Checkpoint {
	c := kvbinding.Checkpoint{Next: t.nextSeq}
	if c.Next == 0 {
		return c
	}
	for _, s := range t.segs {
		for i := 0; i < len(s.done); i++ {
			if s.done[i] {
				continue
			}
			j := i
			for j+1 < len(s.done) && !s.done[j+1] {
				j++
			}
			c.Pending = append(c.Pending, [2]uint64{s.base + uint64(i), s.base + uint64(j)})
			if len(c.Pending) > maxPendingRanges {
				return kvbinding.Checkpoint{Next: t.segs[0].base}
			}
			i = j
		}
	}
	return c
}

// resumePoint is where to start reading to honour a checkpoint, and which
// sequences before c.Next are to be skipped.
type resumePoint struct {
	ckpt kvbinding.Checkpoint
}

// start returns the first sequence to read.
func (r resumePoint) start() uint64 { return r.ckpt.Start() }

// done reports whether seq was finished before the checkpoint was taken.
func (r resumePoint) done(seq uint64) bool { return r.ckpt.Done(seq) }
