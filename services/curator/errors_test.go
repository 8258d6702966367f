package curator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"curia.dev/platform/rpcerr"
)

// toStatus is what the server's error interceptor makes of a handler's
// error, for tests that call handlers directly.
func toStatus(err error) error { return rpcerr.ToStatus(context.Background(), nil, "test", err) }

// TestRetryConflictsIsBounded: a record that changes under every attempt
// ends the loop after conflictAttempts with CONFLICT, which callers retry
// on; any other outcome ends it at once.
func TestRetryConflictsIsBounded(t *testing.T) {
	attempts := 0
	_, err := retryConflicts(context.Background(), "write node x", func() (int, error) {
		attempts++
		return 0, fmt.Errorf("%w: node x changed", errConflict)
	})
	if attempts != conflictAttempts {
		t.Fatalf("%d attempts, want %d", attempts, conflictAttempts)
	}
	if got := rpcerr.Reason(toStatus(err)); got != rpcerr.Conflict.Reason() || !strings.Contains(err.Error(), "write node x") {
		t.Fatalf("after the last attempt: %v (reason %q), want CONFLICT naming the write", err, got)
	}

	attempts = 0
	v, err := retryConflicts(context.Background(), "write node x", func() (int, error) {
		attempts++
		if attempts < 3 {
			return 0, errConflict
		}
		return 7, nil
	})
	if v != 7 || err != nil || attempts != 3 {
		t.Fatalf("got %d, %v after %d attempts; want 7, nil after 3", v, err, attempts)
	}

	attempts = 0
	if _, err := retryConflicts(context.Background(), "write node x", func() (int, error) {
		attempts++
		return 0, errNotFound
	}); !errors.Is(err, errNotFound) || attempts != 1 {
		t.Fatalf("a refusal other than a conflict: %v after %d attempts, want it at once", err, attempts)
	}
}
