package router

import (
	"errors"

	"github.com/grouprouter/grouprouter/wire"
)

var (
	// ErrConfig is wrapped by every configuration error.
	ErrConfig = errors.New("grouping: invalid configuration")
	// ErrStreamConflict is wire.ErrStreamConflict.
	ErrStreamConflict = wire.ErrStreamConflict
	// ErrPermanent is matched (errors.Is) by the *SetupError that Run
	// returns when setting up failed in a way that waiting cannot fix: NATS
	// refused the credentials or a permission, the connection was closed,
	// JetStream is disabled for the account, a stream exists with a
	// conflicting configuration (ErrStreamConflict), or the server rejected
	// a request as bad. Transient failures (no responders, timeouts, no
	// JetStream meta leader, leader elections, peers still joining, no
	// server reachable yet) are retried until ctx ends instead.
	ErrPermanent = errors.New("grouping: cannot set up")
)

// errRefused wraps a publish error that retrying cannot fix: the servers
// refuse the message as it is (larger than max_payload once the router's
// headers are added, past a stream's max_msg_size, headers past 64 KiB).
var errRefused = errors.New("refused for good")

// ErrNodeIDInUse is matched by the *NodeIDInUseError Run returns when
// another process runs under the node's id.
var ErrNodeIDInUse = errors.New("grouping: node id in use by another process")

// ErrNotReady is wrapped by the error of Router.CheckReady: the node does
// not route now (starting, disconnected, not reading, stopped).
var ErrNotReady = errors.New("grouping: node not ready")

// SetupError is the error Run returns when setting up failed in a way
// that waiting cannot fix. errors.Is matches it against ErrPermanent and
// against its cause.
type SetupError struct {
	// Step is the setup step that failed: "connect", "streams", "queue
	// consumer", "bindings bucket", "node registry bucket", "node id check", "queue
	// publisher", "binding cache load", "node registry load", "checkpoint
	// load", "handler events" or "first announcement".
	Step string
	// Err is the cause.
	Err error
}

func (e *SetupError) Error() string {
	return ErrPermanent.Error() + ": " + e.Step + ": " + e.Err.Error()
}

// Unwrap returns ErrPermanent and the cause.
func (e *SetupError) Unwrap() []error { return []error{ErrPermanent, e.Err} }
