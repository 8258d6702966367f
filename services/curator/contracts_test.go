package curator_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	fencev1 "curia.dev/gen/curia/fence/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	cut "curia.dev/services/curator/curatortest"
)

// TestRequestContracts: requests that break their contract (the rules in
// proto/) are InvalidArgument over real gRPC and mTLS, naming the field and
// the rule, before any handler runs — on the leader and through a follower,
// unary and streaming; callers the policy refuses learn nothing of the
// contract; valid requests pass.
func TestRequestContracts(t *testing.T) {
	c := cut.New(t, 2)
	ctx := ctxT(t)
	ag := c.NewAgent()
	ag.Enrol(ctx)
	follower := leaseFollower(c)
	mgmt := c.Management()
	node := ag.Curator(follower)
	leases := leasesAs(c, follower, leaseReconciler)
	reconcile := reconcileAs(c, follower, leaseReconciler)
	asAdmin := leasesAs(c, c.Leader(), cut.Admin)
	asNode := curatorv1.NewManagementClient(c.Conn(c.Leader(), pki.Principal{Kind: pki.KindNode, Name: ag.ID}))
	status := func(st *curatorv1.NodeStatus) func() error {
		return func() error {
			_, err := node.UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: ag.ID, Status: st})
			return err
		}
	}
	acquire := func(l curatorv1.LeasesClient, ttl int64) func() error {
		return func() error {
			_, err := l.Acquire(ctx, &curatorv1.AcquireRequest{Name: "contracts", Holder: "test", TtlSeconds: ttl})
			return err
		}
	}
	clusterConfig := func(cfg *curatorv1.ClusterConfig, paths ...string) func() error {
		return func() error {
			_, err := mgmt.UpdateClusterConfig(ctx, &curatorv1.UpdateClusterConfigRequest{Config: cfg, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}, ValidateOnly: true})
			return err
		}
	}
	fence := &fencev1.Fence{Conditions: []*fencev1.FenceCondition{{Key: "/curia/leader/x", CreateRevision: 1}}, MembershipEpoch: 1}
	tests := map[string]struct {
		call        func() error
		code        codes.Code
		field, rule string
	}{
		"approve: bad node id": {code: codes.InvalidArgument, field: "node_id", rule: "curia.node_id", call: func() error {
			_, err := mgmt.ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: "node-1"})
			return err
		}},
		"maintenance: too short": {code: codes.InvalidArgument, field: "duration", rule: "duration.gte_lte", call: func() error {
			_, err := mgmt.StartNodeMaintenance(ctx, &curatorv1.StartNodeMaintenanceRequest{NodeId: ag.ID, Reason: "x", Duration: durationpb.New(time.Second)})
			return err
		}},
		"maintenance: no reason": {code: codes.InvalidArgument, field: "reason", rule: "string.min_len", call: func() error {
			_, err := mgmt.StartNodeMaintenance(ctx, &curatorv1.StartNodeMaintenanceRequest{NodeId: ag.ID})
			return err
		}},
		"list nodes: page too big": {code: codes.InvalidArgument, field: "page_size", rule: "int32.gte_lte", call: func() error {
			_, err := mgmt.ListNodes(ctx, &curatorv1.ListNodesRequest{PageSize: 1001})
			return err
		}},
		"list nodes: too-long token": {code: codes.InvalidArgument, field: "page_token", rule: "string.max_len", call: func() error {
			_, err := mgmt.ListNodes(ctx, &curatorv1.ListNodesRequest{PageToken: strings.Repeat("x", 1025)})
			return err
		}},
		"list nodes: undefined view": {code: codes.InvalidArgument, field: "view", rule: "enum.defined_only", call: func() error {
			_, err := mgmt.ListNodes(ctx, &curatorv1.ListNodesRequest{View: 3})
			return err
		}},
		"roles: too-long reason": {code: codes.InvalidArgument, field: "reason", rule: "string.max_bytes", call: func() error {
			_, err := mgmt.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: ag.ID, Reason: strings.Repeat("x", 1025)})
			return err
		}},
		"status: URL with fragment": {call: status(&curatorv1.NodeStatus{ConsensusPeerUrl: "https://127.0.0.1:2380#f"}), code: codes.InvalidArgument, field: "status.consensus_peer_url", rule: "curia.https_host_port"},
		"status: URL without host":  {call: status(&curatorv1.NodeStatus{ConsensusPeerUrl: "https://:2380"}), code: codes.InvalidArgument, field: "status.consensus_peer_url", rule: "curia.https_host_port"},
		"status: http URL":          {call: status(&curatorv1.NodeStatus{ConsensusClientUrl: "http://127.0.0.1:2379"}), code: codes.InvalidArgument, field: "status.consensus_client_url", rule: "curia.https_host_port"},
		"status: missing":           {call: status(nil), code: codes.InvalidArgument, field: "status", rule: "required"},
		"acquire: TTL too short":    {call: acquire(leases, 1), code: codes.InvalidArgument, field: "ttl_seconds", rule: "int64.gte_lte"},
		"acquire: TTL too long":     {call: acquire(leases, 61), code: codes.InvalidArgument, field: "ttl_seconds", rule: "int64.gte_lte"},
		"reconcile: no change": {code: codes.InvalidArgument, field: "change", rule: "required", call: func() error {
			_, err := reconcile.ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{Fence: fence, NodeId: ag.ID, NodeRevision: 1})
			return err
		}},
		"watch: negative min revision": {code: codes.InvalidArgument, field: "min_revision", rule: "int64.gte", call: func() error {
			stream, err := node.Watch(ctx, &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_NodeId{NodeId: ag.ID}, MinRevision: -1})
			if err == nil {
				_, err = stream.Recv()
			}
			return err
		}},
		// Refused by the follower as it receives the request, not
		// forwarded: the caller hears why, not that it was cancelled.
		"audit log through a follower: resume with a backlog": {code: codes.InvalidArgument, field: "", rule: "audit.resume", call: func() error {
			stream, err := curatorv1.NewManagementClient(c.Conn(follower, cut.Admin)).WatchAuditLog(ctx, &curatorv1.WatchAuditLogRequest{StartRevision: 5, Backlog: 1})
			if err == nil {
				_, err = stream.Recv()
			}
			return err
		}},
		"cluster config: size 2":       {call: clusterConfig(&curatorv1.ClusterConfig{ControlPlaneSize: 2}, "control_plane_size"), code: codes.InvalidArgument, field: "config.control_plane_size", rule: "uint32.in"},
		"cluster config: size 9":       {call: clusterConfig(&curatorv1.ClusterConfig{ControlPlaneSize: 9}, "control_plane_size"), code: codes.InvalidArgument, field: "config.control_plane_size", rule: "uint32.in"},
		"cluster config: threshold 1s": {call: clusterConfig(&curatorv1.ClusterConfig{DeadNodeThreshold: durationpb.New(time.Second)}, "dead_node_threshold"), code: codes.InvalidArgument, field: "config.dead_node_threshold", rule: "duration.gte_lte"},
		"cluster config: min_quorum 8": {call: clusterConfig(&curatorv1.ClusterConfig{MinQuorum: 8}, "min_quorum"), code: codes.InvalidArgument, field: "config.min_quorum", rule: "uint32.gte_lte"},
		"cluster config: unknown path": {call: clusterConfig(&curatorv1.ClusterConfig{}, "paused", "bogus"), code: codes.InvalidArgument, field: "update_mask", rule: "cluster_config.mask_paths"},
		"cluster config: empty mask":   {call: clusterConfig(&curatorv1.ClusterConfig{}), code: codes.InvalidArgument, field: "update_mask", rule: "cluster_config.mask_paths"},
		"cluster config: no mask": {code: codes.InvalidArgument, field: "update_mask", rule: "required", call: func() error {
			_, err := mgmt.UpdateClusterConfig(ctx, &curatorv1.UpdateClusterConfigRequest{Config: &curatorv1.ClusterConfig{}})
			return err
		}},
		// Authorization first: callers the policy refuses learn nothing
		// about what a valid request looks like.
		"admin acquires, bad TTL": {call: acquire(asAdmin, 0), code: codes.PermissionDenied},
		"node manages, bad id": {code: codes.PermissionDenied, call: func() error {
			_, err := asNode.ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: "x"})
			return err
		}},
		// Valid requests pass.
		"status: valid":         {call: status(&curatorv1.NodeStatus{Address: "127.0.0.9", ConsensusPeerUrl: "https://127.0.0.9:2380", ConsensusClientUrl: "https://[::1]:2379/"}), code: codes.OK},
		"acquire: valid":        {call: acquire(leases, 2), code: codes.OK},
		"cluster config: valid": {call: clusterConfig(&curatorv1.ClusterConfig{ControlPlaneSize: 3, DeadNodeThreshold: durationpb.New(10 * time.Second), Stabilization: durationpb.New(0)}, "control_plane_size", "dead_node_threshold", "stabilization"), code: codes.OK},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.call()
			wantCode(t, err, tc.code, tc.field)
			fv := rpc.FieldViolations(err)
			if tc.code != codes.InvalidArgument {
				if len(fv) != 0 {
					t.Fatalf("%v: field violations %v", err, fv)
				}
				return
			}
			if len(fv) != 1 || fv[0].GetField() != tc.field || fv[0].GetReason() != tc.rule {
				t.Fatalf("%v: field violations %v, want %s breaking %s", err, fv, tc.field, tc.rule)
			}
		})
	}
}
