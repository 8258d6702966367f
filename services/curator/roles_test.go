package curator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/proctest"
	"curia.dev/platform/records"
	"curia.dev/platform/rpcerr"
	cut "curia.dev/services/curator/curatortest"
)

// storedNode reads a node's record straight from etcd.
func storedNode(t *testing.T, c *cut.Cluster, id string) *curatorv1.Node {
	t.Helper()
	resp, err := c.Etcd(c.Voters[0].ClientURL).Get(context.Background(), keys.Node(id))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("node %s: %v %v", id, resp, err)
	}
	n, err := records.DecodeNode(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// storeRoles rewrites a node's roles straight in etcd, as another writer
// (the reconciler, a half-done change) would leave them.
func storeRoles(t *testing.T, c *cut.Cluster, id string, roles *curatorv1.Roles) {
	t.Helper()
	n := storedNode(t, c, id)
	n.Roles = roles
	storeNode(t, c, n)
}

// storeNode writes a node's record straight to etcd.
func storeNode(t *testing.T, c *cut.Cluster, n *curatorv1.Node) {
	t.Helper()
	b, err := records.EncodeNode(n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Etcd(c.Voters[0].ClientURL).Put(context.Background(), keys.Node(n.Id), string(b)); err != nil {
		t.Fatal(err)
	}
}

// etcdMember returns the member id of node's etcd member, 0 when none.
func etcdMember(c *cut.Cluster, node string) uint64 {
	for _, m := range c.Voters[0].Members().Members {
		if m.NodeId == node {
			return m.Id
		}
	}
	return 0
}

// whileRoleWriteHeld runs call with the (only) curator held before its
// role write, runs meanwhile there, lets the write go on, and returns
// call's error.
func whileRoleWriteHeld(t *testing.T, c *cut.Cluster, call func() error, meanwhile func()) error {
	t.Helper()
	release := c.Curators[0].Hold("before-role-write")
	done := make(chan error, 1)
	go func() { done <- call() }()
	c.Curators[0].Reached("before-role-write")
	meanwhile()
	release()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("UpdateNodeRoles did not return")
		return nil
	}
}

// TestUpdateNodeRolesFollowsMembership: UpdateNodeRoles decides the etcd
// step from etcd membership (the truth), not from the role, and decides its
// role write again from the record it re-read, never from a stale first
// read.
func TestUpdateNodeRolesFollowsMembership(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	m := c.Management()
	a, n := c.NewConsensusAgent()
	a.Enrol(ctx)
	if _, err := a.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: cut.VoterStatus(n)}); err != nil {
		t.Fatal(err)
	}
	mgmtRetryUnavailable(t, func() error {
		_, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(true)})
		return err
	})
	first := etcdMember(c, a.ID)
	if first == 0 {
		t.Fatal("no etcd member after consensus_member=true")
	}

	t.Run("ConsensusMember lost while the role write waits", func(t *testing.T) {
		// The role write is held; meanwhile the node loses ConsensusMember
		// (as the reconciler takes it from a node whose member is gone).
		// Deciding on the first read would write KubernetesController
		// without ConsensusMember.
		err := whileRoleWriteHeld(t, c, func() error {
			_, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, KubernetesController: new(true)})
			return err
		}, func() { storeRoles(t, c, a.ID, &curatorv1.Roles{}) })
		wantCode(t, err, codes.Aborted, "changed while this call ran")
		if r := storedNode(t, c, a.ID).Roles; r.GetKubernetesController() != nil || r.GetConsensusMember() != nil {
			t.Fatalf("roles after the refused write: %v", r)
		}
	})

	t.Run("false on a member without the role removes the member", func(t *testing.T) {
		if etcdMember(c, a.ID) == 0 {
			t.Fatal("the node is no etcd member to begin with")
		}
		mgmtRetryUnavailable(t, func() error {
			_, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(false)})
			return err
		})
		if id := etcdMember(c, a.ID); id != 0 {
			t.Fatalf("member %x of a node given consensus_member=false stays", id)
		}
	})

	t.Run("true on a role without a member adds the member", func(t *testing.T) {
		storeRoles(t, c, a.ID, &curatorv1.Roles{ConsensusMember: &curatorv1.ConsensusMember{}})
		var resp *curatorv1.UpdateNodeRolesResponse
		mgmtRetryUnavailable(t, func() (err error) {
			resp, err = m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(true)})
			return err
		})
		id := etcdMember(c, a.ID)
		if id == 0 || id == first {
			t.Fatalf("etcd member %x after consensus_member=true on a role without a member (the removed one was %x)", id, first)
		}
		if got := resp.Node.Roles.GetConsensusMember().GetJoin().GetMemberId(); got != id {
			t.Fatalf("the role names member %x, etcd has %x", got, id)
		}
	})

	t.Run("a membership change in flight refuses with CHANGE_PENDING", func(t *testing.T) {
		// The removal of a's member is held in consensus between its
		// pending change record and the etcd call; another change of
		// ConsensusMember, or KubernetesController (which requires it),
		// meanwhile must be refused with the reason callers retry on, a
		// role that does not touch membership is written all the same,
		// and the held removal still finishes, keeping it.
		if etcdMember(c, a.ID) == 0 {
			t.Fatal("the node is no etcd member to begin with")
		}
		// Held in both consensus processes: the curator calls either.
		releases := []func(){c.Voters[0].Hold("after-commit"), n.Hold("after-commit")}
		removed := make(chan error, 1)
		go func() {
			_, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(false)})
			removed <- err
		}()
		proctest.Eventually(t, time.Minute, func() error {
			resp, err := c.Etcd(c.Voters[0].ClientURL).Get(ctx, keys.MembershipPending, clientv3.WithKeysOnly())
			if err != nil || len(resp.Kvs) == 0 {
				return fmt.Errorf("no pending membership change yet (%v)", err)
			}
			return nil
		})
		_, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(true)})
		wantKind(t, err, rpcerr.ChangePending, "", "is in flight")
		// KubernetesController requires ConsensusMember, which is being
		// taken: it waits for the change too.
		_, err = m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, KubernetesController: new(true)})
		wantKind(t, err, rpcerr.ChangePending, "", "is in flight")
		if _, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, KubernetesWorker: new(true)}); err != nil {
			t.Fatalf("KubernetesWorker while a membership change is in flight: %v", err)
		}
		if r := storedNode(t, c, a.ID).Roles; r.GetKubernetesWorker() == nil || r.GetConsensusMember() == nil {
			t.Fatalf("roles while the removal is held: %v, want ConsensusMember still and KubernetesWorker", r)
		}
		for _, release := range releases {
			release()
		}
		select {
		case err := <-removed:
			if err != nil {
				t.Fatalf("the held removal: %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("the held removal did not return")
		}
		if id := etcdMember(c, a.ID); id != 0 {
			t.Fatalf("member %x stays after the held removal finished", id)
		}
		if r := storedNode(t, c, a.ID).Roles; r.GetKubernetesWorker() == nil || r.GetConsensusMember() != nil {
			t.Fatalf("roles after the held removal: %v, want KubernetesWorker alone", r)
		}
	})

	t.Run("node enrolled again while the role write waits", func(t *testing.T) {
		// The role write is held; meanwhile the node is deleted and
		// registers again under the same id (NEW, no roles). The call was
		// decided on the node that is gone: it must not give roles to the
		// new, unapproved one.
		w := c.NewAgent()
		w.Enrol(ctx)
		err := whileRoleWriteHeld(t, c, func() error {
			_, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: w.ID, KubernetesWorker: new(true)})
			return err
		}, func() {
			again := storedNode(t, c, w.ID)
			again.State, again.Roles = curatorv1.NodeState_NODE_STATE_NEW, &curatorv1.Roles{}
			storeNode(t, c, again)
		})
		wantCode(t, err, codes.FailedPrecondition, "roles are for UP nodes")
		if r := storedNode(t, c, w.ID).Roles; r.GetKubernetesWorker() != nil {
			t.Fatalf("the node enrolled again got roles from a call made for the one deleted: %v", r)
		}
	})
}
