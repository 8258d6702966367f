package rpcerr_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"curia.dev/platform/rpcerr"
)

// TestRetryConflictsIsBounded: a record that changes under every attempt
// ends the loop after ConflictAttempts with CONFLICT, which callers retry
// on; any other outcome ends it at once.
func TestRetryConflictsIsBounded(t *testing.T) {
	t.Parallel()
	attempts := 0
	_, err := rpcerr.RetryConflicts(context.Background(), "write node x", func() (int, error) {
		attempts++
		return 0, fmt.Errorf("%w: node x changed", rpcerr.Conflict)
	})
	if attempts != rpcerr.ConflictAttempts {
		t.Fatalf("%d attempts, want %d", attempts, rpcerr.ConflictAttempts)
	}
	st := rpcerr.ToStatus(context.Background(), nil, "test", err)
	if got := rpcerr.Reason(st); got != rpcerr.Conflict.Reason() || !strings.Contains(err.Error(), "write node x") {
		t.Fatalf("after the last attempt: %v (reason %q), want CONFLICT naming the write", err, got)
	}

	attempts = 0
	v, err := rpcerr.RetryConflicts(context.Background(), "write node x", func() (int, error) {
		attempts++
		if attempts < 3 {
			return 0, rpcerr.Conflict
		}
		return 7, nil
	})
	if v != 7 || err != nil || attempts != 3 {
		t.Fatalf("got %d, %v after %d attempts; want 7, nil after 3", v, err, attempts)
	}

	attempts = 0
	if _, err := rpcerr.RetryConflicts(context.Background(), "write node x", func() (int, error) {
		attempts++
		return 0, rpcerr.NotFound
	}); !errors.Is(err, rpcerr.NotFound) || attempts != 1 {
		t.Fatalf("a refusal other than a conflict: %v after %d attempts, want it at once", err, attempts)
	}
}
