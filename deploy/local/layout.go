package local

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"curia.dev/platform/pki"
)

// The state directory is laid out by who may read what (DESIGN §2: one
// identity, one secret). curia-local is the deployment's PKI step: only it
// reads pki/; every process reads public/ and its own directory under
// secrets/ and data/, nothing else. compose mounts each of these
// directories as a volume of its own, into the containers that may read it.
//
//	pki/                         the cluster CA: ca.crt, ca.key, crl.pem, cluster
//	public/                      for everyone: ca.crt, crl.pem, <node>.id (each node's id)
//	secrets/admin/               the operator's certificate: tls.crt, tls.key
//	secrets/curator/             the curators' certificate, and ca.key: they issue node certificates
//	secrets/reconciler/          the reconcilers' certificate
//	secrets/<node>/              the node agent's ed25519 key (node.key); the bootstrap node also
//	                             the node certificate the deployment gives it (bootstrap.crt)
//	secrets/<node>-consensus/    the bootstrap node's consensus key (tls.key) and its consensus and
//	                             member certificates (tls.crt, member.crt): the first etcd member
//	                             starts before any curator could issue them. Every other consensus
//	                             process makes its key in its data directory and gets its
//	                             certificates from the curator, through its agent: the member
//	                             certificate only with ConsensusMember.
//	ticket/ticket                the register ticket, written by init for the agents
//	snapshots/                   the curators' etcd snapshots (platform/snapshots): the leader
//	                             takes and prunes them, every curator shares the directory
//	data/<node>/<process>/       each process's own data (its key and certificates once it has them)
//
// Directories are 0700, keys 0600.
const (
	pkiDir     = "pki"
	publicDir  = "public"
	secretsDir = "secrets"
	ticketDir  = "ticket"
	// snapshotsDir holds the curators' etcd snapshots.
	snapshotsDir = "snapshots"

	tlsCert    = "tls.crt"
	tlsKey     = "tls.key"
	memberCert = "member.crt"
	nodeKey    = "node.key"
	bootCert   = "bootstrap.crt"
)

// Identities (directories under secrets/).
const (
	adminIdentity      = "admin"
	curatorIdentity    = "curator"
	reconcilerIdentity = "reconciler"
)

// agentIdentity and consensusIdentity are a node's two identities.
func agentIdentity(n Node) string     { return n.Name }
func consensusIdentity(n Node) string { return n.Name + "-consensus" }

// Identities lists every directory under secrets/, for the layout test.
func (c *Cluster) Identities() []string {
	out := []string{adminIdentity, curatorIdentity, reconcilerIdentity, consensusIdentity(c.Nodes[0])}
	for _, n := range c.Nodes {
		out = append(out, agentIdentity(n))
	}
	return out
}

func (c *Cluster) public(file string) string           { return c.path(publicDir, file) }
func (c *Cluster) secret(identity, file string) string { return c.path(secretsDir, identity, file) }
func (c *Cluster) ticketFile() string                  { return c.path(ticketDir, "ticket") }

// PKI creates the CA and every identity's files on the first run; later
// runs read the node ids back.
func (c *Cluster) PKI() error {
	if _, err := os.Stat(c.path(pkiDir, pki.CACertFile)); err != nil {
		if err := c.createPKI(); err != nil {
			return fmt.Errorf("create PKI: %w", err)
		}
	}
	if _, err := os.Stat(c.path(pkiDir, "admin-admin.crt")); err == nil {
		return fmt.Errorf("%s holds a cluster of an older curia, whose processes shared one directory of keys: start over (make run FRESH=1, make down-volumes)", c.cfg.State)
	}
	return c.ReadIDs()
}

// ReadIDs reads every node's id from public/.
func (c *Cluster) ReadIDs() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.Nodes {
		b, err := os.ReadFile(c.public(c.Nodes[i].Name + ".id"))
		if err != nil {
			return fmt.Errorf("node id of %s: %w (start over with --fresh)", c.Nodes[i].Name, err)
		}
		c.Nodes[i].ID = strings.TrimSpace(string(b))
	}
	return nil
}

// mkdirs creates the directories of the layout (0700).
func (c *Cluster) mkdirs() error {
	dirs := []string{c.path(pkiDir), c.path(publicDir), c.path(ticketDir)}
	for _, id := range c.Identities() {
		dirs = append(dirs, c.path(secretsDir, id))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
		// An existing directory (a compose volume's mount point) too.
		if err := os.Chmod(d, 0o700); err != nil { //nolint:gosec // G302: a directory, owner only
			return err
		}
	}
	return nil
}

func (c *Cluster) createPKI() error {
	if err := c.mkdirs(); err != nil {
		return err
	}
	ca, err := pki.NewCA(c.cfg.Cluster, 10*365*24*time.Hour)
	if err != nil {
		return err
	}
	crl, err := ca.InitialCRL()
	if err != nil {
		return err
	}
	for _, f := range []struct {
		path string
		data []byte
	}{{c.public(pki.CACertFile), ca.CertPEM}, {c.public(pki.CRLFile), crl}} {
		if err := pki.WriteFileAtomic(f.path, f.data, pki.CertFileMode); err != nil {
			return err
		}
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	if err := pki.WriteFileAtomic(c.secret(curatorIdentity, pki.CAKeyFile), caKey, pki.KeyFileMode); err != nil {
		return err
	}
	for _, id := range []struct {
		dir string
		p   pki.Principal
		at  []string
	}{
		{adminIdentity, pki.Principal{Kind: pki.KindAdmin, Name: "admin"}, nil},
		{curatorIdentity, pki.Principal{Kind: pki.KindCurator}, append(hosts(c.Curators), c.cfg.SANs...)},
		{reconcilerIdentity, pki.Principal{Kind: pki.KindReconciler}, append(hosts(c.Reconcilers), c.cfg.SANs...)},
	} {
		if err := c.issue(ca, id.dir, tlsCert, id.p, nil, id.at...); err != nil {
			return err
		}
	}
	for i, n := range c.Nodes {
		if err := c.newNodeIdentity(ca, n, i == 0); err != nil {
			return err
		}
	}
	if _, err := pki.WriteCluster(c.path(pkiDir), c.cfg.Cluster); err != nil {
		return err
	}
	// The CA goes last: its presence means the PKI is complete.
	_, err = pki.WriteCA(c.path(pkiDir), ca)
	return err
}

// newNodeIdentity gives node n a new key (and so a new id). The bootstrap
// node also gets its certificate, and its consensus process a key with its
// consensus and member certificates.
func (c *Cluster) newNodeIdentity(ca *pki.CA, n Node, bootstrap bool) error {
	key, err := pki.NewNodeKey()
	if err != nil {
		return err
	}
	pub := key.Public().(ed25519.PublicKey)
	id := pki.NodeID(pub)
	agent, cons := agentIdentity(n), consensusIdentity(n)
	if err := writeKey(c.secret(agent, nodeKey), key); err != nil {
		return err
	}
	if bootstrap {
		if err := c.issue(ca, agent, bootCert, pki.Principal{Kind: pki.KindNode, Name: id}, pub, n.Host); err != nil {
			return err
		}
		ckey, err := pki.NewNodeKey()
		if err != nil {
			return err
		}
		if err := writeKey(c.secret(cons, tlsKey), ckey); err != nil {
			return err
		}
		cpub := ckey.Public().(ed25519.PublicKey)
		if err := c.issue(ca, cons, tlsCert, pki.Principal{Kind: pki.KindConsensus, Name: id}, cpub, n.Host); err != nil {
			return err
		}
		if err := c.issue(ca, cons, memberCert, pki.Principal{Kind: pki.KindMember, Name: id}, cpub, n.Host); err != nil {
			return err
		}
	}
	return pki.WriteFileAtomic(c.public(n.Name+".id"), []byte(id+"\n"), pki.CertFileMode)
}

func writeKey(path string, key ed25519.PrivateKey) error {
	b, err := pki.MarshalEd25519PEM(key)
	if err != nil {
		return err
	}
	return pki.WriteFileAtomic(path, b, pki.KeyFileMode)
}

// issue writes a certificate for p into secrets/<dir>/<certName> (and, when
// pub is nil, a new key into tls.key), valid for a year, with SANs for the
// hosts and loopback.
func (c *Cluster) issue(ca *pki.CA, dir, certName string, p pki.Principal, pub ed25519.PublicKey, hosts ...string) error {
	req := pki.IssueRequest{Cluster: c.cfg.Cluster, Principal: p, Validity: 365 * 24 * time.Hour, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
	if pub != nil {
		req.PublicKey = pub
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			req.IPs = append(req.IPs, ip)
		} else {
			req.DNSNames = append(req.DNSNames, h)
		}
	}
	iss, err := ca.Issue(req)
	if err != nil {
		return err
	}
	if iss.KeyPEM != nil {
		if err := pki.WriteFileAtomic(c.secret(dir, tlsKey), iss.KeyPEM, pki.KeyFileMode); err != nil {
			return err
		}
	}
	return pki.WriteFileAtomic(c.secret(dir, certName), iss.CertPEM, pki.CertFileMode)
}

func hosts(addrs []string) []string {
	var out []string
	for _, a := range addrs {
		h, _, _ := net.SplitHostPort(a)
		out = append(out, h)
	}
	return out
}

// Reinstall gives a node that is not the bootstrap node a new identity, as
// an operator reinstalling a machine would: its consensus and agent stop,
// their data is wiped, the node gets a new key (so a new id: a deleted id
// never registers again) and they start afresh; the agent registers with
// the ticket. It returns the new id.
func (c *Cluster) Reinstall(name string, grace time.Duration) (string, error) {
	i := -1
	for j, n := range c.NodeList() {
		if n.Name == name {
			i = j
		}
	}
	if i <= 0 {
		return "", fmt.Errorf("reinstall %s: not a node, or the bootstrap node", name)
	}
	ca, err := pki.LoadCAFromDir(c.path(pkiDir))
	if err != nil {
		return "", err
	}
	n := c.NodeList()[i]
	err = c.Restart(n.Name+"-consensus", grace, func() error {
		return c.Restart(n.Name+"-roleserve", grace, func() error {
			return errors.Join(os.RemoveAll(c.path("data", n.Name)), c.newNodeIdentity(ca, n, false))
		})
	})
	if err != nil {
		return "", err
	}
	if err := c.ReadIDs(); err != nil {
		return "", err
	}
	return c.NodeList()[i].ID, nil
}

// NodeList is a copy of the nodes (Reinstall changes their ids).
func (c *Cluster) NodeList() []Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Node(nil), c.Nodes...)
}
