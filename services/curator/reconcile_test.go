package curator_test

import (
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	fencev1 "curia.dev/gen/curia/fence/v1"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpcerr"
	ct "curia.dev/services/consensus/consensustest"
	cut "curia.dev/services/curator/curatortest"
)

// reconcileAs is the Reconciliation API on cur as principal p.
func reconcileAs(c *cut.Cluster, cur *cut.Curator, p pki.Principal) curatorv1.ReconciliationClient {
	return curatorv1.NewReconciliationClient(c.Conn(cur, p))
}

// TestReconcileNodeRoles walks the reconciler's two role writes through a
// real membership change each: a learner added with the reconciler's fence
// gets ConsensusMember; removed, it loses ConsensusMember and
// KubernetesController in one write. Stale epochs, node revisions and
// fences are Aborted and write nothing; malformed fences are
// InvalidArgument; only the reconciler may call.
func TestReconcileNodeRoles(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	m := c.Management()
	voter := c.Voters[0]
	cons := voter.Consensus(leaseReconciler)
	l := leasesAs(c, c.Leader(), leaseReconciler)
	rec := reconcileAs(c, c.Leader(), leaseReconciler)
	lease := leaseAcquire(t, l, "reconciler", "r1", 60)

	ag := c.NewAgent()
	ag.Enrol(ctx)
	agKey := cut.ConsensusKey(t)
	if _, err := ag.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: ag.ID, Status: &curatorv1.NodeStatus{Address: "127.0.0.9", ConsensusPublicKey: agKey}}); err != nil {
		t.Fatal(err)
	}

	// The reconciler reads the epoch, then adds the node's member (a real
	// membership change, which moves the epoch).
	e0 := voter.Members().MembershipEpoch
	var added *consensusv1.AddNodeResponse
	err := ct.RetryUnavailable(t, func() error {
		var err error
		added, err = cons.AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: ag.ID, PeerUrl: "https://" + proctest.FreeAddr(t), Fence: leaseFence(lease, voter.Members().MembershipEpoch)})
		return err
	})
	if err != nil {
		t.Fatalf("add member with the reconciler's fence: %v", err)
	}
	e1 := added.MembershipEpoch
	if e1 <= e0 || voter.Members().MembershipEpoch != e1 {
		t.Fatalf("epoch %d after the add, was %d", e1, e0)
	}
	join := added.Join
	add := &curatorv1.ReconcileNodeRolesRequest_AddConsensusMember{AddConsensusMember: join}
	rev0 := leaseNodeNow(t, c, ag.ID).Revision

	t.Run("malformed", func(t *testing.T) {
		leader, leaseCond := lease.Fence.Conditions[0], lease.Fence.Conditions[1]
		fenceOf := func(epoch int64, conds ...*fencev1.FenceCondition) *fencev1.Fence {
			return &fencev1.Fence{Conditions: conds, MembershipEpoch: epoch}
		}
		for name, req := range map[string]*curatorv1.ReconcileNodeRolesRequest{
			"no fence":           {NodeId: ag.ID, NodeRevision: rev0, Change: add},
			"lease key only":     {Fence: fenceOf(e1, leaseCond), NodeId: ag.ID, NodeRevision: rev0, Change: add},
			"leader key only":    {Fence: fenceOf(e1, leader), NodeId: ag.ID, NodeRevision: rev0, Change: add},
			"another lease":      {Fence: fenceOf(e1, leader, &fencev1.FenceCondition{Key: keys.Lease("other"), CreateRevision: leaseCond.CreateRevision}), NodeId: ag.ID, NodeRevision: rev0, Change: add},
			"a key of no lease":  {Fence: fenceOf(e1, leader, leaseCond, &fencev1.FenceCondition{Key: keys.Node(ag.ID), CreateRevision: rev0}), NodeId: ag.ID, NodeRevision: rev0, Change: add},
			"no epoch":           {Fence: fenceOf(0, leader, leaseCond), NodeId: ag.ID, NodeRevision: rev0, Change: add},
			"no node revision":   {Fence: leaseFence(lease, e1), NodeId: ag.ID, Change: add},
			"bad node id":        {Fence: leaseFence(lease, e1), NodeId: "node-1", NodeRevision: rev0, Change: add},
			"no change":          {Fence: leaseFence(lease, e1), NodeId: ag.ID, NodeRevision: rev0},
			"remove false":       {Fence: leaseFence(lease, e1), NodeId: ag.ID, NodeRevision: rev0, Change: &curatorv1.ReconcileNodeRolesRequest_RemoveConsensusMember{}},
			"join without id":    {Fence: leaseFence(lease, e1), NodeId: ag.ID, NodeRevision: rev0, Change: &curatorv1.ReconcileNodeRolesRequest_AddConsensusMember{AddConsensusMember: &consensusv1.JoinParameters{PeerUrl: join.PeerUrl, Voters: join.Voters}}},
			"reason too long":    {Fence: leaseFence(lease, e1), NodeId: ag.ID, NodeRevision: rev0, Change: add, Reason: strings.Repeat("x", 1025)},
			"zero lease revison": {Fence: fenceOf(e1, leader, &fencev1.FenceCondition{Key: leaseCond.Key}), NodeId: ag.ID, NodeRevision: rev0, Change: add},
		} {
			_, err := rec.ReconcileNodeRoles(ctx, req)
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: got %v, want InvalidArgument", name, err)
			}
		}
		// Only the reconciler writes with a fence.
		_, err := reconcileAs(c, c.Leader(), cut.Admin).ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{Fence: leaseFence(lease, e1), NodeId: ag.ID, NodeRevision: rev0, Change: add})
		wantCode(t, err, codes.PermissionDenied, "")
		if got := leaseNodeNow(t, c, ag.ID); got.Revision != rev0 {
			t.Fatalf("a refused call wrote the node: %v", got)
		}
	})

	// A plan made before the add is stale.
	_, err = rec.ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{Fence: leaseFence(lease, e0), NodeId: ag.ID, NodeRevision: rev0, Change: add})
	wantKind(t, err, rpcerr.FenceStale, fence.PartEpoch, "membership epoch")
	// So is one made before the node changed.
	if _, err := ag.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: ag.ID, Status: &curatorv1.NodeStatus{Address: "127.0.0.10", ConsensusPublicKey: agKey}}); err != nil {
		t.Fatal(err)
	}
	rev1 := leaseNodeNow(t, c, ag.ID).Revision
	if rev1 == rev0 {
		t.Fatal("status update did not move the node's revision")
	}
	_, err = rec.ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{Fence: leaseFence(lease, e1), NodeId: ag.ID, NodeRevision: rev0, Change: add})
	wantKind(t, err, rpcerr.Conflict, "", "changed since revision")
	if got := leaseNodeNow(t, c, ag.ID); got.Revision != rev1 || got.Roles.GetConsensusMember() != nil {
		t.Fatalf("a stale write changed the node: %v", got)
	}

	// Current fence, epoch and revision: the role follows membership.
	resp, err := rec.ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{Fence: leaseFence(lease, e1), NodeId: ag.ID, NodeRevision: rev1, Change: add, Reason: "member without role"})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(resp.Node.Roles.GetConsensusMember().GetJoin(), join) || resp.Node.Revision <= rev1 {
		t.Fatalf("node after add: %v", resp.Node)
	}
	ev := reconcileAuditEvent(t, c, ag.ID, auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_ADD_CONSENSUS_MEMBER)
	if ev.Actor != "reconciler" || !strings.HasPrefix(ev.RecordedBy, "curator/") || ev.Reason != "member without role" ||
		ev.MemberId != join.MemberId || !hasPrefix(ev.Fence, keys.Lease("reconciler")+"@") || !hasPrefix(ev.Fence, keys.LeaderElection) || !hasPrefix(ev.Fence, keys.MembershipEpoch) ||
		!proto.Equal(ev.Roles, &auditv1.Roles{ConsensusMember: true}) {
		t.Fatalf("audit event: %v", ev)
	}
	// The same write again changes nothing.
	again, err := rec.ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{Fence: leaseFence(lease, e1), NodeId: ag.ID, NodeRevision: resp.Node.Revision, Change: add})
	if err != nil || again.Node.Revision != resp.Node.Revision {
		t.Fatalf("repeated add: %v %v", again, err)
	}

	// An admin makes it a Kubernetes controller and worker.
	up, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: ag.ID, KubernetesController: new(true), KubernetesWorker: new(true)})
	if err != nil {
		t.Fatal(err)
	}
	// The member goes (a real removal, with the reconciler's fence); the
	// roles follow: ConsensusMember and KubernetesController together.
	var removed *consensusv1.RemoveMemberResponse
	err = ct.RetryUnavailable(t, func() error {
		var err error
		removed, err = cons.RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: ag.ID}, Fence: leaseFence(lease, voter.Members().MembershipEpoch)})
		return err
	})
	if err != nil || removed.AlreadyAbsent {
		t.Fatalf("remove member: %v %v", removed, err)
	}
	e2 := removed.MembershipEpoch
	remove := &curatorv1.ReconcileNodeRolesRequest_RemoveConsensusMember{RemoveConsensusMember: true}
	_, err = rec.ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{Fence: leaseFence(lease, e1), NodeId: ag.ID, NodeRevision: up.Node.Revision, Change: remove})
	wantKind(t, err, rpcerr.FenceStale, fence.PartEpoch, "membership epoch")
	resp, err = rec.ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{Fence: leaseFence(lease, e2), NodeId: ag.ID, NodeRevision: up.Node.Revision, Change: remove, Reason: "role without member"})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Node.Roles; r.GetConsensusMember() != nil || r.GetKubernetesController() != nil || r.GetKubernetesWorker() == nil {
		t.Fatalf("roles after remove: %v", r)
	}
	ev = reconcileAuditEvent(t, c, ag.ID, auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_REMOVE_CONSENSUS_MEMBER)
	if ev.Reason != "role without member" || ev.MemberId != join.MemberId ||
		!proto.Equal(ev.Roles, &auditv1.Roles{KubernetesWorker: true}) {
		t.Fatalf("audit event: %v", ev)
	}

	// A released lease fences nothing.
	if _, err := l.Release(ctx, &curatorv1.ReleaseRequest{Lease: lease}); err != nil {
		t.Fatal(err)
	}
	_, err = rec.ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{Fence: leaseFence(lease, e2), NodeId: ag.ID, NodeRevision: resp.Node.Revision, Change: add})
	wantKind(t, err, rpcerr.FenceStale, fence.PartLease, "no longer exists")
	if got := leaseNodeNow(t, c, ag.ID); got.Revision != resp.Node.Revision {
		t.Fatalf("a write with a released lease changed the node: %v", got)
	}
}

// reconcileAuditEvent returns the latest audit event of the action on the node.
func reconcileAuditEvent(t *testing.T, c *cut.Cluster, nodeID string, action auditv1.AuditAction) *auditv1.Event {
	t.Helper()
	resp, err := c.Etcd(c.Voters[0].ClientURL).Get(ctxT(t), keys.AuditPrefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var found *auditv1.Event
	for _, kv := range resp.Kvs {
		ev := &auditv1.Event{}
		if err := proto.Unmarshal(kv.Value, ev); err != nil {
			t.Fatalf("audit event %s: %v", kv.Key, err)
		}
		if ev.NodeId == nodeID && ev.Action == action {
			found = ev
		}
	}
	if found == nil {
		t.Fatalf("no audit event %s for %s", action, nodeID)
	}
	return found
}

func hasPrefix(ss []string, prefix string) bool {
	for _, s := range ss {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}
