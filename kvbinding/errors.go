package kvbinding

import (
	"errors"

	"github.com/grouprouter/grouprouter/wire"
)

var (
	// ErrInvalidGroupID is wire.ErrInvalidGroupID.
	ErrInvalidGroupID = wire.ErrInvalidGroupID
	// ErrInvalidKey is returned when a key is not one that Key produces.
	ErrInvalidKey = errors.New("kvbinding: invalid binding key")
	// ErrDigestKey is returned by GroupFromKey for a digest key ("h."),
	// which does not name its group: the record under it does.
	ErrDigestKey = errors.New("kvbinding: a digest key names no group")
	// ErrKeyCollision is returned by Store.Get when the record under the
	// group's key is another group's: their ids have the same digest key
	// (a SHA-256 collision: not expected ever), or the record was forged.
	// The asked group is not routed by it.
	ErrKeyCollision = errors.New("kvbinding: the group's key holds another group's record")
	// ErrInvalidBinding is returned for a binding value that does not decode
	// or does not describe a usable binding.
	ErrInvalidBinding = errors.New("kvbinding: invalid binding")
	// ErrExists is returned by Store.Create when the group already has a
	// binding; the returned Binding is the one that stands.
	ErrExists = errors.New("kvbinding: group already bound")
	// ErrConflict is returned by Store.Replace when the binding changed
	// since the revision given.
	ErrConflict = errors.New("kvbinding: binding changed concurrently")
	// ErrNotFound is returned when a group has no binding.
	ErrNotFound = errors.New("kvbinding: group not bound")
	// ErrLeaseHeld is returned when another holder owns a lease.
	ErrLeaseHeld = errors.New("kvbinding: lease held by another")
	// ErrInvalidLease is returned for a lease record without a holder.
	ErrInvalidLease = errors.New("kvbinding: invalid lease record")
	// ErrInvalidCheckpoint is returned for a checkpoint record that does
	// not decode or whose pending ranges do not fit.
	ErrInvalidCheckpoint = errors.New("kvbinding: invalid checkpoint")
	// ErrLeaseLost is returned when a lease could not be renewed because
	// it expired or was taken over.
	ErrLeaseLost = errors.New("kvbinding: lease lost")
	// ErrInvalidNodeInfo is returned for a liveness record that does not
	// decode or names another node than its key.
	ErrInvalidNodeInfo = errors.New("kvbinding: invalid liveness record")
	// ErrInvalidFloor is returned for a routing floor record that does
	// not decode.
	ErrInvalidFloor = errors.New("kvbinding: invalid routing floor")
)
