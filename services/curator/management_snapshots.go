package curator

import (
	"context"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// The snapshot RPCs of Management: internal/snaps serves them.

func (x *managementServer) TakeSnapshot(ctx context.Context, req *curatorv1.TakeSnapshotRequest) (*curatorv1.TakeSnapshotResponse, error) {
	return x.s.snaps.TakeSnapshot(ctx, req, caller(ctx).String())
}

func (x *managementServer) ListSnapshots(context.Context, *curatorv1.ListSnapshotsRequest) (*curatorv1.ListSnapshotsResponse, error) {
	return x.s.snaps.ListSnapshots()
}

func (x *managementServer) GetSnapshot(req *curatorv1.GetSnapshotRequest, stream curatorv1.Management_GetSnapshotServer) error {
	return x.s.snaps.GetSnapshot(req, stream)
}
