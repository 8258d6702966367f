package curator_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

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
		// Authorization first: callers the policy refuses learn nothing
		// about what a valid request looks like.
		"admin acquires, bad TTL": {call: acquire(asAdmin, 0), code: codes.PermissionDenied},
		"node manages, bad id": {code: codes.PermissionDenied, call: func() error {
			_, err := asNode.ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: "x"})
			return err
		}},
		// Valid requests pass.
		"status: valid":  {call: status(&curatorv1.NodeStatus{Address: "127.0.0.9", ConsensusPeerUrl: "https://127.0.0.9:2380", ConsensusClientUrl: "https://[::1]:2379/"}), code: codes.OK},
		"acquire: valid": {call: acquire(leases, 2), code: codes.OK},
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
