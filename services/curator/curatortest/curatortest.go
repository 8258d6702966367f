// Package curatortest runs a real curia control plane for tests: consensus
// processes (real etcd), curator replicas as processes, real mTLS, loopback.
// Agent plays a node's agent through the real enrolment flow.
package curatortest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/records"
	"curia.dev/platform/rpc"
	ct "curia.dev/services/consensus/consensustest"
)

// Cluster is a consensus cluster with curator replicas on top.
type Cluster struct {
	t testing.TB
	*ct.Cluster
	// Voters are the consensus nodes; Voters[0] is the bootstrap node.
	Voters   []*ct.Node
	Curators []*Curator
	// Extra flags for every curator, e.g. a shorter heartbeat timeout.
	CuratorFlags []string
	// ConsensusFirst are consensus addresses a curator added from now on
	// is given before the voters' (--consensus), e.g. one that hangs.
	ConsensusFirst []string
	// BootstrapNode is the bootstrap node's node certificate, issued by
	// the test's deployment and recorded by BootstrapCluster.
	BootstrapNode *rpc.Credentials
}

// Curator is one curator replica process.
type Curator struct {
	Name string
	Addr string
	// HTTPAddr serves the admin API over the Connect protocol.
	HTTPAddr string
	// Metrics is the plain-HTTP address of /metrics and /healthz.
	Metrics string
	*proctest.Proc
}

// New starts a one-voter consensus cluster and n curators, and bootstraps
// the cluster with the voter's node (UP, ConsensusMember and
// KubernetesController).
func New(t testing.TB, curators int, flags ...string) *Cluster {
	t.Helper()
	return NewWithOptions(t, Options{Voters: 1, Curators: curators, CuratorFlags: flags})
}

// Options shape the cluster NewWithOptions starts.
type Options struct {
	// Voters is the number of consensus voters: 3 for an etcd whose
	// writes are replicated to a quorum, as in a deployment. Only the
	// first voter's node is in the registry; the others are etcd members
	// without a node, which matters to nothing but a reconciler (none
	// runs here).
	Voters   int
	Curators int
	// ConsensusFlags go to every consensus process and CuratorFlags to
	// every curator, after the tests' own flags, which they override.
	ConsensusFlags, CuratorFlags []string
}

// NewWithOptions is New with the cluster's shape given.
func NewWithOptions(t testing.TB, o Options) *Cluster {
	t.Helper()
	cc := ct.NewCluster(t)
	cc.Flags = o.ConsensusFlags
	voterNodes, leader := cc.Voters(o.Voters)
	leader.Resign() // the test's stand-in leader makes way for the curators
	c := &Cluster{t: t, Cluster: cc, Voters: voterNodes, CuratorFlags: o.CuratorFlags}
	for i := 0; i < o.Curators; i++ {
		c.AddCurator()
	}
	c.Leader()
	for _, cur := range c.Curators {
		c.Serving(cur) // followers too: a test may talk to one first
	}
	v := voterNodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	for err != nil && ctx.Err() == nil {
		_, err = c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	}
	c.BootstrapNode = c.PKI.Creds(t, pki.Principal{Kind: pki.KindNode, Name: v.ID})
	st := v.Status()
	_, err = curatorv1.NewCuratorClient(c.Conn(c.Curators[0], pki.Principal{Kind: pki.KindAdmin, Name: "test"})).BootstrapCluster(ctx, &curatorv1.BootstrapClusterRequest{
		PublicKey:    v.Key.Public().(ed25519.PublicKey),
		Status:       VoterStatus(v),
		Certificates: [][]byte{pki.EncodeCertPEM(c.BootstrapNode.Certificate().Certificate[0]), st.GetCertificate(), st.GetMemberCertificate()},
	})
	if err != nil {
		t.Fatalf("bootstrap cluster: %v", err)
	}
	return c
}

// VoterStatus is the status a consensus node's agent would report.
func VoterStatus(n *ct.Node) *curatorv1.NodeStatus {
	return &curatorv1.NodeStatus{
		Address:            "127.0.0.1",
		ConsensusApi:       n.API,
		ConsensusPeerUrl:   n.PeerURL,
		ConsensusClientUrl: n.ClientURL,
		ConsensusPublicKey: n.Status().GetPublicKey(),
		RunningServices:    []string{"consensus"},
	}
}

// ConsensusKey is a fresh ed25519 public key, for the status of a node that
// plays having a consensus process (the curator certifies its key when the
// node gets ConsensusMember).
func ConsensusKey(t testing.TB) []byte {
	t.Helper()
	key, _ := ct.NewNodeKey(t)
	return key.Public().(ed25519.PublicKey)
}

// Binary builds the curator command, with failpoints (platform/failpoint:
// off until a test arms one).
func Binary(t testing.TB) string {
	return proctest.Build(t, "curia.dev/services/curator/cmd/curator", "failpoints")
}

// AddCurator starts one more replica.
func (c *Cluster) AddCurator() *Curator {
	t := c.t
	t.Helper()
	files := c.PKI.Files(t, pki.Principal{Kind: pki.KindCurator})
	name := fmt.Sprintf("curator-%d", len(c.Curators))
	addr, httpAddr, metrics := proctest.FreeAddr(t), proctest.FreeAddr(t), proctest.FreeAddr(t)
	var etcd []string
	apis := slices.Clone(c.ConsensusFirst)
	for _, v := range c.Voters {
		etcd = append(etcd, v.ClientURL)
		apis = append(apis, v.API)
	}
	args := append([]string{
		"--cluster", c.PKI.Cluster, "--name", name,
		"--ca", files.CA, "--cert", files.Cert, "--key", files.Key,
		"--ca-key", filepath.Join(c.PKI.Dir, pki.CAKeyFile),
		"--listen", addr,
		"--listen-http", httpAddr,
		"--listen-metrics", metrics,
		"--etcd", strings.Join(etcd, ","),
		"--consensus", strings.Join(apis, ","),
		"--session-ttl", "2s",
		"--log-level", "debug",
	}, c.CuratorFlags...)
	cur := &Curator{Name: name, Addr: addr, HTTPAddr: httpAddr, Metrics: metrics, Proc: proctest.New(t, name, Binary(t), args...)}
	cur.Start()
	c.Curators = append(c.Curators, cur)
	return cur
}

var (
	connMu sync.Mutex
	conns  = map[string]*grpc.ClientConn{}
)

// Conn dials a curator as principal p (cached).
func (c *Cluster) Conn(cur *Curator, p pki.Principal) *grpc.ClientConn {
	t := c.t
	t.Helper()
	key := cur.Addr + "|" + p.String()
	connMu.Lock()
	defer connMu.Unlock()
	if cc, ok := conns[key]; ok {
		return cc
	}
	cc, err := rpc.Dial(cur.Addr, rpc.ClientConfig{Credentials: c.PKI.Creds(t, p), ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		t.Fatal(err)
	}
	conns[key] = cc
	t.Cleanup(func() {
		connMu.Lock()
		delete(conns, key)
		connMu.Unlock()
		cc.Close()
	})
	return cc
}

// Admin is the admin principal of tests.
var Admin = pki.Principal{Kind: pki.KindAdmin, Name: "test"}

// Management is the admin API through the first running curator (any
// replica works: followers forward).
func (c *Cluster) Management() curatorv1.ManagementClient {
	return curatorv1.NewManagementClient(c.Conn(c.Running(), Admin))
}

// Running returns a running curator replica.
func (c *Cluster) Running() *Curator {
	for _, cur := range c.Curators {
		if cur.Running() {
			return cur
		}
	}
	c.t.Fatal("no curator runs")
	return nil
}

// Leader waits until a running replica leads and returns it.
func (c *Cluster) Leader() *Curator {
	t := c.t
	t.Helper()
	var leader *Curator
	proctest.Eventually(t, time.Minute, func() error {
		for _, cur := range c.Curators {
			if !cur.Running() {
				continue
			}
			if resp, err := c.currentLeader(cur); err == nil && resp.ThisIsLeader {
				leader = cur
				return nil
			}
		}
		return errors.New("no running curator leads")
	})
	return leader
}

// Serving waits until cur answers and knows the leader (it leads, or it
// is a follower that can forward): a follower that answers before it
// learned the leader refuses what it would forward (UNAVAILABLE, no
// curator leader is elected yet).
func (c *Cluster) Serving(cur *Curator) {
	c.t.Helper()
	proctest.Eventually(c.t, time.Minute, func() error {
		resp, err := c.currentLeader(cur)
		if err == nil && resp.GetLeaderAddress() == "" {
			err = fmt.Errorf("curator %s knows no leader yet", resp.GetThisName())
		}
		return err
	})
}

// currentLeader is cur's first answer to GetCurrentLeader.
func (c *Cluster) currentLeader(cur *Curator) (*curatorv1.GetCurrentLeaderResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	stream, err := curatorv1.NewCuratorClient(c.Conn(cur, Admin)).GetCurrentLeader(ctx, &curatorv1.GetCurrentLeaderRequest{})
	if err != nil {
		return nil, err
	}
	return stream.Recv()
}

// Agent plays a node's agent: its own ed25519 key, enrolment with a
// self-signed certificate, then its node certificate.
type Agent struct {
	c   *Cluster
	ID  string
	Key ed25519.PrivateKey
	// Creds is the node's identity once committed.
	Creds *rpc.Credentials
}

// NewAgent makes a node key.
func (c *Cluster) NewAgent() *Agent {
	key, id := ct.NewNodeKey(c.t)
	return &Agent{c: c, ID: id, Key: key}
}

// NewConsensusAgent starts an idle consensus process and returns the agent
// of its node (same key), able to become a consensus member. As in a
// deployment, the consensus process follows the curators (--curator): it
// asks them what etcd will not tell it once its member certificate is
// revoked (whether its member is gone).
func (c *Cluster) NewConsensusAgent() (*Agent, *ct.Node) {
	n := c.NewNode("--curator", c.curatorAddrs())
	return &Agent{c: c, ID: n.ID, Key: n.Key}, n
}

// NewBareConsensusAgent is NewConsensusAgent for a node like every one but
// the bootstrap node: its consensus process has no certificate until the
// agent installs one.
func (c *Cluster) NewBareConsensusAgent() (*Agent, *ct.Node) {
	n := c.NewBareNode("--curator", c.curatorAddrs())
	return &Agent{c: c, ID: n.ID, Key: n.Key}, n
}

// curatorAddrs is every curator's address, as --curator takes them.
func (c *Cluster) curatorAddrs() string {
	var addrs []string
	for _, cur := range c.Curators {
		addrs = append(addrs, cur.Addr)
	}
	return strings.Join(addrs, ",")
}

// Enrolling is the Curator API with the agent's self-signed certificate.
func (a *Agent) Enrolling(cur *Curator) curatorv1.CuratorClient {
	t := a.c.t
	t.Helper()
	cc, err := rpc.DialEnrolling(cur.Addr, a.c.PKI.CA.CertPEM, a.Key, []pki.Kind{pki.KindCurator})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return curatorv1.NewCuratorClient(cc)
}

// Enrol registers, gets approved by the admin, and commits; afterwards the
// agent has its node certificate.
func (a *Agent) Enrol(ctx context.Context) *curatorv1.Node {
	t := a.c.t
	t.Helper()
	ticket, err := a.c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cl := a.Enrolling(a.c.Running())
	if _, err := cl.RegisterNode(ctx, &curatorv1.RegisterNodeRequest{RegisterTicket: ticket.Ticket, PublicKey: a.Key.Public().(ed25519.PublicKey)}); err != nil {
		t.Fatalf("register %s: %v", a.ID, err)
	}
	if _, err := a.c.Management().ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: a.ID}); err != nil {
		t.Fatalf("approve %s: %v", a.ID, err)
	}
	resp, err := cl.CommitNode(ctx, &curatorv1.CommitNodeRequest{})
	if err != nil {
		t.Fatalf("commit %s: %v", a.ID, err)
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(a.Key)
	if err != nil {
		t.Fatal(err)
	}
	a.Creds, err = rpc.NewCredentials(a.c.PKI.Cluster, resp.CaCertificate, resp.Certificate, keyPEM)
	if err != nil {
		t.Fatalf("node certificate from commit: %v", err)
	}
	return resp.Node
}

// Curator is the Curator API as the committed node.
func (a *Agent) Curator(cur *Curator) curatorv1.CuratorClient {
	t := a.c.t
	t.Helper()
	cc, err := rpc.Dial(cur.Addr, rpc.ClientConfig{Credentials: a.Creds, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return curatorv1.NewCuratorClient(cc)
}

// AuditLog is the audit log as m serves it, oldest first (up to 10,000
// events, without following).
func AuditLog(t testing.TB, m curatorv1.ManagementClient) []*auditv1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := audit.Backlog(ctx, m, 10000)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// SeedNodes writes n UP nodes straight into etcd, 100 per transaction, and
// returns their ids: a registry of that size for benchmarks, without n
// enrolments.
func SeedNodes(b testing.TB, cli *clientv3.Client, n int) []string {
	b.Helper()
	return SeedNodesWith(b, cli, n, nil)
}

// SeedNodesWith is SeedNodes with each node given its shape by shape (when
// not nil) before it is written, e.g. roles with certificates.
func SeedNodesWith(b testing.TB, cli *clientv3.Client, n int, shape func(*curatorv1.Node)) []string {
	b.Helper()
	ctx := context.Background()
	ids := make([]string, 0, n)
	var ops []clientv3.Op
	flush := func() {
		if len(ops) == 0 {
			return
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
		ops = ops[:0]
	}
	for range n {
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			b.Fatal(err)
		}
		id := pki.NodeID(pub)
		node := &curatorv1.Node{
			Id: id, PublicKey: pub, State: curatorv1.NodeState_NODE_STATE_UP,
			Status: &curatorv1.NodeStatus{Address: "10.0.0.1", Version: "bench"},
			Labels: map[string]string{"zone": "a"},
		}
		if shape != nil {
			shape(node)
		}
		v, err := records.EncodeNode(node)
		if err != nil {
			b.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(keys.Node(id), string(v)))
		ids = append(ids, id)
		if len(ops) == 100 {
			flush()
		}
	}
	flush()
	return ids
}
