package curator_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr/rpcerrtest"
	cut "curia.dev/services/curator/curatortest"
)

// The error assertions every test of this package makes.
var (
	wantCode = rpcerrtest.WantCode
	wantKind = rpcerrtest.WantKind
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func getNodes(t *testing.T, m curatorv1.ManagementClient, filter string) map[string]*curatorv1.Node {
	t.Helper()
	stream, err := m.GetNodes(context.Background(), &curatorv1.GetNodesRequest{Filter: filter})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*curatorv1.Node{}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range resp.Nodes {
			out[n.Id] = n
		}
	}
}

// TestLifecycle: bootstrap, register (idempotent, wrong ticket refused),
// approve, commit, roles, delete with both bypasses and revocation.
func TestLifecycle(t *testing.T) {
	c := cut.New(t, 2)
	ctx := ctxT(t)
	m := c.Management()

	nodes := getNodes(t, m, "")
	boot := nodes[c.Voters[0].ID]
	if len(nodes) != 1 || boot == nil || boot.State != curatorv1.NodeState_NODE_STATE_UP ||
		boot.Roles.GetConsensusMember().GetJoin().GetMemberId() == 0 || boot.Roles.GetKubernetesController() == nil {
		t.Fatalf("after bootstrap: %v", nodes)
	}
	// A second bootstrap for another node is refused.
	other, _ := newKey(t)
	_, err := curatorv1.NewCuratorClient(c.Conn(c.Running(), cut.Admin)).BootstrapCluster(ctx, &curatorv1.BootstrapClusterRequest{PublicKey: other, Status: cut.VoterStatus(c.Voters[0])})
	wantCode(t, err, codes.FailedPrecondition, "initialised already")

	a := c.NewAgent()
	enrolling := a.Enrolling(c.Running())
	pub := a.Key.Public().(ed25519.PublicKey)
	_, err = enrolling.RegisterNode(ctx, &curatorv1.RegisterNodeRequest{RegisterTicket: []byte("wrong"), PublicKey: pub})
	wantCode(t, err, codes.PermissionDenied, "wrong register ticket")
	if _, ok := getNodes(t, m, "")[a.ID]; ok {
		t.Fatal("a wrong ticket wrote a node")
	}
	ticket, err := m.GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent while NEW
		resp, err := enrolling.RegisterNode(ctx, &curatorv1.RegisterNodeRequest{RegisterTicket: ticket.Ticket, PublicKey: pub})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Node.State != curatorv1.NodeState_NODE_STATE_NEW || resp.Node.Id != a.ID {
			t.Fatalf("registered node: %v", resp.Node)
		}
	}
	_, err = enrolling.CommitNode(ctx, &curatorv1.CommitNodeRequest{})
	wantCode(t, err, codes.FailedPrecondition, "not approved")
	// An enrolling node cannot call anything else.
	_, err = enrolling.UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID})
	wantCode(t, err, codes.PermissionDenied, "")

	for range 2 { // approve twice: the second is a no-op
		resp, err := m.ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: a.ID})
		if err != nil {
			t.Fatal(err)
		}
		if resp.Node.State != curatorv1.NodeState_NODE_STATE_STANDBY {
			t.Fatalf("approved node: %v", resp.Node)
		}
	}
	committed := a.Enrol(ctx) // register again (no-op), approve (no-op), commit
	if committed.State != curatorv1.NodeState_NODE_STATE_UP || committed.CertificateSerial == "" {
		t.Fatalf("committed node: %v", committed)
	}
	if a.Creds.Principal != (pki.Principal{Kind: pki.KindNode, Name: a.ID}) {
		t.Fatalf("node certificate is for %v", a.Creds.Principal)
	}
	// The node speaks with its certificate now.
	if _, err := a.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: &curatorv1.NodeStatus{Address: "127.0.0.9", Version: "test"}}); err != nil {
		t.Fatal(err)
	}
	// ...but only for itself.
	_, err = a.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: c.Voters[0].ID, Status: &curatorv1.NodeStatus{}})
	wantCode(t, err, codes.PermissionDenied, "only its own")

	// Roles: KubernetesController needs ConsensusMember; a node without a
	// consensus peer URL cannot become a member.
	_, err = m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, KubernetesController: new(true)})
	wantCode(t, err, codes.FailedPrecondition, "requires ConsensusMember")
	_, err = m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(true)})
	wantCode(t, err, codes.FailedPrecondition, "consensus peer URL")
	resp, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, KubernetesWorker: new(true)})
	if err != nil || resp.Node.Roles.GetKubernetesWorker() == nil {
		t.Fatalf("give KubernetesWorker: %v %v", resp, err)
	}
	// Taking ConsensusMember from the bootstrap node while it is a
	// KubernetesController is refused with what to do instead.
	_, err = m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: c.Voters[0].ID, ConsensusMember: new(false)})
	wantCode(t, err, codes.FailedPrecondition, "kubernetes_controller=false")

	// Delete: roles and UP state each need their bypass.
	_, err = m.DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: a.ID})
	wantCode(t, err, codes.FailedPrecondition, "safety_bypass_has_roles")
	_, err = m.DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: a.ID, SafetyBypassHasRoles: true})
	wantCode(t, err, codes.FailedPrecondition, "safety_bypass_not_decommissioned")
	del, err := m.DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: a.ID, SafetyBypassHasRoles: true, SafetyBypassNotDecommissioned: true})
	if err != nil {
		t.Fatal(err)
	}
	if del.RevokedSerial != committed.CertificateSerial {
		t.Fatalf("revoked %s, want %s", del.RevokedSerial, committed.CertificateSerial)
	}
	if _, ok := getNodes(t, m, "")[a.ID]; ok {
		t.Fatal("deleted node still listed")
	}
	_, err = m.ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: a.ID})
	wantCode(t, err, codes.NotFound, "does not exist")
	// A deleted id never comes back.
	_, err = enrolling.RegisterNode(ctx, &curatorv1.RegisterNodeRequest{RegisterTicket: ticket.Ticket, PublicKey: pub})
	wantCode(t, err, codes.PermissionDenied, "never reused")
	if _, ok := getNodes(t, m, "")[a.ID]; ok {
		t.Fatal("a deleted id registered again")
	}
}

// TestDeleteRevokesEveryCertificate: every certificate a node ever got —
// the bootstrap node's from the deployment, each commit's — is recorded,
// and after DeleteNode none of them gets a call through.
func TestDeleteRevokesEveryCertificate(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	m := c.Management()
	boot := c.Voters[0].ID
	bootSerial := c.BootstrapNode.Leaf().SerialNumber.Text(16)
	// The deployment's: the agent's node certificate, its consensus
	// process's consensus and member certificates (the role carries it).
	bn := getNodes(t, m, "")[boot]
	var principals []string
	for _, c := range bn.GetCertificates() {
		principals = append(principals, c.Principal)
	}
	if want := []string{"node/" + boot, "consensus/" + boot, "member/" + boot}; !slices.Equal(principals, want) || bn.Certificates[0].Serial != bootSerial {
		t.Fatalf("bootstrap node's certificates: %v, want %v, the first %s", bn.GetCertificates(), want, bootSerial)
	}
	if mc, err := pki.ParseCertPEM(bn.GetRoles().GetConsensusMember().GetMemberCertificate()); err != nil || mc.SerialNumber.Text(16) != bn.Certificates[2].Serial {
		t.Fatalf("the bootstrap node's role carries %v (%v), not its member certificate", mc, err)
	}

	a := c.NewAgent()
	a.Enrol(ctx)
	first := a.Creds
	a.Enrol(ctx) // commits again: a second certificate, the first revoked
	second := a.Creds
	n := getNodes(t, m, "")[a.ID]
	if len(n.GetCertificates()) != 2 || !n.Certificates[0].Revoked || n.Certificates[1].Revoked {
		t.Fatalf("certificates after two commits: %v, want the first revoked and the second not", n.GetCertificates())
	}

	// GetCurrentLeader answers every valid certificate, whether its node
	// exists or not.
	works := func(creds *rpc.Credentials, _ string) error {
		a.Creds = creds
		stream, err := a.Curator(c.Running()).GetCurrentLeader(ctx, &curatorv1.GetCurrentLeaderRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		return err
	}
	if err := works(second, a.ID); err != nil {
		t.Fatalf("the current certificate before the deletion: %v", err)
	}
	if err := works(c.BootstrapNode, boot); err != nil {
		t.Fatalf("the bootstrap certificate before the deletion: %v", err)
	}
	for _, tc := range []struct {
		id    string
		certs []*rpc.Credentials
	}{{a.ID, []*rpc.Credentials{first, second}}, {boot, []*rpc.Credentials{c.BootstrapNode}}} {
		del, err := m.DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: tc.id, SafetyBypassHasRoles: true, SafetyBypassNotDecommissioned: true})
		if err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		last := tc.certs[len(tc.certs)-1].Leaf().SerialNumber.Text(16)
		if !slices.Contains(del.RevokedSerials, last) {
			t.Fatalf("DeleteNode revoked %v, not %s", del.RevokedSerials, last)
		}
		for _, creds := range tc.certs {
			proctest.Eventually(t, 2*time.Second, func() error {
				// A new connection fails its handshake (Unavailable),
				// an open one gets Unauthenticated.
				if err := works(creds, tc.id); err == nil {
					return fmt.Errorf("certificate %x of deleted node %s still works", creds.Leaf().SerialNumber, tc.id)
				}
				return nil
			})
		}
		t.Logf("every certificate of %s refused %v after DeleteNode answered", tc.id, time.Since(deleted).Round(time.Millisecond))
	}
}

// newKey returns a fresh node public key and id.
func newKey(t *testing.T) (ed25519.PublicKey, string) {
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return pub, pki.NodeID(pub)
}

// TestConsensusMemberRole: giving ConsensusMember adds the node to etcd
// first (a learner with join parameters in the role); taking it removes the
// member first.
func TestConsensusMemberRole(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	m := c.Management()
	a, n := c.NewConsensusAgent()
	a.Enrol(ctx)
	if _, err := a.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: cut.VoterStatus(n)}); err != nil {
		t.Fatal(err)
	}
	resp, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(true), Reason: "grow the control plane"})
	if err != nil {
		t.Fatal(err)
	}
	join := resp.Node.Roles.GetConsensusMember().GetJoin()
	if join.GetMemberId() == 0 || join.GetPeerUrl() != n.PeerURL {
		t.Fatalf("role carries join parameters %v", join)
	}
	members := c.Voters[0].Members()
	found := false
	for _, mem := range members.Members {
		found = found || (mem.Id == join.MemberId && mem.Learner && mem.NodeId == a.ID)
	}
	if !found {
		t.Fatalf("node is not a learner in etcd: %v", members.Members)
	}
	// The node's consensus joins with the role's parameters.
	if _, err := n.Self().Start(ctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: join}}); err != nil {
		t.Fatal(err)
	}
	// Giving the role again changes nothing.
	again, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(true)})
	if err != nil || again.Node.Revision != resp.Node.Revision {
		t.Fatalf("repeated role grant: %v %v", again, err)
	}
	// Take it: membership goes first, then the role.
	proctest.Eventually(t, time.Minute, func() error {
		_, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(false)})
		if status.Code(err) == codes.Unavailable {
			return err
		}
		if err != nil {
			t.Fatal(err)
		}
		return nil
	})
	for _, mem := range c.Voters[0].Members().Members {
		if mem.NodeId == a.ID {
			t.Fatalf("member of node %s still in etcd: %v", a.ID, mem)
		}
	}
	if got := getNodes(t, m, "")[a.ID]; got.Roles.GetConsensusMember() != nil {
		t.Fatalf("role still set: %v", got.Roles)
	}
}

// TestFailover: a follower forwards; SIGTERM hands leadership over at once,
// SIGKILL within the session TTL; writes carry on.
func TestFailover(t *testing.T) {
	c := cut.New(t, 2)
	ctx := ctxT(t)
	leader := c.Leader()
	var follower *cut.Curator
	for _, cur := range c.Curators {
		if cur != leader {
			follower = cur
		}
	}
	// Unary and streaming calls through the follower.
	fm := curatorv1.NewManagementClient(c.Conn(follower, cut.Admin))
	if _, err := fm.GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{}); err != nil {
		t.Fatalf("unary through follower: %v", err)
	}
	if got := getNodes(t, fm, ""); len(got) != 1 {
		t.Fatalf("stream through follower: %v", got)
	}

	for _, how := range []string{"SIGTERM", "SIGKILL"} {
		t.Run(how, func(t *testing.T) {
			old := c.Leader()
			begun := time.Now()
			if how == "SIGTERM" {
				old.Stop()
			} else {
				old.Kill()
			}
			next := c.Leader()
			t.Logf("%s: new leader %s after %v", how, next.Name, time.Since(begun).Round(time.Millisecond))
			if next == old {
				t.Fatal("the stopped replica still leads")
			}
			a := c.NewAgent()
			a.Enrol(ctx)
			old.Start()
		})
	}
}

// TestRecommitRevokesReplaced: committing again (an agent that lost the
// answer) issues a new certificate and revokes the one it replaces, so a
// node holds one valid certificate at a time.
func TestRecommitRevokesReplaced(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	a := c.NewAgent()
	first := a.Enrol(ctx)
	replaced := a.Creds
	resp, err := a.Enrolling(c.Running()).CommitNode(ctx, &curatorv1.CommitNodeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Node.CertificateSerial == first.CertificateSerial {
		t.Fatalf("the second commit kept serial %s", first.CertificateSerial)
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(a.Key)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := rpc.NewCredentials(c.PKI.Cluster, resp.CaCertificate, resp.Certificate, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	req := &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: &curatorv1.NodeStatus{Address: "127.0.0.9", Version: "test"}}
	committed := time.Now()
	proctest.Eventually(t, 10*time.Second, func() error {
		a.Creds = replaced
		if _, err := a.Curator(c.Running()).UpdateNodeStatus(ctx, req); err == nil {
			return fmt.Errorf("certificate %s, replaced by %s, still works", first.CertificateSerial, resp.Node.CertificateSerial)
		}
		return nil
	})
	t.Logf("the replaced certificate was refused %v after the commit answered", time.Since(committed).Round(time.Millisecond))
	a.Creds = fresh
	if _, err := a.Curator(c.Running()).UpdateNodeStatus(ctx, req); err != nil {
		t.Fatalf("the new certificate %s: %v", resp.Node.CertificateSerial, err)
	}
}

// TestEnrolmentRateLimit: enrolling nodes (anyone with a key) get
// ResourceExhausted beyond the replica's rate, with what to do; the admin
// is not limited.
func TestEnrolmentRateLimit(t *testing.T) {
	c := cut.New(t, 1, "--enrolment-rate", "0.5", "--enrolment-burst", "3")
	ctx := ctxT(t)
	a := c.NewAgent()
	cl := a.Enrolling(c.Running())
	exhausted := 0
	for range 6 {
		_, err := cl.CommitNode(ctx, &curatorv1.CommitNodeRequest{})
		switch status.Code(err) {
		case codes.ResourceExhausted:
			exhausted++
			wantCode(t, err, codes.ResourceExhausted, "retry in a second")
		case codes.NotFound: // not registered: the call went through
		default:
			t.Fatalf("commit of an unregistered node: %v", err)
		}
	}
	if exhausted < 2 {
		t.Fatalf("%d of 6 enrolling calls at once refused, want at least 2 (burst 3, 0.5/s)", exhausted)
	}
	for range 6 {
		if _, err := c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{}); err != nil {
			t.Fatalf("the admin is limited too: %v", err)
		}
	}
}
