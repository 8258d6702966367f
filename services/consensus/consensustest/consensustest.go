// Package consensustest runs real consensus processes for tests: the built
// consensus binary, real embedded etcd, real mTLS certificates of a test
// cluster CA, on loopback ports. Nodes are separate processes so that tests
// can kill -9 them like an operator's machine would.
package consensustest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	fencev1 "curia.dev/gen/curia/fence/v1"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
)

// ClusterName is the trust domain of test clusters.
const ClusterName = "test.curia"

// PKI is a test cluster CA writing certificates into a directory.
type PKI struct {
	Dir     string
	Cluster string
	CA      *pki.CA
}

// NewPKI creates a cluster CA in a temporary directory.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	ca, err := pki.NewCA(ClusterName, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := pki.WriteCA(dir, ca); err != nil {
		t.Fatal(err)
	}
	return &PKI{Dir: dir, Cluster: ClusterName, CA: ca}
}

// Files issues a certificate for p (with loopback SANs) and returns its files.
func (k *PKI) Files(t testing.TB, p pki.Principal) rpc.TLSFiles {
	t.Helper()
	base := pki.FileBase(p)
	files := rpc.TLSFiles{CA: filepath.Join(k.Dir, pki.CACertFile), Cert: filepath.Join(k.Dir, pki.CertFile(base)), Key: filepath.Join(k.Dir, pki.KeyFile(base))}
	if _, err := os.Stat(files.Cert); err == nil {
		return files
	}
	iss, err := k.CA.Issue(pki.IssueRequest{
		Cluster: k.Cluster, Principal: p, Validity: 24 * time.Hour,
		DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.WritePair(k.Dir, base, iss.CertPEM, iss.KeyPEM); err != nil {
		t.Fatal(err)
	}
	return files
}

// Creds returns credentials for p.
func (k *PKI) Creds(t testing.TB, p pki.Principal) *rpc.Credentials {
	t.Helper()
	creds, err := rpc.LoadCredentials(k.Cluster, k.Files(t, p))
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// Issue issues a fresh certificate for p (a new serial each time, unlike
// Creds, which keeps one per principal).
func (k *PKI) Issue(t testing.TB, p pki.Principal, validity time.Duration) *rpc.Credentials {
	t.Helper()
	iss, err := k.CA.Issue(pki.IssueRequest{Cluster: k.Cluster, Principal: p, Validity: validity, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := rpc.NewCredentials(k.Cluster, k.CA.CertPEM, iss.CertPEM, iss.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// IssueFor issues a certificate for p of the public key pub (with
// loopback SANs) and returns it as PEM.
func (k *PKI) IssueFor(t testing.TB, p pki.Principal, pub crypto.PublicKey) []byte {
	t.Helper()
	iss, err := k.CA.Issue(pki.IssueRequest{Cluster: k.Cluster, Principal: p, PublicKey: pub, Validity: 24 * time.Hour, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	return iss.CertPEM
}

// Get fetches url (an etcd port: /version, /members) on a new connection
// with cfg, and fails unless the answer is 200: what etcd's ports admit.
func Get(url string, cfg *tls.Config) error {
	tr := &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}
	resp, err := (&http.Client{Timeout: 3 * time.Second, Transport: tr}).Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// HandMade signs tmpl with the CA for a fresh key, for certificates
// pki.Issue refuses to make (no identity, expired): the tests of what
// servers refuse.
func (k *PKI) HandMade(t testing.TB, tmpl *x509.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, k.CA.Cert, &key.PublicKey, k.CA.Key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(pki.EncodeCertPEM(der), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// Revoke writes a CRL into etcd (through cli) that lists certs besides
// whatever the one there lists, numbered above it: what the curator does on
// DeleteNode, without a node to delete. It returns when etcd has it.
func (k *PKI) Revoke(t testing.TB, cli *clientv3.Client, certs ...*x509.Certificate) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, keys.CRL)
	if err != nil {
		t.Fatal(err)
	}
	number := big.NewInt(1)
	var entries []x509.RevocationListEntry
	if len(resp.Kvs) > 0 {
		list, err := pki.VerifyCRL(resp.Kvs[0].Value, k.CA.Cert)
		if err != nil {
			t.Fatal(err)
		}
		entries, number = list.RevokedCertificateEntries, number.Add(list.Number, number)
	}
	for _, c := range certs {
		entries = append(entries, x509.RevocationListEntry{SerialNumber: c.SerialNumber, RevocationTime: time.Now()})
	}
	list, err := k.CA.CRL(entries, number, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, keys.CRL, string(list)); err != nil {
		t.Fatal(err)
	}
}

// NewNodeID returns the id of a fresh node key.
func NewNodeID(t testing.TB) string {
	t.Helper()
	_, id := NewNodeKey(t)
	return id
}

// NewNodeKey returns a fresh node key and its node id.
func NewNodeKey(t testing.TB) (ed25519.PrivateKey, string) {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key, pki.NodeID(pub)
}

// Binary builds the consensus command once per test process, with
// failpoints (they do nothing unless a test sets CURIA_FAILPOINT_DIR).
func Binary(t testing.TB) string {
	return proctest.Build(t, "curia.dev/services/consensus/cmd/consensus", "failpoints")
}

// Cluster is a set of test nodes sharing one PKI.
type Cluster struct {
	t     testing.TB
	PKI   *PKI
	Nodes []*Node
	// Flags go to every process started from now on, after the tests'
	// own (which they override: the last of a flag wins), e.g. etcd's
	// production timing instead of the tests' fast one.
	Flags []string
}

// NewCluster prepares an empty cluster; add nodes with NewNode.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	Binary(t)
	return &Cluster{t: t, PKI: NewPKI(t)}
}

// Node is one consensus process (started or not).
type Node struct {
	c  *Cluster
	ID string
	// Key is the node's ed25519 key; its public half names the node.
	Key       ed25519.PrivateKey
	API       string
	PeerURL   string
	ClientURL string
	DataDir   string
	// Metrics is the plain-HTTP address of /metrics and /healthz.
	Metrics string
	// TLS are the consensus process's files, as the deployment gives them
	// to the bootstrap node: its key, its consensus certificate (TLS.Cert)
	// and its member certificate (MemberCert), both of the key; a bare
	// node has only TLS.CA.
	TLS        rpc.TLSFiles
	MemberCert string
	*proctest.Proc
}

// NewNode allocates a node (id, ports, certificates, data dir) and starts
// its process, idle. The process has a key and its consensus and member
// certificates from the start, as the deployment gives the bootstrap node.
// flags go to the process (e.g. --curator).
func (c *Cluster) NewNode(flags ...string) *Node { return c.newNode(true, flags...) }

// NewBareNode is NewNode for a node like every one but the bootstrap node:
// its consensus process makes its own key and has no certificate until the
// node's agent installs one (SetCredentials). flags go to the process (e.g.
// --curator).
func (c *Cluster) NewBareNode(flags ...string) *Node { return c.newNode(false, flags...) }

func (c *Cluster) newNode(certified bool, flags ...string) *Node {
	t := c.t
	t.Helper()
	key, id := NewNodeKey(t)
	dir := t.TempDir()
	n := &Node{
		c: c, ID: id, Key: key,
		API:       proctest.FreeAddr(t),
		PeerURL:   "https://" + proctest.FreeAddr(t),
		ClientURL: "https://" + proctest.FreeAddr(t),
		DataDir:   filepath.Join(dir, "data"),
		Metrics:   proctest.FreeAddr(t),
		TLS:       rpc.TLSFiles{CA: filepath.Join(c.PKI.Dir, pki.CACertFile)},
	}
	args := []string{
		"--cluster", c.PKI.Cluster,
		"--data-dir", n.DataDir,
		"--ca", n.TLS.CA, "--node-id", id,
	}
	if certified {
		n.TLS.Key, n.TLS.Cert, n.MemberCert = filepath.Join(dir, "consensus.key"), filepath.Join(dir, "consensus.crt"), filepath.Join(dir, "member.crt")
		consensusKey, _ := NewNodeKey(t)
		keyPEM, err := pki.MarshalEd25519PEM(consensusKey)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(n.TLS.Key, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		for path, k := range map[string]pki.Kind{n.TLS.Cert: pki.KindConsensus, n.MemberCert: pki.KindMember} {
			if err := os.WriteFile(path, c.PKI.IssueFor(t, pki.Principal{Kind: k, Name: id}, consensusKey.Public()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		args = append(args, "--cert", n.TLS.Cert, "--key", n.TLS.Key, "--member-cert", n.MemberCert)
	}
	args = append(args,
		"--crl", filepath.Join(c.PKI.Dir, pki.CRLFile),
		"--listen", n.API,
		"--listen-metrics", n.Metrics,
		"--listen-peer", strings.TrimPrefix(n.PeerURL, "https://"),
		"--listen-client", strings.TrimPrefix(n.ClientURL, "https://"),
		"--etcd-tick", "50ms", "--etcd-election-timeout", "500ms",
		"--health-timeout", "1s",
		"--member-call-timeout", "3s",
		// An unreadable pending record waits twice this; every process
		// of a test cluster uses the 3s above.
		"--max-member-call-timeout", "3s",
		"--unsafe-no-fsync",
		// curia's own guards are under test, without etcd's behind them
		// (and without its 5s pause after every change).
		"--unsafe-no-strict-reconfig",
		"--log-level", "debug",
		// etcd's own lines as before: warnings and errors.
		"--etcd-log-level", "warn",
	)
	args = append(args, c.Flags...)
	n.Proc = proctest.New(t, id, Binary(t), append(args, flags...)...)
	c.Nodes = append(c.Nodes, n)
	n.Start()
	return n
}

// Start starts the process (a no-op when it runs) and waits until its API
// answers. With data on disk, the member restarts from it.
func (n *Node) Start() {
	t := n.c.t
	t.Helper()
	n.Proc.Start()
	Eventually(t, 30*time.Second, func() error {
		_, err := n.Consensus(pki.Principal{Kind: pki.KindAdmin, Name: "test"}).Status(context.Background(), &consensusv1.StatusRequest{})
		return err
	})
}

var (
	connMu sync.Mutex
	conns  = map[string]*grpc.ClientConn{}
)

// Conn dials the node's API as principal p (cached per node and principal).
func (n *Node) Conn(p pki.Principal) *grpc.ClientConn {
	t := n.c.t
	t.Helper()
	key := n.API + "|" + p.String()
	connMu.Lock()
	defer connMu.Unlock()
	if cc, ok := conns[key]; ok {
		return cc
	}
	// A bare node serves with a self-signed certificate until its agent
	// installs one.
	cc, err := rpc.Dial(n.API, rpc.ClientConfig{Credentials: n.c.PKI.Creds(t, p), ServerKinds: []pki.Kind{pki.KindConsensus}, AllowSelfSignedServer: true})
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

// Consensus is the node's API as principal p.
func (n *Node) Consensus(p pki.Principal) consensusv1.ConsensusClient {
	return consensusv1.NewConsensusClient(n.Conn(p))
}

// Self is the node's API as its own node agent.
func (n *Node) Self() consensusv1.ConsensusClient {
	return n.Consensus(pki.Principal{Kind: pki.KindNode, Name: n.ID})
}

// Curator is the node's API as the curator.
func (n *Node) Curator() consensusv1.ConsensusClient {
	return n.Consensus(pki.Principal{Kind: pki.KindCurator})
}

// Status returns the node's status (as an admin).
func (n *Node) Status() *consensusv1.StatusResponse {
	t := n.c.t
	t.Helper()
	st, err := n.Consensus(pki.Principal{Kind: pki.KindAdmin, Name: "test"}).Status(context.Background(), &consensusv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Etcd opens an etcd client as the curator to the given endpoints.
func (c *Cluster) Etcd(endpoints ...string) *clientv3.Client {
	t := c.t
	t.Helper()
	creds := c.PKI.Creds(t, pki.Principal{Kind: pki.KindCurator})
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		TLS:         rpc.ClientTLSConfig(creds, []pki.Kind{pki.KindMember}),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Leader is a curator-style leader key that fences membership calls.
type Leader struct {
	Session *concurrency.Session
	Fence   fence.Fence

	t testing.TB
}

// Resign ends the leader's term: its key is gone, its fence stale.
func (l *Leader) Resign() {
	l.t.Helper()
	l.Session.Orphan()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A lease not found has gone already: what Resign is for.
	if _, err := l.Session.Client().Revoke(ctx, l.Session.Lease()); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		l.t.Fatalf("resign: revoke the leader's lease: %v", err)
	}
}

// Campaign wins the curator election through cli and returns its fence.
func (c *Cluster) Campaign(cli *clientv3.Client) *Leader {
	t := c.t
	t.Helper()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Not s.Close: it waits up to the TTL when the cluster is gone.
		s.Orphan()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		// At worst the lease outlives the test by its TTL.
		_, _ = cli.Revoke(ctx, s.Lease())
	})
	e := concurrency.NewElection(s, strings.TrimSuffix(keys.LeaderElection, "/"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Campaign(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	return &Leader{Session: s, Fence: fence.Fence{Conditions: []fence.Condition{{Key: e.Key(), CreateRevision: e.Rev()}}}, t: t}
}

// Bootstrap starts n as a new single-member cluster.
func (c *Cluster) Bootstrap(n *Node) {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.Self().Start(ctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Bootstrap{Bootstrap: &consensusv1.Bootstrap{}}}); err != nil {
		t.Fatalf("bootstrap %s: %v", n.ID, err)
	}
}

// Join adds n as a learner through via (as the curator, under f) and starts
// it. It returns the new member id.
func (c *Cluster) Join(via, n *Node, f fence.Fence) uint64 {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// etcd refuses membership changes (Unavailable) until its voters have
	// been in contact for a few seconds after the last change.
	var added *consensusv1.AddNodeResponse
	Eventually(t, time.Minute, func() error {
		var err error
		added, err = via.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: n.ID, PeerUrl: n.PeerURL, Fence: via.Fenced(f)})
		if retryable(err) {
			return err
		}
		if err != nil {
			t.Fatalf("add %s: %v", n.ID, err)
		}
		return nil
	})
	// The member certificate comes with the role: a node that left
	// dropped the one it had.
	n.InstallMemberCert()
	if _, err := n.Self().Start(ctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: added.Join}}); err != nil {
		t.Fatalf("start %s as learner: %v", n.ID, err)
	}
	return added.Join.MemberId
}

// InstallMemberCert installs the node's member certificate (MemberCert), as
// its agent does when the node gets ConsensusMember.
func (n *Node) InstallMemberCert() {
	t := n.c.t
	t.Helper()
	b, err := os.ReadFile(n.MemberCert)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.Self().SetCredentials(ctx, &consensusv1.SetCredentialsRequest{MemberCertificate: b}); err != nil {
		t.Fatalf("install the member certificate of %s: %v", n.ID, err)
	}
}

// Promote promotes member id through via, retrying while etcd says the
// learner is not ready.
func (c *Cluster) Promote(via *Node, id uint64, f fence.Fence) {
	t := c.t
	t.Helper()
	Eventually(t, time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := via.Curator().PromoteMember(ctx, &consensusv1.PromoteMemberRequest{MemberId: id, Fence: via.Fenced(f)})
		if rpcerr.Is(err, rpcerr.LearnerPending) || rpcerr.Retryable(err) {
			return err
		}
		if err != nil {
			t.Fatalf("promote %x: %v", id, err)
		}
		return nil
	})
}

// Voters builds a cluster of n voters: the first bootstraps, the others
// join and are promoted one at a time. It returns the leader fence used.
func (c *Cluster) Voters(count int) ([]*Node, *Leader) {
	t := c.t
	t.Helper()
	nodes := []*Node{c.NewNode()}
	c.Bootstrap(nodes[0])
	leader := c.Campaign(c.Etcd(nodes[0].ClientURL))
	for i := 1; i < count; i++ {
		n := c.NewNode()
		id := c.Join(nodes[0], n, leader.Fence)
		c.Promote(nodes[0], id, leader.Fence)
		nodes = append(nodes, n)
	}
	return nodes, leader
}

// Members lists members through n as the curator.
func (n *Node) Members() *consensusv1.ListMembersResponse {
	t := n.c.t
	t.Helper()
	var resp *consensusv1.ListMembersResponse
	err := RetryUnavailable(t, func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err = n.Curator().ListMembers(ctx, &consensusv1.ListMembersRequest{})
		return err
	})
	if err != nil {
		t.Fatalf("list members via %s: %v", n.ID, err)
	}
	return resp
}

// GrantLease grants the named lease as the curator leader l would: a lease
// record naming l's key and term, bound to an etcd lease of ttl seconds.
// It returns the holder's fence, [l's key @ term, the lease @ its revision].
func (l *Leader) GrantLease(t testing.TB, name string, ttl int64) fence.Fence {
	t.Helper()
	cli := l.Session.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := cli.Grant(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	leader := l.Fence.Conditions[0]
	b, err := json.Marshal(fence.LeaseRecord{Holder: "test/" + name, Term: leader.CreateRevision, LeaderKey: leader.Key, TTLSeconds: ttl, Granted: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	// A new grant is a new record (a new create revision), as the curator
	// replaces a lease: never the old record rewritten.
	if _, err := cli.Delete(ctx, keys.Lease(name)); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Put(ctx, keys.Lease(name), string(b), clientv3.WithLease(g.ID))
	if err != nil {
		t.Fatal(err)
	}
	return fence.Fence{Conditions: []fence.Condition{leader, {Key: keys.Lease(name), CreateRevision: resp.Header.Revision}}}
}

// Fenced is f with the membership epoch of a fresh member list read
// through n: a change planned from that list.
func (n *Node) Fenced(f fence.Fence) *fencev1.Fence {
	return f.WithEpoch(n.Members().MembershipEpoch).Proto()
}

// retryable: etcd's reconfiguration window, another change in flight, a
// member starting: whatever says it passes by itself.
func retryable(err error) bool { return rpcerr.Retryable(err) }

// Eventually polls f until it returns nil or the deadline passes.
func Eventually(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	proctest.Eventually(t, timeout, f)
}

// RetryUnavailable calls f until it returns anything but Unavailable or
// Aborted: etcd refuses membership changes for a few seconds after the
// previous one, until its voters have been in contact long enough, and
// curia refuses while another change is in flight.
func RetryUnavailable(t testing.TB, f func() error) error {
	t.Helper()
	var err error
	Eventually(t, time.Minute, func() error {
		err = f()
		if retryable(err) {
			return err
		}
		return nil
	})
	return err
}
