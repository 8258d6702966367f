package curator

import (
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestToStatusEtcdErrors: an etcd that is stopping or between leaders is
// Unavailable to the caller (retry), not Internal; etcd's other errors and
// plain ones stay Internal. (The fault suite met "read heartbeats:
// etcdserver: server stopped" answered as Internal.)
func TestToStatusEtcdErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("read heartbeats: %w", rpctypes.ErrStopped), codes.Unavailable},
		{fmt.Errorf("read nodes: %w", rpctypes.ErrNoLeader), codes.Unavailable},
		{fmt.Errorf("read nodes: %w", rpctypes.ErrTimeout), codes.Unavailable},
		{fmt.Errorf("write: %w", rpctypes.ErrRequestTooLarge), codes.Internal},
		// (seen in the e2e: a member stopping answered HTTP, not gRPC)
		{fmt.Errorf("read node: %w", status.Error(codes.Unknown, "unexpected HTTP status code received from server: 200 (OK); malformed header: missing HTTP content-type")), codes.Unavailable},
		{errors.New("something else"), codes.Internal},
	} {
		if got := status.Code(toStatus(c.err)); got != c.want {
			t.Errorf("toStatus(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
