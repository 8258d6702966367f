package rpcerr

import (
	"context"
	"errors"
	"fmt"
)

// ConflictAttempts bounds a leader's read-decide-write loops: a record that
// changes under every attempt changes faster than a call can decide on it,
// and the caller gets Conflict (Aborted: read again, retry).
const ConflictAttempts = 8

// RetryConflicts runs attempt until it ends in anything but Conflict (a
// guarded write that found its record changed), at most ConflictAttempts
// times; what names the write in the last Conflict.
func RetryConflicts[T any](ctx context.Context, what string, attempt func() (T, error)) (T, error) {
	for range ConflictAttempts {
		v, err := attempt()
		if !errors.Is(err, Conflict) || ctx.Err() != nil {
			return v, err
		}
	}
	var zero T
	return zero, fmt.Errorf("%w: %s: the record changed under each of %d attempts; retry", Conflict, what, ConflictAttempts)
}
