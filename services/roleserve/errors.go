package roleserve

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"curia.dev/platform/rpcerr"
)

// transient reports whether err is worth retrying soon: the other side is
// unreachable, busy or between leaders, or says when to retry.
func transient(err error) bool {
	return rpcerr.Retryable(err) || status.Code(err) == codes.Canceled
}

// waitFor waits until ch is closed or ctx ends; it reports whether ch was
// closed.
func waitFor(ctx context.Context, ch <-chan struct{}) bool {
	select {
	case <-ctx.Done():
		return false
	case <-ch:
		return true
	}
}
