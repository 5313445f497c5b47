package router

import "errors"

var (
	// ErrConfig is wrapped by every configuration error.
	ErrConfig = errors.New("grouping: invalid configuration")
	// ErrStreamConflict is returned when an existing stream does not fit
	// the configuration (e.g. the ingress stream captures another address).
	ErrStreamConflict = errors.New("grouping: existing stream does not match the configuration")
)

// ErrNotReady is wrapped by the error of Router.CheckReady: the node does
// not route now (starting, disconnected, not reading, stopped).
var ErrNotReady = errors.New("grouping: node not ready")
