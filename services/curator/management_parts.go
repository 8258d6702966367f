package curator

import (
	"context"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// The Management RPCs an internal package serves: the snapshots
// (internal/snaps) and the audit log (internal/auditlog).

func (x *managementServer) TakeSnapshot(ctx context.Context, req *curatorv1.TakeSnapshotRequest) (*curatorv1.TakeSnapshotResponse, error) {
	return x.s.snaps.TakeSnapshot(ctx, req, caller(ctx).String())
}

func (x *managementServer) ListSnapshots(context.Context, *curatorv1.ListSnapshotsRequest) (*curatorv1.ListSnapshotsResponse, error) {
	return x.s.snaps.ListSnapshots()
}

func (x *managementServer) GetSnapshot(req *curatorv1.GetSnapshotRequest, stream curatorv1.Management_GetSnapshotServer) error {
	return x.s.snaps.GetSnapshot(req, stream)
}

func (x *managementServer) WatchAuditLog(req *curatorv1.WatchAuditLogRequest, stream curatorv1.Management_WatchAuditLogServer) error {
	return x.s.audit.Watch(req, stream)
}
