package consensus

import (
	"context"
	"testing"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestStatusOfARemovedMember: etcd's Maintenance.Status panics on a member
// that applied its own removal (IsLearner finds no local member); on the
// client port that panic answers Unavailable instead of killing the
// process. The handler panics as etcd v3.7.3's does (zap's Panic).
func TestStatusOfARemovedMember(t *testing.T) {
	m := &member{}
	panicking := func(context.Context, any) (any, error) {
		panic("failed to find local ID in cluster members")
	}
	_, err := m.refuseRevokedUnary(context.Background(), &etcdserverpb.StatusRequest{}, &grpc.UnaryServerInfo{FullMethod: maintenanceStatus}, panicking)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Status of a removed member: %v, want Unavailable", err)
	}
	// Other calls are not guarded: a panic there is etcd's own business.
	defer func() {
		if recover() == nil {
			t.Fatal("a panic outside Maintenance.Status was swallowed")
		}
	}()
	_, _ = m.refuseRevokedUnary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/etcdserverpb.KV/Range"}, panicking)
}
