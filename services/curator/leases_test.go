package curator_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	fencev1 "curia.dev/gen/curia/fence/v1"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpcerr"
	cut "curia.dev/services/curator/curatortest"
)

var leaseReconciler = pki.Principal{Kind: pki.KindReconciler}

// leasesAs is the Leases API on cur as principal p.
func leasesAs(c *cut.Cluster, cur *cut.Curator, p pki.Principal) curatorv1.LeasesClient {
	return curatorv1.NewLeasesClient(c.Conn(cur, p))
}

func leaseAcquire(t *testing.T, l curatorv1.LeasesClient, name, holder string, ttl int64) *curatorv1.Lease {
	t.Helper()
	resp, err := l.Acquire(ctxT(t), &curatorv1.AcquireRequest{Name: name, Holder: holder, TtlSeconds: ttl})
	if err != nil {
		t.Fatalf("acquire %s as %s: %v", name, holder, err)
	}
	return resp.Lease
}

// leaseFence is the lease's fence plus a membership epoch.
func leaseFence(l *curatorv1.Lease, epoch int64) *fencev1.Fence {
	f := proto.Clone(l.Fence).(*fencev1.Fence)
	f.MembershipEpoch = epoch
	return f
}

func leaseNodeNow(t *testing.T, c *cut.Cluster, id string) *curatorv1.Node {
	t.Helper()
	n := getNodes(t, c.Management(), "")[id]
	if n == nil {
		t.Fatalf("node %s not listed", id)
	}
	return n
}

func leaseFollower(c *cut.Cluster) *cut.Curator {
	leader := c.Leader()
	for _, cur := range c.Curators {
		if cur != leader && cur.Running() {
			return cur
		}
	}
	return leader
}

// TestLeases: validation and who may call; one holder per name, idempotent
// re-acquire, release; expiry without keep-alives, and keep-alives that
// hold a lease beyond its TTL. Calls go through a follower and the leader.
func TestLeases(t *testing.T) {
	c := cut.New(t, 2)
	viaFollower := leasesAs(c, leaseFollower(c), leaseReconciler)
	viaLeader := leasesAs(c, c.Leader(), leaseReconciler)

	t.Run("validation", func(t *testing.T) {
		ctx := ctxT(t)
		for name, req := range map[string]*curatorv1.AcquireRequest{
			"upper-case name":   {Name: "Reconciler", Holder: "a", TtlSeconds: 10},
			"empty name":        {Name: "", Holder: "a", TtlSeconds: 10},
			"slash in name":     {Name: "a/b", Holder: "a", TtlSeconds: 10},
			"name too long":     {Name: strings.Repeat("a", 64), Holder: "a", TtlSeconds: 10},
			"empty holder":      {Name: "v", Holder: "", TtlSeconds: 10},
			"holder too long":   {Name: "v", Holder: strings.Repeat("h", 129), TtlSeconds: 10},
			"ttl below minimum": {Name: "v", Holder: "a", TtlSeconds: 1},
			"ttl above maximum": {Name: "v", Holder: "a", TtlSeconds: 61},
		} {
			_, err := viaFollower.Acquire(ctx, req)
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: got %v, want InvalidArgument", name, err)
			}
		}
		_, err := viaFollower.KeepAlive(ctx, &curatorv1.KeepAliveRequest{})
		wantCode(t, err, codes.InvalidArgument, "lease: value is required")
		// Only the reconciler uses leases.
		admin := leasesAs(c, c.Leader(), cut.Admin)
		_, err = admin.Acquire(ctx, &curatorv1.AcquireRequest{Name: "v", Holder: "a", TtlSeconds: 10})
		wantCode(t, err, codes.PermissionDenied, "")
	})

	t.Run("exclusive", func(t *testing.T) {
		ctx := ctxT(t)
		a := leaseAcquire(t, viaFollower, "exclusive", "a", 30)
		if a.Holder != "a" || a.Term == 0 || len(a.Fence.GetConditions()) != 2 ||
			a.Fence.Conditions[1].Key != keys.Lease("exclusive") || !a.Expires.AsTime().After(time.Now()) {
			t.Fatalf("granted lease: %v", a)
		}
		_, err := viaLeader.Acquire(ctx, &curatorv1.AcquireRequest{Name: "exclusive", Holder: "b", TtlSeconds: 30})
		wantKind(t, err, rpcerr.LeaseHeld, "", "lease exclusive is held by a until ")
		if h := rpcerr.Meta(err, "holder"); h != "a" {
			t.Fatalf("LEASE_HELD names holder %q, want a", h)
		}
		if d, ok := rpcerr.RetryDelay(err); !ok || d <= 0 || d > 30*time.Second {
			t.Fatalf("LEASE_HELD retry delay %v %v, want until the lease's expiry", d, ok)
		}
		again := leaseAcquire(t, viaLeader, "exclusive", "a", 30)
		if !proto.Equal(again.Fence, a.Fence) || again.Term != a.Term {
			t.Fatalf("acquiring again gave another lease: %v, first %v", again, a)
		}
		if _, err := viaFollower.Release(ctx, &curatorv1.ReleaseRequest{Lease: a}); err != nil {
			t.Fatal(err)
		}
		b := leaseAcquire(t, viaFollower, "exclusive", "b", 30)
		// A's lease is gone: releasing it again is fine and leaves B's
		// alone; keeping it alive is stale.
		if _, err := viaLeader.Release(ctx, &curatorv1.ReleaseRequest{Lease: a}); err != nil {
			t.Fatalf("release a released lease: %v", err)
		}
		_, err = viaLeader.KeepAlive(ctx, &curatorv1.KeepAliveRequest{Lease: a})
		wantKind(t, err, rpcerr.FenceStale, fence.PartLease, "held by b now")
		if _, err := viaLeader.KeepAlive(ctx, &curatorv1.KeepAliveRequest{Lease: b}); err != nil {
			t.Fatalf("b's lease after a's release: %v", err)
		}
		if _, err := viaLeader.Release(ctx, &curatorv1.ReleaseRequest{Lease: b}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("expiry", func(t *testing.T) {
		ctx := ctxT(t)
		a := leaseAcquire(t, viaLeader, "expiry", "a", 2)
		// No keep-alives: B gets the lease once A's expired.
		var b *curatorv1.Lease
		proctest.Eventually(t, 30*time.Second, func() error {
			resp, err := viaFollower.Acquire(ctx, &curatorv1.AcquireRequest{Name: "expiry", Holder: "b", TtlSeconds: 2})
			if status.Code(err) == codes.FailedPrecondition {
				return err
			}
			if err != nil {
				t.Fatalf("acquire after expiry: %v", err)
			}
			b = resp.Lease
			return nil
		})
		if proto.Equal(b.Fence, a.Fence) {
			t.Fatalf("b got a's fence %v", b.Fence)
		}
		_, err := viaLeader.KeepAlive(ctx, &curatorv1.KeepAliveRequest{Lease: a})
		wantKind(t, err, rpcerr.FenceStale, fence.PartLease, "held by b now")

		// B keeps its lease alive for three TTLs; C is refused all along.
		ticker := time.NewTicker(500 * time.Millisecond)
		defer ticker.Stop()
		until := time.Now().Add(6 * time.Second)
		for time.Now().Before(until) {
			<-ticker.C
			resp, err := viaFollower.KeepAlive(ctx, &curatorv1.KeepAliveRequest{Lease: b})
			if err != nil {
				t.Fatalf("keep-alive: %v", err)
			}
			if !proto.Equal(resp.Lease.Fence, b.Fence) || !resp.Lease.Expires.AsTime().After(time.Now()) {
				t.Fatalf("kept-alive lease %v, granted %v", resp.Lease, b)
			}
			_, err = viaLeader.Acquire(ctx, &curatorv1.AcquireRequest{Name: "expiry", Holder: "c", TtlSeconds: 2})
			wantKind(t, err, rpcerr.LeaseHeld, "", "held by b until")
		}

		// B stops: its record goes with the etcd lease; a late keep-alive
		// is stale, a late release fine.
		cli := c.Etcd(c.Voters[0].ClientURL)
		proctest.Eventually(t, 30*time.Second, func() error {
			resp, err := cli.Get(ctx, keys.Lease("expiry"), clientv3.WithCountOnly())
			if err == nil && resp.Count != 0 {
				err = errors.New("lease record still there")
			}
			return err
		})
		_, err = viaLeader.KeepAlive(ctx, &curatorv1.KeepAliveRequest{Lease: b})
		wantKind(t, err, rpcerr.FenceStale, fence.PartLease, "lease expiry expired")
		if _, err := viaFollower.Release(ctx, &curatorv1.ReleaseRequest{Lease: b}); err != nil {
			t.Fatalf("release an expired lease: %v", err)
		}
	})
}

// TestLeaseNewCuratorTerm: a curator failover ends the leases of the old
// term, although their records have not expired: keep-alives and fenced
// writes with them are Aborted (at the consensus service too), so is a
// fence that pairs the new leader key with an old-term record; the holder
// re-acquires (a new record), and anyone else may take the lease at once.
func TestLeaseNewCuratorTerm(t *testing.T) {
	c := cut.New(t, 2)
	ctx := ctxT(t)
	boot := leaseNodeNow(t, c, c.Voters[0].ID)
	ag := c.NewAgent()
	ag.Enrol(ctx)
	agKey := cut.ConsensusKey(t)
	if _, err := ag.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: ag.ID, Status: &curatorv1.NodeStatus{Address: "127.0.0.9", ConsensusPublicKey: agKey}}); err != nil {
		t.Fatal(err)
	}

	old := c.Leader()
	a := leaseAcquire(t, leasesAs(c, old, leaseReconciler), "reconciler", "a", 60)
	p := leaseAcquire(t, leasesAs(c, old, leaseReconciler), "probe", "p", 60)
	// The fence holds now: a fenced write that changes nothing succeeds.
	epoch := c.Voters[0].Members().MembershipEpoch
	n := leaseNodeNow(t, c, ag.ID)
	if _, err := reconcileAs(c, old, leaseReconciler).ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{
		Fence: leaseFence(a, epoch), NodeId: ag.ID, NodeRevision: n.Revision,
		Change: &curatorv1.ReconcileNodeRolesRequest_RemoveConsensusMember{RemoveConsensusMember: true},
	}); err != nil {
		t.Fatalf("fenced no-op before failover: %v", err)
	}
	if got := leaseNodeNow(t, c, ag.ID); got.Revision != n.Revision {
		t.Fatalf("a no-op wrote the node: %v", got)
	}

	old.Kill()
	next := c.Leader()
	if next == old {
		t.Fatal("the killed replica still leads")
	}
	l := leasesAs(c, next, leaseReconciler)
	rec := reconcileAs(c, next, leaseReconciler)
	addBootJoin := &curatorv1.ReconcileNodeRolesRequest_AddConsensusMember{AddConsensusMember: boot.Roles.GetConsensusMember().GetJoin()}

	_, err := l.KeepAlive(ctx, &curatorv1.KeepAliveRequest{Lease: a})
	wantKind(t, err, rpcerr.FenceStale, fence.PartLease, "acquire again")
	_, err = rec.ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{
		Fence: leaseFence(a, epoch), NodeId: ag.ID, NodeRevision: n.Revision, Change: addBootJoin,
		Reason: "with a fence of the old term",
	})
	wantKind(t, err, rpcerr.FenceStale, fence.PartLeader, "re-acquire the lease")
	if got := leaseNodeNow(t, c, ag.ID); got.Revision != n.Revision || got.Roles.GetConsensusMember() != nil {
		t.Fatalf("a write with an old-term fence changed the node: %v", got)
	}
	// The consensus service refuses the old fence as well.
	_, err = c.Voters[0].Consensus(leaseReconciler).AddNode(ctx, &consensusv1.AddNodeRequest{
		NodeId: ag.ID, PeerUrl: "https://" + proctest.FreeAddr(t), Fence: leaseFence(a, epoch),
	})
	if err == nil || !strings.Contains(status.Convert(err).Message(), "stale fence") {
		t.Fatalf("consensus AddNode with an old-term fence: %v", err)
	}
	if got := c.Voters[0].Members().MembershipEpoch; got != epoch {
		t.Fatalf("membership epoch moved from %d to %d", epoch, got)
	}

	// Its holder re-acquires an old-term lease: a new record, a new fence.
	p2 := leaseAcquire(t, l, "probe", "p", 60)
	if p2.Term == p.Term || p2.Fence.Conditions[1].CreateRevision == p.Fence.Conditions[1].CreateRevision {
		t.Fatalf("re-acquired lease %v shares the old one's term or revision (%v)", p2, p)
	}
	_, err = l.KeepAlive(ctx, &curatorv1.KeepAliveRequest{Lease: p})
	wantKind(t, err, rpcerr.FenceStale, fence.PartLease, "acquire again")
	// A fence made of this term's leader key and the old term's reconciler
	// record is refused: the new leader dropped every old-term record when
	// it took over, so the record is gone (at the consensus service too).
	forged := &fencev1.Fence{Conditions: []*fencev1.FenceCondition{p2.Fence.Conditions[0], a.Fence.Conditions[1]}, MembershipEpoch: epoch}
	_, err = rec.ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{Fence: forged, NodeId: ag.ID, NodeRevision: n.Revision, Change: addBootJoin})
	wantKind(t, err, rpcerr.FenceStale, fence.PartLease, "")
	_, err = c.Voters[0].Consensus(leaseReconciler).AddNode(ctx, &consensusv1.AddNodeRequest{
		NodeId: ag.ID, PeerUrl: "https://" + proctest.FreeAddr(t), Fence: forged,
	})
	if err == nil || !strings.Contains(status.Convert(err).Message(), "no longer exists") {
		t.Fatalf("consensus AddNode with a forged fence: %v", err)
	}
	if got := leaseNodeNow(t, c, ag.ID); got.Revision != n.Revision {
		t.Fatalf("a write with a forged fence changed the node: %v", got)
	}

	// Another holder replaces A's record (TTL 60 s) at once...
	b := leaseAcquire(t, l, "reconciler", "b", 60)
	if b.Term == a.Term || b.Fence.Conditions[1].CreateRevision == a.Fence.Conditions[1].CreateRevision {
		t.Fatalf("new lease %v shares the old one's term or revision (%v)", b, a)
	}
	_, err = l.Acquire(ctx, &curatorv1.AcquireRequest{Name: "reconciler", Holder: "a", TtlSeconds: 60})
	wantKind(t, err, rpcerr.LeaseHeld, "", "held by b until")
	// ...and its fence works.
	resp, err := rec.ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{
		Fence: leaseFence(b, epoch), NodeId: ag.ID, NodeRevision: n.Revision, Change: addBootJoin,
		Reason: "with the new term's fence",
	})
	if err != nil {
		t.Fatalf("write with a fresh fence: %v", err)
	}
	if resp.Node.Roles.GetConsensusMember() == nil || resp.Node.Revision <= n.Revision {
		t.Fatalf("node after the write: %v", resp.Node)
	}
	resp, err = rec.ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{
		Fence: leaseFence(b, epoch), NodeId: ag.ID, NodeRevision: resp.Node.Revision,
		Change: &curatorv1.ReconcileNodeRolesRequest_RemoveConsensusMember{RemoveConsensusMember: true},
	})
	if err != nil || resp.Node.Roles.GetConsensusMember() != nil {
		t.Fatalf("remove the role again: %v %v", resp, err)
	}
}
