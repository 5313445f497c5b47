package consumer

import (
	"errors"
	"fmt"
)

var (
	// ErrConfig wraps an invalid argument or option of Consume.
	ErrConfig = errors.New("consumer: invalid configuration")
	// ErrNoQueue is returned by Consume when the node's queue consumer
	// was deleted while it pulled (Consume waits for one that does not
	// exist yet).
	ErrNoQueue = errors.New("consumer: the node has no queue consumer")
	// ErrDrainTimeout is returned by Consume when handlers still ran after
	// the drain bound (WithDrainTimeout) once ctx ended; their messages
	// are left unacknowledged and are delivered again.
	ErrDrainTimeout = errors.New("consumer: handlers still running after the drain bound")
	// ErrTerminal marks a handler error that no retry can fix: the message
	// and the later messages of its group are parked at once. Wrap an
	// error with Terminal, test with errors.Is(err, ErrTerminal).
	ErrTerminal = errors.New("consumer: terminal error")
	// ErrStale is the cause of a handler's context when its group showed a
	// message of a newer epoch while it ran: the group has moved on, and
	// what the handler does with the message is no longer current.
	ErrStale = errors.New("consumer: the group moved to a newer epoch")
	// ErrNotParked is returned by GetParked and Replay for a group that
	// is not parked.
	ErrNotParked = errors.New("consumer: the group is not parked")
	// ErrReplaying is returned by Replay while a live process replays the
	// group, or when its record changed during the call.
	ErrReplaying = errors.New("consumer: a replay of the group is in progress")
	// ErrNothingToSkip is returned by Replay(ReplaySkip) when the group
	// has no parked message left.
	ErrNothingToSkip = errors.New("consumer: the group has no parked message to skip")
	// ErrPanic wraps a panic recovered from a handler; it counts as a
	// failed attempt.
	ErrPanic = errors.New("consumer: handler panicked")
)

// Terminal wraps err so that Consume parks the message at once instead of
// retrying it. A nil err gives nil.
func Terminal(err error) error {
	if err == nil {
		return nil
	}
	return &terminalError{err: err}
}

type terminalError struct{ err error }

func (e *terminalError) Error() string { return fmt.Sprintf("terminal: %v", e.err) }

// Unwrap returns both ErrTerminal and the wrapped error, so that
// errors.Is matches either.
func (e *terminalError) Unwrap() []error { return []error{ErrTerminal, e.err} }
