package ops

import "errors"

// ErrConfig is wrapped by New's errors.
var ErrConfig = errors.New("ops: invalid configuration")
