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
	// ErrUnknownGroup is returned when moving or unbinding a group that is not bound.
	ErrUnknownGroup = errors.New("proposals: group is not bound")
	// ErrIneligibleNode is returned when moving a group to a node that is
	// not alive or has no queue consumer while others have one.
	ErrIneligibleNode = errors.New("proposals: node is not eligible")
	// ErrMoveInProgress is returned when a group is already changing hands.
	ErrMoveInProgress = errors.New("proposals: group is being moved")
	// ErrBelowFloor is the cause of a bind refused because its sequence is
	// below the routing floor: the cluster routed those messages already
	// (see NextFloor).
	ErrBelowFloor = errors.New("proposals: below the routing floor")
	// ErrGroupLimit is the cause of a bind refused because the cluster
	// has as many groups bound as its limit (HandlerConfig.MaxGroups):
	// the asker dead-letters the group's messages.
	ErrGroupLimit = errors.New("proposals: the group limit is reached")
)
