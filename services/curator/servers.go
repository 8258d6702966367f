package curator

// The gRPC servers of the Curator, Management and Reconciliation
// services. Who may call what is the policy (policy.go), checked before a
// handler runs; a handler hands the call to the part that serves it: the
// node registry (internal/registry), the watch hub and the heartbeats
// (heartbeat.go, internal/nodewatch), the certificates (internal/certs),
// snapshots, the audit log, the cluster configuration, maintenance.

import (
	"context"
	"fmt"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpc"
)

// ---- Curator ----

// curatorServer implements curia.curator.v1.Curator.
type curatorServer struct {
	curatorv1.UnimplementedCuratorServer
	s *Service
}

func (x *curatorServer) BootstrapCluster(ctx context.Context, req *curatorv1.BootstrapClusterRequest) (*curatorv1.BootstrapClusterResponse, error) {
	return x.s.registry.Bootstrap(ctx, req)
}

func (x *curatorServer) RegisterNode(ctx context.Context, req *curatorv1.RegisterNodeRequest) (*curatorv1.RegisterNodeResponse, error) {
	return x.s.registry.Register(ctx, req)
}

func (x *curatorServer) CommitNode(ctx context.Context, req *curatorv1.CommitNodeRequest) (*curatorv1.CommitNodeResponse, error) {
	return x.s.registry.Commit(ctx)
}

// UpdateNodeStatus stores what an enrolled node's agent reports about
// itself: its address, its version, and the API, URLs and key of its
// consensus process. Heartbeats (internal/nodewatch) say that it is
// alive; this says what it runs. An unchanged status writes nothing.
func (x *curatorServer) UpdateNodeStatus(ctx context.Context, req *curatorv1.UpdateNodeStatusRequest) (*curatorv1.UpdateNodeStatusResponse, error) {
	err := x.s.registry.UpdateStatus(ctx, req)
	return &curatorv1.UpdateNodeStatusResponse{}, err
}

func (x *curatorServer) IssueCertificates(ctx context.Context, req *curatorv1.IssueCertificatesRequest) (*curatorv1.IssueCertificatesResponse, error) {
	return x.s.registry.IssueCertificates(ctx, req)
}

// WatchCRL streams this replica's view of the CRL in etcd: the current list,
// then every newer one.
func (x *curatorServer) WatchCRL(_ *curatorv1.WatchCRLRequest, stream curatorv1.Curator_WatchCRLServer) error {
	return x.s.certs.WatchCRL(stream)
}

func (x *curatorServer) GetMembership(ctx context.Context, _ *curatorv1.GetMembershipRequest) (*curatorv1.GetMembershipResponse, error) {
	members, err := x.s.consensus.ListMembers(ctx)
	if err != nil {
		return nil, err
	}
	return &curatorv1.GetMembershipResponse{Members: members}, nil
}

// ---- Management ----

// managementServer implements curia.curator.v1.Management.
type managementServer struct {
	curatorv1.UnimplementedManagementServer
	s *Service
}

func (x *managementServer) ApproveNode(ctx context.Context, req *curatorv1.ApproveNodeRequest) (*curatorv1.ApproveNodeResponse, error) {
	n, err := x.s.registry.Approve(ctx, req.GetNodeId())
	if err != nil {
		return nil, err
	}
	return &curatorv1.ApproveNodeResponse{Node: n}, nil
}

func (x *managementServer) UpdateNodeRoles(ctx context.Context, req *curatorv1.UpdateNodeRolesRequest) (*curatorv1.UpdateNodeRolesResponse, error) {
	n, err := x.s.registry.UpdateRoles(ctx, req)
	if err != nil {
		return nil, err
	}
	return &curatorv1.UpdateNodeRolesResponse{Node: n}, nil
}

func (x *managementServer) DeleteNode(ctx context.Context, req *curatorv1.DeleteNodeRequest) (*curatorv1.DeleteNodeResponse, error) {
	return x.s.registry.Delete(ctx, req)
}

func (x *managementServer) GetRegisterTicket(ctx context.Context, _ *curatorv1.GetRegisterTicketRequest) (*curatorv1.GetRegisterTicketResponse, error) {
	resp, err := x.s.etcd.Get(ctx, keys.RegisterTicket)
	if err != nil {
		return nil, fmt.Errorf("read register ticket: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: no register ticket yet (the leader creates it); retry shortly", errUnavailable)
	}
	return &curatorv1.GetRegisterTicketResponse{Ticket: resp.Kvs[0].Value}, nil
}

func (x *managementServer) GetClusterInfo(ctx context.Context, _ *curatorv1.GetClusterInfoRequest) (*curatorv1.GetClusterInfoResponse, error) {
	s := x.s
	cur, _ := s.lead.leader()
	info := &curatorv1.GetClusterInfoResponse{
		ClusterName:     s.cfg.Cluster,
		CaCertificate:   s.creds.CAPEM,
		LeaderName:      cur.Name,
		Term:            cur.Term,
		NodesByState:    map[string]int64{},
		Snapshots:       s.snaps.Status(),
		EtcdMaintenance: s.defrag.Status(),
	}
	err := s.nodes.Each(ctx, func(n *curatorv1.Node) error {
		info.NodesByState[n.State.String()]++
		return nil
	})
	if err != nil {
		return nil, err
	}
	return info, nil
}

func (x *managementServer) TakeSnapshot(ctx context.Context, req *curatorv1.TakeSnapshotRequest) (*curatorv1.TakeSnapshotResponse, error) {
	return x.s.snaps.TakeSnapshot(ctx, req, rpc.Caller(ctx).String())
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
	n, ended, err := x.s.maint.End(ctx, req.GetNodeId(), "ended by "+rpc.Caller(ctx).String())
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

// ---- Reconciliation ----

// reconciliationServer implements curia.curator.v1.Reconciliation. The
// policy admits only the reconciler; followers forward to the leader.
type reconciliationServer struct {
	curatorv1.UnimplementedReconciliationServer
	s *Service
}

func (x *reconciliationServer) ReconcileNodeRoles(ctx context.Context, req *curatorv1.ReconcileNodeRolesRequest) (*curatorv1.ReconcileNodeRolesResponse, error) {
	n, err := x.s.registry.ReconcileNodeRoles(ctx, req)
	if err != nil {
		return nil, err
	}
	return &curatorv1.ReconcileNodeRolesResponse{Node: n}, nil
}
