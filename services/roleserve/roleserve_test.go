package roleserve_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	roleservev1 "curia.dev/gen/curia/roleserve/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/records"
	"curia.dev/platform/rpc"
	ct "curia.dev/services/consensus/consensustest"
	cut "curia.dev/services/curator/curatortest"
)

// agent is one roleserve process.
type agent struct {
	*proctest.Proc
	pki     *ct.PKI
	dataDir string
	listen  string
	// metrics is the plain-HTTP address of /metrics and /healthz.
	metrics string
}

// startAgent starts roleserve for the node with key (as --node-key) and
// the given flags.
func startAgent(t *testing.T, k *ct.PKI, node *ct.Node, args ...string) *agent {
	t.Helper()
	dir := t.TempDir()
	keyPEM, err := pki.MarshalEd25519PEM(node.Key)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, pki.NodeKeyFile(node.ID))
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	a := &agent{pki: k, dataDir: filepath.Join(dir, "data"), listen: proctest.FreeAddr(t), metrics: proctest.FreeAddr(t)}
	a.Proc = proctest.New(t, "roleserve-"+node.ID, proctest.Build(t, "curia.dev/services/roleserve/cmd/roleserve"), append([]string{
		"--cluster", k.Cluster,
		"--data-dir", a.dataDir,
		"--ca", filepath.Join(k.Dir, pki.CACertFile),
		"--node-key", keyFile,
		"--consensus", node.API,
		"--address", "127.0.0.1",
		"--listen", a.listen,
		"--listen-metrics", a.metrics,
		"--status-interval", "200ms",
		"--retry-max", "1s",
		"--log-level", "debug",
	}, args...)...)
	a.Start()
	return a
}

// ticketFile writes the cluster's register ticket into a file for agents.
func ticketFile(t *testing.T, c *cut.Cluster) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ticket, err := c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ticket")
	if err := os.WriteFile(path, ticket.Ticket, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// status asks the agent's API as an admin.
func (a *agent) status(t *testing.T) (*roleservev1.GetStatusResponse, error) {
	return a.statusAs(t, a.pki.Creds(t, cut.Admin))
}

// statusAs asks the agent's API with creds, on a new connection.
func (a *agent) statusAs(t *testing.T, creds *rpc.Credentials) (*roleservev1.GetStatusResponse, error) {
	cc, err := rpc.Dial(a.listen, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindNode}})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return roleservev1.NewRoleServerClient(cc).GetStatus(ctx, &roleservev1.GetStatusRequest{})
}

// eventuallyStatus polls GetStatus until check passes.
func (a *agent) eventuallyStatus(t *testing.T, what string, check func(*roleservev1.GetStatusResponse) bool) *roleservev1.GetStatusResponse {
	t.Helper()
	var last *roleservev1.GetStatusResponse
	proctest.Eventually(t, 2*time.Minute, func() error {
		st, err := a.status(t)
		if err != nil {
			return err
		}
		last = st
		if !check(st) {
			return fmt.Errorf("%s: status %v", what, st)
		}
		return nil
	})
	return last
}

// enrolmentState reads the agent's persisted enrolment state.
func (a *agent) enrolmentState() (string, error) {
	b, err := os.ReadFile(filepath.Join(a.dataDir, "enrolment.json"))
	if err != nil {
		return "", err
	}
	var rec struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return "", err
	}
	return rec.State, nil
}

func getNode(t *testing.T, m curatorv1.ManagementClient, id string) (*curatorv1.Node, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := m.GetNodes(ctx, &curatorv1.GetNodesRequest{})
	if err != nil {
		return nil, err
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("node %s not found", id)
		}
		if err != nil {
			return nil, err
		}
		for _, n := range resp.Nodes {
			if n.Id == id {
				return n, nil
			}
		}
	}
}

// memberOf is node id's etcd member as the voter sees it, nil if none.
func memberOf(c *cut.Cluster, id string) *consensusv1.Member {
	for _, m := range c.Voters[0].Members().Members {
		if m.NodeId == id {
			return m
		}
	}
	return nil
}

// updateRoles calls UpdateNodeRoles, retrying while etcd refuses
// membership changes for now (Unavailable).
func updateRoles(t *testing.T, c *cut.Cluster, id string, consensusMember bool) {
	t.Helper()
	proctest.Eventually(t, time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := c.Management().UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: id, ConsensusMember: &consensusMember, Reason: "roleserve test"})
		if status.Code(err) == codes.Unavailable {
			return err
		}
		if err != nil {
			t.Fatalf("UpdateNodeRoles consensus_member=%v: %v", consensusMember, err)
		}
		return nil
	})
}

func running(st *consensusv1.StatusResponse) bool {
	return st.GetState() == consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING
}

// TestJoinLeaveRestart: a node registers and waits (watching) for
// approval, commits, reports its consensus, joins etcd as a learner when it
// gets ConsensusMember, keeps running its member from the persisted roles
// when restarted with every curator down, and leaves — stop and wipe, only
// once its member is gone — when it loses the role.
func TestJoinLeaveRestart(t *testing.T) {
	c := cut.New(t, 1)
	a, n := c.NewConsensusAgent()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rs := startAgent(t, c.PKI, n,
		"--curator", c.Curators[0].Addr,
		"--register-ticket-file", ticketFile(t, c),
		"--labels", "zone=a,rack=7")

	// Registered, waiting for approval; not yet serving (no certificate).
	proctest.Eventually(t, time.Minute, func() error {
		st, err := rs.enrolmentState()
		if err != nil || st != "WAITING_FOR_APPROVAL" {
			return fmt.Errorf("enrolment state %q (%v)", st, err)
		}
		return nil
	})
	node, err := getNode(t, c.Management(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if node.State != curatorv1.NodeState_NODE_STATE_NEW || node.Labels["zone"] != "a" || node.Labels["rack"] != "7" {
		t.Fatalf("registered node %v", node)
	}
	if _, err := c.Management().ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: a.ID}); err != nil {
		t.Fatal(err)
	}

	// Committed: serves with its node certificate, has no roles, and
	// reports its consensus endpoints.
	rs.eventuallyStatus(t, "running without roles", func(st *roleservev1.GetStatusResponse) bool {
		return st.EnrolmentState == roleservev1.EnrolmentState_ENROLMENT_STATE_RUNNING &&
			st.NodeId == a.ID && !st.Bootstrapped && st.RolesSource == "curator" &&
			st.Decision.GetDecided() && !st.Decision.GetRunConsensus() &&
			st.Launcher.GetPhase() == "left" && st.CuratorConnected
	})
	for _, f := range []string{"identity.key", "node.key"} {
		if fi, err := os.Stat(filepath.Join(rs.dataDir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, fi.Mode(), err)
		}
	}
	if fi, err := os.Stat(rs.dataDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("data dir: %v %v", fi.Mode(), err)
	}
	proctest.Eventually(t, time.Minute, func() error {
		node, err := getNode(t, c.Management(), a.ID)
		if err != nil {
			return err
		}
		if st := node.Status; st.GetConsensusPeerUrl() != n.PeerURL || st.GetConsensusClientUrl() != n.ClientURL || st.GetConsensusApi() != n.API || st.GetAddress() != "127.0.0.1" {
			return fmt.Errorf("node status %v", st)
		}
		if node.Health != curatorv1.NodeHealth_NODE_HEALTH_HEALTHY {
			return fmt.Errorf("node health %v", node.Health)
		}
		return nil
	})

	// ConsensusMember: the curator adds the learner, the agent starts it.
	updateRoles(t, c, a.ID, true)
	proctest.Eventually(t, 2*time.Minute, func() error {
		m := memberOf(c, a.ID)
		if m == nil || !m.Learner || !m.Started {
			return fmt.Errorf("member of %s: %v", a.ID, m)
		}
		if st := n.Status(); !running(st) || !st.Learner {
			return fmt.Errorf("local consensus %v", st)
		}
		return nil
	})
	joined := rs.eventuallyStatus(t, "running consensus", func(st *roleservev1.GetStatusResponse) bool {
		return st.Decision.GetRunConsensus() && st.Decision.GetMode() == roleservev1.ConsensusMode_CONSENSUS_MODE_JOIN &&
			st.Roles.GetConsensusMember() != nil && st.Launcher.GetPhase() == "running" && running(st.Consensus) &&
			slices.Equal(st.ReportedStatus.GetRunningServices(), []string{"consensus"})
	})

	// Restarted while every curator is down: the persisted roles decide.
	rs.Stop()
	c.Curators[0].Stop()
	rs.Start()
	rs.eventuallyStatus(t, "running consensus from persisted roles", func(st *roleservev1.GetStatusResponse) bool {
		return st.EnrolmentState == roleservev1.EnrolmentState_ENROLMENT_STATE_RUNNING && st.RolesSource == "disk" &&
			st.Decision.GetRunConsensus() && st.Decision.GetMode() == roleservev1.ConsensusMode_CONSENSUS_MODE_JOIN &&
			st.Launcher.GetPhase() == "running" && running(st.Consensus) && !st.CuratorConnected &&
			st.Decision.GetSince().AsTime().After(joined.Decision.GetSince().AsTime())
	})
	if st := n.Status(); !running(st) {
		t.Fatalf("local consensus after the restart: %v", st)
	}
	if m := memberOf(c, a.ID); m == nil {
		t.Fatal("the member is gone after the restart")
	}

	// The curator returns; the agent finds it again.
	c.Curators[0].Start()
	c.Leader()
	rs.eventuallyStatus(t, "curator back", func(st *roleservev1.GetStatusResponse) bool {
		return st.RolesSource == "curator" && st.CuratorConnected && st.Launcher.GetPhase() == "running"
	})

	// The role goes while the node is still a member (a role write ahead
	// of membership, played directly in etcd): the agent tries to leave,
	// the consensus refuses, and nothing is wiped. The role comes back (as
	// the reconciler would restore it): the member was never stopped.
	etcd := c.Etcd(c.Voters[0].ClientURL)
	record := nodeRecord(t, etcd, a.ID)
	withoutRole := proto.Clone(record).(*curatorv1.Node)
	withoutRole.Roles.ConsensusMember = nil
	putNodeRecord(t, etcd, withoutRole)
	rs.eventuallyStatus(t, "waiting to leave", func(st *roleservev1.GetStatusResponse) bool {
		return !st.Decision.GetRunConsensus() && st.Launcher.GetPhase() == "leaving" &&
			strings.Contains(st.Launcher.GetLastError(), "still an etcd member") && st.Launcher.GetAttempts() >= 2
	})
	if st := n.Status(); !running(st) || memberOf(c, a.ID) == nil {
		t.Fatalf("a member was stopped: %v", st)
	}
	putNodeRecord(t, etcd, record)
	rs.eventuallyStatus(t, "role back", func(st *roleservev1.GetStatusResponse) bool {
		return st.Decision.GetRunConsensus() && st.Launcher.GetPhase() == "running" && running(st.Consensus)
	})
	if n.LogContains("wiped") {
		t.Fatal("the consensus wiped data while the node was a member")
	}

	// The role goes: the curator removes the member first, then the agent
	// stops and wipes the local member.
	updateRoles(t, c, a.ID, false)
	proctest.Eventually(t, 2*time.Minute, func() error {
		if m := memberOf(c, a.ID); m != nil {
			return fmt.Errorf("still a member: %v", m)
		}
		if st := n.Status(); st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE {
			return fmt.Errorf("local consensus %v", st)
		}
		entries, err := os.ReadDir(n.DataDir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		// The revocation list stays (it is the cluster's), and so do the
		// process's key and consensus certificate (its identity); the
		// member's data and its member certificate go.
		var names []string
		for _, e := range entries {
			if !slices.Contains([]string{"crl.der", "identity.key", "consensus.crt"}, e.Name()) {
				names = append(names, e.Name())
			}
		}
		if len(names) > 0 {
			return fmt.Errorf("consensus data dir holds %s", strings.Join(names, ", "))
		}
		return nil
	})
	rs.eventuallyStatus(t, "left", func(st *roleservev1.GetStatusResponse) bool {
		return !st.Decision.GetRunConsensus() && st.Roles.GetConsensusMember() == nil && st.Launcher.GetPhase() == "left" &&
			st.Consensus.GetState() == consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE
	})
	if !n.LogContains("left the cluster and wiped etcd data") {
		t.Fatal("the consensus log does not show the wipe")
	}
}

// nodeRecord reads a node record straight from etcd.
func nodeRecord(t *testing.T, cli *clientv3.Client, id string) *curatorv1.Node {
	t.Helper()
	resp, err := cli.Get(context.Background(), keys.Node(id))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("node %s: %v %v", id, resp, err)
	}
	n, err := records.DecodeNode(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// putNodeRecord writes a node record straight into etcd: the test plays a
// change the curator's API would not make.
func putNodeRecord(t *testing.T, cli *clientv3.Client, n *curatorv1.Node) {
	t.Helper()
	b, err := records.EncodeNode(n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(context.Background(), keys.Node(n.Id), string(b)); err != nil {
		t.Fatal(err)
	}
}

// TestBootstrap: the first node of a new cluster starts its consensus as a
// new cluster and records itself with the curator; its bootstrap data
// gives way to its roles without touching the running member, and a
// restart without the bootstrap flags resumes as RUNNING.
func TestBootstrap(t *testing.T) {
	cc := ct.NewCluster(t)
	n := cc.NewNode()
	boot := cc.PKI.Files(t, pki.Principal{Kind: pki.KindNode, Name: n.ID})
	curAddr := startCurator(t, cc, n)
	rs := startAgent(t, cc.PKI, n,
		"--curator", curAddr,
		"--bootstrap", "--bootstrap-cert", boot.Cert, "--bootstrap-key", boot.Key)
	first := rs.eventuallyStatus(t, "bootstrapped", func(st *roleservev1.GetStatusResponse) bool {
		return st.EnrolmentState == roleservev1.EnrolmentState_ENROLMENT_STATE_RUNNING && st.Bootstrapped &&
			st.RolesSource == "curator" && st.Roles.GetConsensusMember() != nil && st.Roles.GetKubernetesController() != nil &&
			st.Decision.GetRunConsensus() && st.Decision.GetMode() == roleservev1.ConsensusMode_CONSENSUS_MODE_JOIN &&
			st.Launcher.GetPhase() == "running" && running(st.Consensus) && !st.Consensus.Learner
	})
	if !rs.LogContains("local consensus bootstrapped a new cluster") || !rs.LogContains("cluster bootstrapped") {
		t.Fatal("the log does not show the bootstrap")
	}
	// The decision flipped once, at the bootstrap; the role taking over
	// from the bootstrap data changed nothing.
	if rs.LogContains("local consensus started") {
		t.Fatal("the launcher started the member again after the bootstrap")
	}

	// The Metropolis TODO, fixed: once the curator confirmed the bootstrap
	// node's roles, they decide, so taking ConsensusMember away turns its
	// member off although its bootstrap data lingers. (Played in etcd: the
	// curator refuses to remove the last voter.) The agent leaves, which
	// consensus refuses while the node is a member: nothing is wiped. The
	// role comes back and the member ran throughout.
	etcd := cc.Etcd(n.ClientURL)
	record := nodeRecord(t, etcd, n.ID)
	withoutRole := proto.Clone(record).(*curatorv1.Node)
	withoutRole.Roles.ConsensusMember, withoutRole.Roles.KubernetesController = nil, nil
	putNodeRecord(t, etcd, withoutRole)
	rs.eventuallyStatus(t, "bootstrap node without ConsensusMember", func(st *roleservev1.GetStatusResponse) bool {
		return st.Bootstrapped && !st.Decision.GetRunConsensus() && st.Decision.GetMode() == roleservev1.ConsensusMode_CONSENSUS_MODE_NONE &&
			st.Launcher.GetPhase() == "leaving" && strings.Contains(st.Launcher.GetLastError(), "still an etcd member")
	})
	if st := n.Status(); !running(st) {
		t.Fatalf("the only voter stopped: %v", st)
	}
	putNodeRecord(t, etcd, record)
	rs.eventuallyStatus(t, "role back", func(st *roleservev1.GetStatusResponse) bool {
		return st.Decision.GetRunConsensus() && st.Launcher.GetPhase() == "running" && running(st.Consensus)
	})

	admin, err := rpc.Dial(curAddr, rpc.ClientConfig{Credentials: cc.PKI.Creds(t, cut.Admin), ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	node, err := getNode(t, curatorv1.NewManagementClient(admin), n.ID)
	if err != nil {
		t.Fatal(err)
	}
	if node.State != curatorv1.NodeState_NODE_STATE_UP || node.Status.GetConsensusPeerUrl() != n.PeerURL {
		t.Fatalf("bootstrap node record %v", node)
	}

	// Restart without the bootstrap flags: RUNNING resumes, nothing is
	// bootstrapped again.
	rs.Stop()
	rs2 := &agent{pki: rs.pki, dataDir: rs.dataDir, listen: rs.listen}
	rs2.Proc = proctest.New(t, "roleserve-restarted", proctest.Build(t, "curia.dev/services/roleserve/cmd/roleserve"),
		"--cluster", cc.PKI.Cluster, "--data-dir", rs.dataDir, "--ca", filepath.Join(cc.PKI.Dir, pki.CACertFile),
		"--curator", curAddr, "--consensus", n.API, "--address", "127.0.0.1", "--listen", rs.listen,
		"--status-interval", "200ms", "--retry-max", "1s", "--log-level", "debug")
	rs2.Start()
	rs2.eventuallyStatus(t, "running after restart", func(st *roleservev1.GetStatusResponse) bool {
		return st.EnrolmentState == roleservev1.EnrolmentState_ENROLMENT_STATE_RUNNING && st.NodeId == first.NodeId &&
			st.RolesSource == "curator" && st.Decision.GetMode() == roleservev1.ConsensusMode_CONSENSUS_MODE_JOIN &&
			st.Launcher.GetPhase() == "running" && st.CuratorConnected
	})
	if rs2.LogContains("bootstrapped a new cluster") {
		t.Fatal("bootstrapped again after the restart")
	}

	// The agent has no etcd access, yet refuses a certificate within 2s of
	// its revocation: it follows the CRL from the curators.
	doomed := cc.PKI.Issue(t, cut.Admin, time.Hour)
	if _, err := rs2.statusAs(t, doomed); err != nil {
		t.Fatal(err)
	}
	cc.PKI.Revoke(t, etcd, doomed.Leaf())
	revoked := time.Now()
	proctest.Eventually(t, 2*time.Second, func() error {
		if _, err := rs2.statusAs(t, doomed); err == nil {
			return errors.New("the revoked certificate still gets an answer")
		}
		return nil
	})
	t.Logf("the agent refuses a revoked certificate %v after the CRL was written", time.Since(revoked).Round(time.Millisecond))
	if _, err := rs2.status(t); err != nil {
		t.Fatalf("a certificate not revoked: %v", err)
	}
}

// startCurator starts a curator replica on top of n's (not yet
// bootstrapped) etcd and returns its address.
func startCurator(t *testing.T, cc *ct.Cluster, n *ct.Node) string {
	t.Helper()
	files := cc.PKI.Files(t, pki.Principal{Kind: pki.KindCurator})
	addr := proctest.FreeAddr(t)
	cur := proctest.New(t, "curator", cut.Binary(t),
		"--cluster", cc.PKI.Cluster, "--name", "curator-0",
		"--ca", files.CA, "--cert", files.Cert, "--key", files.Key,
		"--ca-key", filepath.Join(cc.PKI.Dir, pki.CAKeyFile),
		"--listen", addr,
		"--etcd", n.ClientURL,
		"--consensus", n.API,
		"--session-ttl", "2s",
		"--log-level", "debug")
	cur.Start()
	return addr
}
