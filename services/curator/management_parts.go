package curator

import (
	"context"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// The Management RPCs an internal package serves: the snapshots
// (internal/snaps), the audit log (internal/auditlog), the cluster
// configuration (internal/clusterconfig), maintenance and decommissioning
// (internal/maintenance).

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

func (x *managementServer) GetClusterConfig(ctx context.Context, _ *curatorv1.GetClusterConfigRequest) (*curatorv1.GetClusterConfigResponse, error) {
	return x.s.config.Get(ctx)
}

func (x *managementServer) WatchClusterConfig(_ *curatorv1.WatchClusterConfigRequest, stream curatorv1.Management_WatchClusterConfigServer) error {
	return x.s.config.Watch(stream)
}

func (x *managementServer) UpdateClusterConfig(ctx context.Context, req *curatorv1.UpdateClusterConfigRequest) (*curatorv1.UpdateClusterConfigResponse, error) {
	return x.s.config.Update(ctx, req)
}

func (x *managementServer) StartNodeMaintenance(ctx context.Context, req *curatorv1.StartNodeMaintenanceRequest) (*curatorv1.StartNodeMaintenanceResponse, error) {
	n, err := x.s.maint.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	return &curatorv1.StartNodeMaintenanceResponse{Node: n}, nil
}

func (x *managementServer) EndNodeMaintenance(ctx context.Context, req *curatorv1.EndNodeMaintenanceRequest) (*curatorv1.EndNodeMaintenanceResponse, error) {
	n, ended, err := x.s.maint.End(ctx, req.GetNodeId(), "ended by "+caller(ctx).String())
	if err != nil {
		return nil, err
	}
	return &curatorv1.EndNodeMaintenanceResponse{Node: n, Ended: ended}, nil
}

func (x *managementServer) DecommissionNode(ctx context.Context, req *curatorv1.DecommissionNodeRequest) (*curatorv1.DecommissionNodeResponse, error) {
	n, err := x.s.maint.Decommission(ctx, req)
	if err != nil {
		return nil, err
	}
	return &curatorv1.DecommissionNodeResponse{Node: n}, nil
}
