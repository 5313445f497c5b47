package router

import "time"

// window bounds the proposals a node has in flight to the handler, and
// adapts the bound to the handler's replies as TCP's congestion window
// does (additive increase, multiplicative decrease): every answered
// proposal widens it by about one batch per window's worth of replies; a
// request that timed out halves it, at most once per timeout (the
// requests of one overload time out together and count as one signal).
// A burst of new groups is then asked at the rate the handler decides,
// instead of in requests that wait in its queue until they time out and
// are all asked again.
//
// It is pure: no clock (time comes as an argument), no I/O; the engine
// holds it under its lock.
type window struct {
	limit    float64   // proposals allowed in flight
	min, max float64   // bounds of limit
	step     float64   // proposals added per window's worth of replies
	inFlight int       // proposals sent and not answered yet
	quiet    time.Time // no further cut before this
	cuts     uint64    // times the window was halved
}

// newWindow returns a window starting wide open at max proposals, never
// narrower than min, growing by step per window of replies.
func newWindow(min, max, step int) window {
	return window{limit: float64(max), min: float64(min), max: float64(max), step: float64(step)}
}

// room returns how many more proposals may be sent now.
func (w *window) room() int {
	return max(int(w.limit)-w.inFlight, 0)
}

// sent records n proposals sent.
func (w *window) sent(n int) { w.inFlight += n }

// unsent records n proposals counted by sent that were not sent after all
// (the node stopped).
func (w *window) unsent(n int) { w.inFlight = max(w.inFlight-n, 0) }

// answered records a reply to a request of n proposals, or its timeout
// (timedOut) after which another cut waits for quiet (the timeout). Other
// failures (no handler, a refused request) say nothing of the handler's
// load and leave the limit as it is.
func (w *window) answered(n int, timedOut, otherFailure bool, quiet time.Duration, now time.Time) {
	w.inFlight = max(w.inFlight-n, 0)
	switch {
	case timedOut:
		if now.Before(w.quiet) {
			return
		}
		w.limit = max(w.limit/2, w.min)
		w.quiet = now.Add(quiet)
		w.cuts++
	case otherFailure:
	default:
		w.limit = min(w.limit+w.step*float64(n)/w.limit, w.max)
	}
}
