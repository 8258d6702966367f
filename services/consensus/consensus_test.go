package consensus_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	fencev1 "curia.dev/gen/curia/fence/v1"
	"curia.dev/platform/fence"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
	"curia.dev/platform/rpcerr/rpcerrtest"
	ct "curia.dev/services/consensus/consensustest"
)

// The error assertions every test of this package makes.
var (
	wantCode = rpcerrtest.WantCode
	wantKind = rpcerrtest.WantKind
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestBootstrapJoinPromote: bootstrap one member, join two more as learners
// one at a time, promote both; data written before is on all three.
func TestBootstrapJoinPromote(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	n1, n2, n3 := c.NewNode(), c.NewNode(), c.NewNode()

	if st := n1.Status(); st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE {
		t.Fatalf("new node state %v, want idle", st.State)
	}
	begun := time.Now()
	c.Bootstrap(n1)
	t.Logf("bootstrap to ready: %v", time.Since(begun).Round(time.Millisecond))
	st := n1.Status()
	if st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING || st.Learner || st.MemberId == 0 || st.EtcdVersion == "" {
		t.Fatalf("after bootstrap: %v", st)
	}
	ct.Eventually(t, 10*time.Second, func() error {
		if !n1.Status().Leader {
			return fmt.Errorf("n1 does not lead its own cluster yet")
		}
		return nil
	})

	cli := c.Etcd(n1.ClientURL)
	if _, err := cli.Put(ctx, "/test/written-before", "hello"); err != nil {
		t.Fatal(err)
	}
	leader := c.Campaign(cli)

	for _, n := range []*ct.Node{n2, n3} {
		begun := time.Now()
		id := c.Join(n1, n, leader.Fence)
		members := n1.Members()
		var learner *consensusv1.Member
		for _, m := range members.Members {
			if m.Id == id {
				learner = m
			}
		}
		if learner == nil || !learner.Learner || learner.NodeId != n.ID {
			t.Fatalf("after join, member %x is %v, want a learner named %s", id, learner, n.ID)
		}
		c.Promote(n1, id, leader.Fence)
		t.Logf("join to voter (%s): %v", n.ID, time.Since(begun).Round(time.Millisecond))
		if st := n.Status(); st.MemberId != id {
			t.Fatalf("node reports member %x, want %x", st.MemberId, id)
		}
	}

	members := n1.Members()
	if len(members.Members) != 3 {
		t.Fatalf("want 3 members, got %v", members.Members)
	}
	for _, m := range members.Members {
		if m.Learner || !m.Started {
			t.Fatalf("member %v is not a started voter", m)
		}
	}
	if members.AnsweredByMemberId == 0 || members.AnsweredByNodeId == "" || members.MembershipEpoch == 0 {
		t.Fatalf("ListMembers does not say who answered or the epoch: %v", members)
	}
	// Every member serves the key written before the joins from its own
	// copy (a serializable read answers locally).
	for _, n := range []*ct.Node{n1, n2, n3} {
		ct.Eventually(t, 10*time.Second, func() error {
			resp, err := c.Etcd(n.ClientURL).Get(ctx, "/test/written-before", clientv3.WithSerializable())
			if err != nil {
				return err
			}
			if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "hello" {
				return fmt.Errorf("%s has %v", n.ID, resp.Kvs)
			}
			return nil
		})
	}
}

// TestAddNodeIdempotentAndOneLearner: AddNode twice for one node yields one
// member; a second concurrent learner is refused cleanly.
func TestAddNodeIdempotentAndOneLearner(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	n1 := c.NewNode()
	c.Bootstrap(n1)
	leader := c.Campaign(c.Etcd(n1.ClientURL))
	a, b := ct.NewNodeID(t), ct.NewNodeID(t)

	first, err := n1.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: a, PeerUrl: "https://127.0.0.1:1", Fence: n1.Fenced(leader.Fence)})
	if err != nil {
		t.Fatal(err)
	}
	again, err := n1.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: a, PeerUrl: "https://127.0.0.1:1", Fence: n1.Fenced(leader.Fence)})
	if err != nil {
		t.Fatal(err)
	}
	if !again.AlreadyMember || again.Join.MemberId != first.Join.MemberId || first.AlreadyMember {
		t.Fatalf("second AddNode: %v, first: %v", again, first)
	}
	if again.MembershipEpoch != first.MembershipEpoch {
		t.Fatalf("idempotent AddNode moved the epoch from %d to %d", first.MembershipEpoch, again.MembershipEpoch)
	}
	if got := len(n1.Members().Members); got != 2 {
		t.Fatalf("want 2 members after adding one node twice, got %d", got)
	}
	if len(first.Join.Voters) != 1 || first.Join.Voters[0].Name != n1.ID || len(first.Join.CaCertificate) == 0 {
		t.Fatalf("join parameters: %v", first.Join)
	}

	// The unstarted learner is named after its node.
	for _, m := range n1.Members().Members {
		if m.Id == first.Join.MemberId && (m.NodeId != a || m.Started || !m.Learner) {
			t.Fatalf("unstarted learner listed as %v", m)
		}
	}

	_, err = n1.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: b, PeerUrl: "https://127.0.0.1:2", Fence: n1.Fenced(leader.Fence)})
	wantKind(t, err, rpcerr.LearnerPending, "", "one learner at a time")
	if got := len(n1.Members().Members); got != 2 {
		t.Fatalf("a refused AddNode changed membership: %d members", got)
	}

	// Concurrent adds of two new nodes: exactly one becomes the learner.
	_, err = n1.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: a}, Fence: n1.Fenced(leader.Fence)})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, id := range []string{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = n1.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: id, PeerUrl: fmt.Sprintf("https://127.0.0.1:%d", 10+i), Fence: n1.Fenced(leader.Fence)})
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch status.Code(err) {
		case codes.OK:
			ok++
		case codes.FailedPrecondition, codes.Aborted:
			// One learner at a time, a stale epoch, or the other add in
			// flight.
		default:
			t.Fatalf("concurrent AddNode: %v", err)
		}
	}
	if ok != 1 || len(n1.Members().Members) != 2 {
		t.Fatalf("concurrent adds: %d succeeded, members %v", ok, n1.Members().Members)
	}
}

// TestRemoveGuards: the last voter is kept; a removal that leaves too few
// healthy voters is refused; removing the leader moves leadership first.
func TestRemoveGuards(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	nodes, leader := c.Voters(3)
	n1 := nodes[0]

	// Stop one member's process: removing another voter would leave one
	// healthy voter of two.
	nodes[2].Kill()
	before := n1.Members()
	_, err := n1.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: nodes[1].ID}, Fence: n1.Fenced(leader.Fence)})
	wantKind(t, err, rpcerr.QuorumAtRisk, "", "below the quorum")
	if after := n1.Members(); len(after.Members) != 3 || after.MembershipEpoch != before.MembershipEpoch {
		t.Fatalf("refused removal changed membership: %v", after)
	}

	// Remove the dead member instead: that keeps 2 healthy of 2.
	var resp *consensusv1.RemoveMemberResponse
	err = ct.RetryUnavailable(t, func() (err error) {
		resp, err = n1.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: nodes[2].ID}, Fence: n1.Fenced(leader.Fence)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.MembershipEpoch <= before.MembershipEpoch {
		t.Fatalf("epoch did not move: %d then %d", before.MembershipEpoch, resp.MembershipEpoch)
	}

	// Remove the etcd leader: leadership moves, the removal succeeds.
	var lead, other *ct.Node
	ct.Eventually(t, 10*time.Second, func() error {
		for _, n := range nodes[:2] {
			if n.Status().Leader {
				lead = n
			} else {
				other = n
			}
		}
		if lead == nil {
			return fmt.Errorf("no leader")
		}
		return nil
	})
	err = ct.RetryUnavailable(t, func() (err error) {
		resp, err = other.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: lead.ID}, Fence: other.Fenced(leader.Fence)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.MovedLeadership {
		t.Fatalf("leader removed without moving leadership: %v", resp)
	}
	ct.Eventually(t, 10*time.Second, func() error {
		st := other.Status()
		if !st.Leader {
			return fmt.Errorf("remaining member does not lead: %v", st)
		}
		return nil
	})
	after := other.Members()
	if len(after.Members) != 1 || after.Members[0].NodeId != other.ID {
		t.Fatalf("members after removing the leader: %v", after.Members)
	}
	// The removed leader's etcd notices and stops.
	ct.Eventually(t, 30*time.Second, func() error {
		if st := lead.Status(); st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_STOPPED {
			return fmt.Errorf("removed member is %v (%s)", st.State, st.StateReason)
		}
		return nil
	})

	// The last voter stays.
	_, err = other.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: other.ID}, Fence: other.Fenced(leader.Fence)})
	wantKind(t, err, rpcerr.QuorumAtRisk, "", "last voter")
	if got := len(other.Members().Members); got != 1 {
		t.Fatalf("last voter removal changed membership: %d", got)
	}
}

// TestStaleFence: once the lease behind a fence is gone, every membership
// call is refused and nothing changes; accepted changes move the epoch.
func TestStaleFence(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	nodes, leader := c.Voters(2)
	n1 := nodes[0]
	spare := c.NewNode()

	epoch0 := n1.Members().MembershipEpoch
	var added *consensusv1.AddNodeResponse
	err := ct.RetryUnavailable(t, func() (err error) {
		added, err = n1.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: spare.ID, PeerUrl: spare.PeerURL, Fence: n1.Fenced(leader.Fence)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if added.MembershipEpoch <= epoch0 {
		t.Fatalf("AddNode did not move the epoch: %d then %d", epoch0, added.MembershipEpoch)
	}

	// A reconciler-style fence on an old snapshot is refused after the
	// epoch moved.
	stale := leader.Fence.WithEpoch(epoch0)
	_, err = n1.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: spare.ID}, Fence: stale.Proto()})
	wantKind(t, err, rpcerr.FenceStale, fence.PartEpoch, "membership epoch")

	// Revoke the lease behind the fence.
	if _, err := c.Etcd(n1.ClientURL).Revoke(ctx, leader.Session.Lease()); err != nil {
		t.Fatal(err)
	}
	before := n1.Members()
	calls := map[string]func() error{
		"AddNode": func() error {
			_, err := n1.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: ct.NewNodeID(t), PeerUrl: "https://127.0.0.1:3", Fence: n1.Fenced(leader.Fence)})
			return err
		},
		"AddNode (already a member)": func() error {
			_, err := n1.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: spare.ID, PeerUrl: spare.PeerURL, Fence: n1.Fenced(leader.Fence)})
			return err
		},
		"PromoteMember": func() error {
			_, err := n1.Curator().PromoteMember(ctx, &consensusv1.PromoteMemberRequest{MemberId: added.Join.MemberId, Fence: n1.Fenced(leader.Fence)})
			return err
		},
		"RemoveMember": func() error {
			_, err := n1.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: nodes[1].ID}, Fence: n1.Fenced(leader.Fence)})
			return err
		},
		"RemoveMember (learner)": func() error {
			_, err := n1.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_MemberId{MemberId: added.Join.MemberId}, Fence: n1.Fenced(leader.Fence)})
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			wantCode(t, call(), codes.FailedPrecondition, "no longer exists")
		})
	}
	after := n1.Members()
	if diff := cmp.Diff(before.Members, after.Members, protocmp.Transform()); diff != "" || after.MembershipEpoch != before.MembershipEpoch {
		t.Fatalf("stale calls changed membership (epoch %d, then %d; -before +after):\n%s", before.MembershipEpoch, after.MembershipEpoch, diff)
	}

	// A fresh term works again and moves the epoch.
	fresh := c.Campaign(c.Etcd(n1.ClientURL))
	var removed *consensusv1.RemoveMemberResponse
	err = ct.RetryUnavailable(t, func() (err error) {
		removed, err = n1.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_MemberId{MemberId: added.Join.MemberId}, Fence: n1.Fenced(fresh.Fence)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if removed.MembershipEpoch <= after.MembershipEpoch {
		t.Fatalf("removal did not move the epoch: %d then %d", after.MembershipEpoch, removed.MembershipEpoch)
	}
}

// TestRestartFromDisk: kill -9 a member, start it again with only its data
// dir: it rejoins with the same member id.
func TestRestartFromDisk(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	nodes, _ := c.Voters(3)
	victim := nodes[1]
	id := victim.Status().MemberId

	victim.Kill()
	if _, err := c.Etcd(nodes[0].ClientURL).Put(ctx, "/test/while-down", "x"); err != nil {
		t.Fatal(err)
	}
	victim.Start() // same data dir, no Start call
	ct.Eventually(t, 30*time.Second, func() error {
		st := victim.Status()
		if st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING {
			return fmt.Errorf("restarted member is %v (%s)", st.State, st.StateReason)
		}
		if st.MemberId != id || st.Learner {
			return fmt.Errorf("restarted as member %x learner=%v, want voter %x", st.MemberId, st.Learner, id)
		}
		return nil
	})
	if got := len(nodes[0].Members().Members); got != 3 {
		t.Fatalf("want 3 members after restart, got %d", got)
	}
	ct.Eventually(t, 10*time.Second, func() error {
		resp, err := c.Etcd(victim.ClientURL).Get(ctx, "/test/while-down", clientv3.WithSerializable())
		if err != nil || len(resp.Kvs) != 1 {
			return fmt.Errorf("write made while down not on the restarted member: %v %v", resp, err)
		}
		return nil
	})
}

// TestLeave: Leave is refused while the node is a member and wipes the data
// once it is not.
func TestLeave(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	nodes, leader := c.Voters(2)
	n2 := nodes[1]

	_, err := n2.Self().Leave(ctx, &consensusv1.LeaveRequest{})
	wantCode(t, err, codes.FailedPrecondition, "still an etcd member")
	if st := n2.Status(); st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING {
		t.Fatalf("refused Leave stopped the member: %v", st)
	}

	if err := ct.RetryUnavailable(t, func() error {
		_, err := nodes[0].Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: n2.ID}, Fence: nodes[0].Fenced(leader.Fence)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := n2.Self().Leave(ctx, &consensusv1.LeaveRequest{}); err != nil {
		t.Fatal(err)
	}
	if st := n2.Status(); st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE || st.MemberId != 0 {
		t.Fatalf("after Leave: %v", st)
	}
	// Idle again: it can join anew.
	id := c.Join(nodes[0], n2, leader.Fence)
	c.Promote(nodes[0], id, leader.Fence)
	if got := len(nodes[0].Members().Members); got != 2 {
		t.Fatalf("rejoin: %d members", got)
	}
}

// TestBadRequests: malformed input is InvalidArgument with a reason and
// changes nothing.
func TestBadRequests(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	n1 := c.NewNode()
	c.Bootstrap(n1)
	leader := c.Campaign(c.Etcd(n1.ClientURL))
	good := n1.Fenced(leader.Fence)
	cases := map[string]struct {
		req  *consensusv1.AddNodeRequest
		says string
	}{
		"bad node id":     {&consensusv1.AddNodeRequest{NodeId: "bob", PeerUrl: "https://127.0.0.1:1", Fence: good}, "node id"},
		"http peer URL":   {&consensusv1.AddNodeRequest{NodeId: ct.NewNodeID(t), PeerUrl: "http://127.0.0.1:1", Fence: good}, "https://host:port"},
		"no fence":        {&consensusv1.AddNodeRequest{NodeId: ct.NewNodeID(t), PeerUrl: "https://127.0.0.1:1"}, "fence: value is required"},
		"no epoch":        {&consensusv1.AddNodeRequest{NodeId: ct.NewNodeID(t), PeerUrl: "https://127.0.0.1:1", Fence: leader.Fence.Proto()}, "membership_epoch is required"},
		"fence elsewhere": {&consensusv1.AddNodeRequest{NodeId: ct.NewNodeID(t), PeerUrl: "https://127.0.0.1:1", Fence: fence.Fence{Conditions: []fence.Condition{{Key: "/curia/membership/epoch", CreateRevision: 1}}}.Proto()}, "not a leader or lease key"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := n1.Curator().AddNode(ctx, tc.req)
			wantCode(t, err, codes.InvalidArgument, tc.says)
		})
	}
	// The reconciler must fence on its lease too.
	_, err := n1.Consensus(pki.Principal{Kind: pki.KindReconciler}).AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: ct.NewNodeID(t), PeerUrl: "https://127.0.0.1:1", Fence: good})
	wantCode(t, err, codes.InvalidArgument, "lease")
	if got := len(n1.Members().Members); got != 1 {
		t.Fatalf("bad requests changed membership: %d members", got)
	}
}

// TestRequestContracts: requests that break their contract (the rules in
// proto/) are InvalidArgument over real gRPC and mTLS, naming the field and
// the rule, before any handler runs; callers the policy refuses learn
// nothing of the contract; a valid request passes.
func TestRequestContracts(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	n1 := c.NewNode()
	c.Bootstrap(n1)
	leader := c.Campaign(c.Etcd(n1.ClientURL))
	good := n1.Fenced(leader.Fence)
	add := func(id, url string, f *fencev1.Fence) func(consensusv1.ConsensusClient) error {
		return func(cl consensusv1.ConsensusClient) error {
			_, err := cl.AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: id, PeerUrl: url, Fence: f})
			return err
		}
	}
	remove := func(req *consensusv1.RemoveMemberRequest) func(consensusv1.ConsensusClient) error {
		return func(cl consensusv1.ConsensusClient) error {
			req.Fence = good
			_, err := cl.RemoveMember(ctx, req)
			return err
		}
	}
	start := func(req *consensusv1.StartRequest) func(consensusv1.ConsensusClient) error {
		return func(cl consensusv1.ConsensusClient) error {
			_, err := cl.Start(ctx, req)
			return err
		}
	}
	join := &consensusv1.JoinParameters{MemberId: 1, PeerUrl: "https://127.0.0.1:1", Voters: []*consensusv1.Peer{{Name: n1.ID, ClientUrls: []string{"https://127.0.0.1:2#members"}}}}
	curator, self, node := n1.Curator(), n1.Self(), n1.Consensus(pki.Principal{Kind: pki.KindNode, Name: ct.NewNodeID(t)})
	id := ct.NewNodeID(t)
	tests := map[string]struct {
		as          consensusv1.ConsensusClient
		call        func(consensusv1.ConsensusClient) error
		code        codes.Code
		field, rule string
	}{
		"bad node id":       {as: curator, call: add("node-BOB", "https://127.0.0.1:1", good), code: codes.InvalidArgument, field: "node_id", rule: "curia.node_id"},
		"URL with fragment": {as: curator, call: add(id, "https://127.0.0.1:1#f", good), code: codes.InvalidArgument, field: "peer_url", rule: "curia.https_host_port"},
		"URL without host":  {as: curator, call: add(id, "https://:2380", good), code: codes.InvalidArgument, field: "peer_url", rule: "curia.https_host_port"},
		"http URL":          {as: curator, call: add(id, "http://127.0.0.1:1", good), code: codes.InvalidArgument, field: "peer_url", rule: "curia.https_host_port"},
		"no fence":          {as: curator, call: add(id, "https://127.0.0.1:1", nil), code: codes.InvalidArgument, field: "fence", rule: "required"},
		"promote member 0": {as: curator, code: codes.InvalidArgument, field: "member_id", rule: "uint64.gt", call: func(cl consensusv1.ConsensusClient) error {
			_, err := cl.PromoteMember(ctx, &consensusv1.PromoteMemberRequest{Fence: good})
			return err
		}},
		"remove no target":        {as: curator, call: remove(&consensusv1.RemoveMemberRequest{}), code: codes.InvalidArgument, field: "target", rule: "required"},
		"remove too-long reason":  {as: curator, call: remove(&consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: id}, Reason: strings.Repeat("x", 1025)}), code: codes.InvalidArgument, field: "reason", rule: "string.max_bytes"},
		"start without a mode":    {as: self, call: start(&consensusv1.StartRequest{}), code: codes.InvalidArgument, field: "mode", rule: "required"},
		"start join, voter URL #": {as: self, call: start(&consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: join}}), code: codes.InvalidArgument, field: "join.voters[0].client_urls[0]", rule: "curia.https_host_port"},
		// Authorization first: a caller the policy refuses learns nothing
		// about what a valid request looks like.
		"stranger, bad request":       {as: node, call: add("node-BOB", "http://x", nil), code: codes.PermissionDenied},
		"another node, start no mode": {as: node, call: start(&consensusv1.StartRequest{}), code: codes.PermissionDenied},
		"valid":                       {as: curator, call: add(id, "https://127.0.0.1:1", good), code: codes.OK},
	}
	for name, tc := range tests {
		if name == "valid" {
			continue // last: it changes membership
		}
		t.Run(name, func(t *testing.T) {
			err := tc.call(tc.as)
			wantCode(t, err, tc.code, tc.field)
			fv := rpc.FieldViolations(err)
			if tc.code != codes.InvalidArgument {
				if len(fv) != 0 {
					t.Fatalf("%v: a refused caller sees the contract: %v", err, fv)
				}
				return
			}
			if len(fv) != 1 || fv[0].GetField() != tc.field || fv[0].GetReason() != tc.rule {
				t.Fatalf("%v: field violations %v, want %s breaking %s", err, fv, tc.field, tc.rule)
			}
		})
	}
	if got := len(n1.Members().Members); got != 1 {
		t.Fatalf("invalid requests changed membership: %d members", got)
	}
	err := ct.RetryUnavailable(t, func() error { return tests["valid"].call(curator) })
	if err != nil {
		t.Fatalf("valid request: %v", err)
	}
	if got := len(n1.Members().Members); got != 2 {
		t.Fatalf("valid AddNode: %d members, want 2", got)
	}
}

// TestWatchMembership: the stream sends the membership, then every change:
// a change through curia bumps the epoch twice, when it starts and when it
// finishes, and adds the member; members removed and added outside curia
// bump no epoch, and are sent all the same.
func TestWatchMembership(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	n1 := c.NewNode()
	c.Bootstrap(n1)
	leader := c.Campaign(c.Etcd(n1.ClientURL))
	stream, err := n1.Curator().WatchMembership(ctx, &consensusv1.WatchMembershipRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if first.MembershipEpoch != n1.Members().MembershipEpoch || len(first.Members) != 1 || first.Members[0].Learner {
		t.Fatalf("first: %v; ListMembers says epoch %d", first, n1.Members().MembershipEpoch)
	}
	// until reads the stream until a response satisfies done, and returns
	// the epochs it saw on the way (each response's).
	until := func(done func(*consensusv1.WatchMembershipResponse) bool) (epochs []int64, last *consensusv1.WatchMembershipResponse) {
		t.Helper()
		for {
			r, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			epochs = append(epochs, r.MembershipEpoch)
			if done(r) {
				return epochs, r
			}
		}
	}
	added, err := n1.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: ct.NewNodeID(t), PeerUrl: "https://127.0.0.1:1", Fence: n1.Fenced(leader.Fence)})
	if err != nil {
		t.Fatal(err)
	}
	epochs, last := until(func(r *consensusv1.WatchMembershipResponse) bool {
		return r.MembershipEpoch == added.MembershipEpoch && len(r.Members) == 2
	})
	if !slices.IsSorted(epochs) || epochs[0] <= first.MembershipEpoch || epochs[0] >= added.MembershipEpoch {
		t.Fatalf("after AddNode the stream says epochs %v, AddNode %d (before: %d): want one in between, then AddNode's", epochs, added.MembershipEpoch, first.MembershipEpoch)
	}
	if len(last.Members) != 2 || !slices.ContainsFunc(last.Members, func(m *consensusv1.MemberView) bool { return m.Id == added.Join.MemberId && m.Learner && m.Name == "" }) {
		t.Fatalf("after AddNode the stream's members: %v, want learner %x (not started) too", last.Members, added.Join.MemberId)
	}

	// Outside curia, a removal and an add: no epoch, the members all the
	// same.
	if _, err := c.Etcd(n1.ClientURL).MemberRemove(ctx, added.Join.MemberId); err != nil {
		t.Fatal(err)
	}
	epochs, _ = until(func(r *consensusv1.WatchMembershipResponse) bool { return len(r.Members) == 1 })
	if epochs[len(epochs)-1] != added.MembershipEpoch {
		t.Fatalf("after a member removed outside curia: epochs %v, want %d", epochs, added.MembershipEpoch)
	}
	resp, err := c.Etcd(n1.ClientURL).MemberAddAsLearner(ctx, []string{"https://127.0.0.2:1"})
	if err != nil {
		t.Fatal(err)
	}
	epochs, last = until(func(r *consensusv1.WatchMembershipResponse) bool { return len(r.Members) == 2 })
	if epochs[len(epochs)-1] != added.MembershipEpoch || !slices.ContainsFunc(last.Members, func(m *consensusv1.MemberView) bool { return m.Id == resp.Member.ID }) {
		t.Fatalf("after a member added outside curia: epochs %v, members %v; want epoch %d and member %x", epochs, last.Members, added.MembershipEpoch, resp.Member.ID)
	}
}

// TestLeaveAfterRemovedWhileJoining: a learner removed while its etcd
// starts stops with data on disk before it ever reported its member id.
// Leave must still confirm, through the voters the join named, that the
// member is gone and wipe it, so that the node can join again. (The fault
// suite found a node stuck here for good: "knows no other voter to confirm
// that member 0 is gone".)
func TestLeaveAfterRemovedWhileJoining(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	nodes, leader := c.Voters(1)
	n2 := c.NewNode()

	var added *consensusv1.AddNodeResponse
	if err := ct.RetryUnavailable(t, func() (err error) {
		added, err = nodes[0].Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: n2.ID, PeerUrl: n2.PeerURL, Fence: nodes[0].Fenced(leader.Fence)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	release := n2.Hold("before-ready")
	started := make(chan error, 1)
	go func() {
		_, err := n2.Self().Start(ctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: added.Join}})
		started <- err
	}()
	n2.Reached("before-ready")
	if err := ct.RetryUnavailable(t, func() error {
		_, err := nodes[0].Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_MemberId{MemberId: added.Join.MemberId}, Fence: nodes[0].Fenced(leader.Fence)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// etcd learns that its member is gone and stops.
	ct.Eventually(t, 30*time.Second, func() error {
		switch st := n2.Status(); st.State {
		case consensusv1.LifecycleState_LIFECYCLE_STATE_STARTING, consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING:
			return fmt.Errorf("state %v (%s)", st.State, st.StateReason)
		}
		return nil
	})
	release()
	if err := <-started; err == nil {
		t.Fatal("the start of a removed member succeeded")
	}
	if _, err := n2.Self().Leave(ctx, &consensusv1.LeaveRequest{}); err != nil {
		t.Fatalf("Leave after the member was removed while joining: %v", err)
	}
	id := c.Join(nodes[0], n2, leader.Fence)
	c.Promote(nodes[0], id, leader.Fence)
	if got := len(nodes[0].Members().Members); got != 2 {
		t.Fatalf("rejoin: %d members", got)
	}
}

// TestLeaveAsksTheCuratorsInTime: when etcd cannot say whether this node's
// member is gone — its only voter is frozen, and the question hangs as it
// does when a voter refuses a member certificate that this process has not
// seen revoked yet — Leave still asks the curators before the caller's
// deadline, and answers why it keeps the data. While the question to etcd
// was unbounded it took the caller's whole deadline, the curators were asked
// with no time left, and the agent's Leave timed out at every attempt (CI
// found a node stuck "leaving" after its member was removed).
func TestLeaveAsksTheCuratorsInTime(t *testing.T) {
	c := ct.NewCluster(t)
	nodes, leader := c.Voters(1)
	n2 := c.NewNode("--curator", proctest.BlackHole(t))
	c.Join(nodes[0], n2, leader.Fence)

	nodes[0].Pause()
	t.Cleanup(nodes[0].Resume)
	// The agent's deadline for one Leave.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := n2.Self().Leave(ctx, &consensusv1.LeaveRequest{})
	wantCode(t, err, codes.Unavailable, "nor could the curators say")
	if st := n2.Status(); st.State == consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE || st.MemberId == 0 {
		t.Fatalf("Leave wiped a member it could not confirm gone: %v", st)
	}
}

// TestJoinWithCRL: a learner whose join parameters carry a CRL that
// revokes somebody else's certificate catches up and is promoted: etcd's
// ports read the CRL file as DER, and refused every peer with "malformed
// crl" while curia wrote it as PEM (found by the fault suite, whose
// deleted nodes fill the CRL).
func TestJoinWithCRL(t *testing.T) {
	c := ct.NewCluster(t)
	ctx := ctxT(t)
	nodes, leader := c.Voters(1)
	crl, err := c.PKI.CA.CRL([]x509.RevocationListEntry{{SerialNumber: big.NewInt(4242), RevocationTime: time.Now()}}, big.NewInt(1), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	n2 := c.NewNode()
	var added *consensusv1.AddNodeResponse
	if err := ct.RetryUnavailable(t, func() (err error) {
		added, err = nodes[0].Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: n2.ID, PeerUrl: n2.PeerURL, Fence: nodes[0].Fenced(leader.Fence)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	added.Join.Crl = crl
	if _, err := n2.Self().Start(ctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: added.Join}}); err != nil {
		t.Fatalf("start with a CRL: %v", err)
	}
	c.Promote(nodes[0], added.Join.MemberId, leader.Fence)
}
