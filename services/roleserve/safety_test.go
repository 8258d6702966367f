package roleserve_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	roleservev1 "curia.dev/gen/curia/roleserve/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	ct "curia.dev/services/consensus/consensustest"
	cut "curia.dev/services/curator/curatortest"
)

// Membership-safety tests of the agent: each plays, with real processes,
// a history the agent once got wrong.

// TestRejoinAfterMissedRemoval: the agent is down while its node loses
// ConsensusMember (the curator removes member A from etcd; the local
// consensus stops and keeps A's data) and gets it back (a new learner B).
// Restarted, the agent never saw the role absent, only join parameters
// naming another member: it must have the consensus wipe A's data (Leave,
// allowed now that A is gone) and start B. Before, it retried Start, which
// consensus refuses while it holds another member's data, for ever.
func TestRejoinAfterMissedRemoval(t *testing.T) {
	c := cut.New(t, 1)
	a, n := c.NewConsensusAgent()
	rs := enrolConsensusAgent(t, c, a, n)

	updateRoles(t, c, a.ID, true)
	var memberA uint64
	proctest.Eventually(t, 2*time.Minute, func() error {
		m := memberOf(c, a.ID)
		if m == nil || !m.Started {
			return fmt.Errorf("member of %s: %v", a.ID, m)
		}
		if st := n.Status(); !running(st) || st.MemberId != m.Id {
			return fmt.Errorf("local consensus %v", st)
		}
		memberA = m.Id
		return nil
	})
	rs.eventuallyStatus(t, "running member A", func(st *roleservev1.GetStatusResponse) bool {
		return st.Launcher.GetPhase() == "running" && running(st.Consensus) && st.Consensus.MemberId == memberA
	})

	// The agent is down while the role goes and comes back.
	rs.Stop()
	updateRoles(t, c, a.ID, false)
	proctest.Eventually(t, 2*time.Minute, func() error {
		if m := memberOf(c, a.ID); m != nil {
			return fmt.Errorf("still a member: %v", m)
		}
		if st := n.Status(); st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_STOPPED || st.MemberId != memberA {
			return fmt.Errorf("local consensus %v, want member %x stopped with its data", st, memberA)
		}
		return nil
	})
	giveRoleAgain(t, c, a.ID)
	memberB := memberOf(c, a.ID)
	if memberB == nil || memberB.Id == memberA || memberB.Started {
		t.Fatalf("member of %s after the role came back: %v (member A was %x)", a.ID, memberB, memberA)
	}
	node, err := getNode(t, c.Management(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if id := node.Roles.GetConsensusMember().GetJoin().GetMemberId(); id != memberB.Id {
		t.Fatalf("the role names member %x, want %x", id, memberB.Id)
	}

	// Restarted, the agent replaces A's data with member B.
	rs.Start()
	proctest.Eventually(t, 2*time.Minute, func() error {
		if st, err := rs.status(t); err == nil && strings.Contains(st.Launcher.GetLastError(), fmt.Sprintf("still an etcd member: member %x;", memberB.Id)) {
			// This never resolves: consensus counts the new member of
			// this node (same peer URL) as the owner of A's data.
			t.Fatalf("consensus refuses to wipe member %x's data because of member %x, the one to start: %s", memberA, memberB.Id, st.Launcher.GetLastError())
		}
		m := memberOf(c, a.ID)
		if m == nil || m.Id != memberB.Id || !m.Started {
			return fmt.Errorf("member of %s: %v, want %x started", a.ID, m, memberB.Id)
		}
		if st := n.Status(); !running(st) || st.MemberId != memberB.Id || !st.Learner {
			return fmt.Errorf("local consensus %v, want learner %x running", st, memberB.Id)
		}
		return nil
	})
	rs.eventuallyStatus(t, "running member B", func(st *roleservev1.GetStatusResponse) bool {
		return st.Decision.GetRunConsensus() && st.Launcher.GetPhase() == "running" && running(st.Consensus) && st.Consensus.MemberId == memberB.Id
	})
	if !n.LogContains("left the cluster and wiped etcd data") {
		t.Fatal("the consensus log does not show member A's data wiped")
	}
	if !rs.LogContains("wiped the data of another member") {
		t.Fatal("the agent's log does not show why it left")
	}
}

// giveRoleAgain gives a node ConsensusMember back after it lost it. etcd
// derives a new member's id from its peer URL and the second it is added,
// so adding the node again within the second it was last added names the
// removed member's id, which etcd refuses ("member not found"): that is
// retried like Unavailable.
func giveRoleAgain(t *testing.T, c *cut.Cluster, id string) {
	t.Helper()
	consensusMember := true
	proctest.Eventually(t, time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := c.Management().UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: id, ConsensusMember: &consensusMember, Reason: "roleserve test"})
		switch {
		case status.Code(err) == codes.Unavailable,
			status.Code(err) == codes.NotFound && strings.Contains(err.Error(), "member not found"):
			return err
		case err != nil:
			t.Fatalf("UpdateNodeRoles consensus_member=true: %v", err)
		}
		return nil
	})
}

// enrolConsensusAgent starts the agent of consensus node n with a register
// ticket, approves the node and waits until it runs without roles.
func enrolConsensusAgent(t *testing.T, c *cut.Cluster, a *cut.Agent, n *ct.Node) *agent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ticket, err := c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rs := startAgent(t, c.PKI, n, "--curator", c.Curators[0].Addr, "--register-ticket", encodeTicket(ticket.Ticket))
	proctest.Eventually(t, time.Minute, func() error {
		_, err := c.Management().ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: a.ID})
		return err
	})
	rs.eventuallyStatus(t, "running without roles", func(st *roleservev1.GetStatusResponse) bool {
		return st.EnrolmentState == roleservev1.EnrolmentState_ENROLMENT_STATE_RUNNING && st.Launcher.GetPhase() == "left" &&
			st.ReportedStatus.GetConsensusPeerUrl() == n.PeerURL
	})
	return rs
}

// TestBootstrapDataLost: the bootstrap node's consensus started the
// cluster's first member, and the agent went down before its enrolment
// reached RUNNING (here: no curator answers, so BOOTSTRAPPING never ends).
// Then the consensus data is lost. Restarted, the agent must not bootstrap
// again — that would create a second cluster —: the enrolment fails with a
// reason an operator can act on, and the local consensus stays empty.
func TestBootstrapDataLost(t *testing.T) {
	cc := ct.NewCluster(t)
	n := cc.NewNode()
	boot := cc.PKI.Files(t, pki.Principal{Kind: pki.KindNode, Name: n.ID})
	rs := startAgent(t, cc.PKI, n,
		"--curator", proctest.FreeAddr(t), // no curator: the enrolment stays BOOTSTRAPPING
		"--bootstrap", "--bootstrap-cert", boot.Cert, "--bootstrap-key", boot.Key)
	rs.eventuallyStatus(t, "bootstrapped the member, waiting for the curator", func(st *roleservev1.GetStatusResponse) bool {
		return st.EnrolmentState == roleservev1.EnrolmentState_ENROLMENT_STATE_BOOTSTRAPPING && running(st.Consensus) &&
			strings.Contains(st.EnrolmentReason, "bootstrap the cluster on the curator")
	})
	first := n.Status()
	rs.Stop()

	// The data is lost. Leave is not how: consensus refuses it while the
	// node is a member. The operator's kind of loss: the process stops and
	// its data dir goes.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := n.Self().Leave(ctx, &consensusv1.LeaveRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Leave of the only member: %v, want FailedPrecondition", err)
	}
	n.Stop()
	if err := os.RemoveAll(n.DataDir); err != nil {
		t.Fatal(err)
	}
	n.Start()
	if st := n.Status(); st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE {
		t.Fatalf("local consensus after the wipe: %v", st)
	}

	rs.Start()
	var failed *roleservev1.GetStatusResponse
	proctest.Eventually(t, 2*time.Minute, func() error {
		if st := n.Status(); st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE {
			t.Fatalf("the agent started the local consensus again (a second cluster): %v", st)
		}
		st, err := rs.status(t)
		if err != nil {
			return err
		}
		if st.EnrolmentState != roleservev1.EnrolmentState_ENROLMENT_STATE_FAILED {
			return fmt.Errorf("enrolment %v (%s)", st.EnrolmentState, st.EnrolmentReason)
		}
		failed = st
		return nil
	})
	for _, want := range []string{"refusing to bootstrap a second cluster", fmt.Sprintf("%x", first.MemberId), "Restore the consensus data dir"} {
		if !strings.Contains(failed.EnrolmentReason, want) {
			t.Fatalf("reason %q does not say %q", failed.EnrolmentReason, want)
		}
	}
	// FAILED is final: nothing runs any more, also after a restart.
	rs.Stop()
	rs.Start()
	rs.eventuallyStatus(t, "still failed after a restart", func(st *roleservev1.GetStatusResponse) bool {
		return st.EnrolmentState == roleservev1.EnrolmentState_ENROLMENT_STATE_FAILED && st.EnrolmentReason == failed.EnrolmentReason
	})
	if st := n.Status(); st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE {
		t.Fatalf("local consensus: %v", st)
	}
	b, err := os.ReadFile(rs.Log)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(b), "local consensus bootstrapped a new cluster"); got != 1 {
		t.Fatalf("the agent bootstrapped %d times", got)
	}
}
