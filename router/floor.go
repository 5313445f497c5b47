package router

import (
	"context"
	"errors"

	"github.com/grouprouter/grouprouter/kvbinding"
)

// loadFloor reads the routing floor (proposals.NextFloor) at start: a node
// without a checkpoint starts reading the ingress there, and drops the
// messages below it that no binding covers (they were routed under a
// binding that has ended since). A floor that does not decode, or lies
// past the ingress stream's end (a recreated stream), counts as none: the
// node falls back to reading what it would read without one.
func (r *Router) loadFloor(ctx context.Context) (uint64, error) {
	f, _, err := r.reg.LoadFloor(ctx)
	if errors.Is(err, kvbinding.ErrInvalidFloor) {
		r.log.Error("the routing floor is invalid; starting without one", "err", err)
		return 0, nil
	}
	if err != nil || f.Seq == 0 {
		return 0, err
	}
	last, err := r.ingressLast(ctx)
	if err != nil {
		return 0, err
	}
	if f.Seq > last+1 {
		r.log.Warn("the routing floor is past the ingress stream's end (was the stream recreated?); starting without one",
			"floor", f.Seq, "ingress_last", last)
		return 0, nil
	}
	return f.Seq, nil
}

// withFloor returns where a node resumes given the routing floor: from
// its checkpoint if it has one (its own groups may still have messages
// below the floor to route), else from the floor.
func withFloor(resume resumePoint, floor uint64) resumePoint {
	if resume.ckpt.Next == 0 && floor > 0 {
		return resumePoint{ckpt: kvbinding.Checkpoint{Next: floor}}
	}
	return resume
}
