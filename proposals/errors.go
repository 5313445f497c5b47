package proposals

import "errors"

var (
	// ErrDecisionTimeout is returned when no reply came within the timeout.
	ErrDecisionTimeout = errors.New("proposals: routing decision timed out")
	// ErrNoHandler is returned when no LOCAL handler is subscribed.
	ErrNoHandler = errors.New("proposals: no LOCAL grouping handler is answering")
	// ErrBadMessage is returned for a proposal request or reply that does
	// not decode or breaks the protocol's limits.
	ErrBadMessage = errors.New("proposals: malformed message")
	// ErrHandlerFailed is returned when the handler answered with an error.
	ErrHandlerFailed = errors.New("proposals: handler failed")
)
