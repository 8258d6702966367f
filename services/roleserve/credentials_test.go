package roleserve_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	roleservev1 "curia.dev/gen/curia/roleserve/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
	ct "curia.dev/services/consensus/consensustest"
	cut "curia.dev/services/curator/curatortest"
)

// enrolBare starts the agent of a bare consensus node (no certificate from
// the deployment), approves it and waits until it runs.
func enrolBare(t *testing.T, c *cut.Cluster, args ...string) (*cut.Agent, *ct.Node, *agent) {
	t.Helper()
	a, n := c.NewBareConsensusAgent()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs := startAgent(t, c.PKI, n, append([]string{"--curator", c.Curators[0].Addr, "--register-ticket-file", ticketFile(t, c)}, args...)...)
	proctest.Eventually(t, time.Minute, func() error {
		if _, err := c.Management().ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: a.ID}); err != nil {
			return err
		}
		return nil
	})
	rs.eventuallyStatus(t, "running", func(st *roleservev1.GetStatusResponse) bool {
		return st.EnrolmentState == roleservev1.EnrolmentState_ENROLMENT_STATE_RUNNING && st.CuratorConnected
	})
	// Its status (consensus URLs and key) reached the curator.
	proctest.Eventually(t, time.Minute, func() error {
		node, err := getNode(t, c.Management(), a.ID)
		if err != nil {
			return err
		}
		if node.GetStatus().GetConsensusPeerUrl() == "" || len(node.GetStatus().GetConsensusPublicKey()) == 0 {
			return fmt.Errorf("status %v", node.GetStatus())
		}
		return nil
	})
	return a, n, rs
}

// etcdAdmits says whether etcd's port at url (client port: /version, peer
// port: /members) answers a new connection with certPEM and keyPEM.
func etcdAdmits(t *testing.T, c *cut.Cluster, url string, certPEM, keyPEM []byte) error {
	t.Helper()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pki.CertPool(c.PKI.CA.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	return ct.Get(url, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: "localhost"})
}

// TestCredentialsFollowTheRole: a node whose consensus process got nothing
// from the deployment gets its consensus certificate through its agent; as
// a worker, nothing it holds or can obtain reaches etcd's ports; given
// ConsensusMember, its member certificate (issued with the role) runs its
// member; the role taken away, that certificate is refused by etcd within
// 2s and the member's data is wiped.
func TestCredentialsFollowTheRole(t *testing.T) {
	c := cut.New(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, n, rs := enrolBare(t, c)
	voter := c.Voters[0]

	var st *consensusv1.StatusResponse
	proctest.Eventually(t, time.Minute, func() error {
		st = n.Status()
		if len(st.GetCertificate()) == 0 {
			return errors.New("the agent did not install a consensus certificate")
		}
		return nil
	})
	api, err := pki.ParseCertPEM(st.GetCertificate())
	if err != nil {
		t.Fatal(err)
	}
	if p, err := pki.PrincipalFromCert(api, c.PKI.Cluster); err != nil || p != (pki.Principal{Kind: pki.KindConsensus, Name: a.ID}) || !ofKeyPEM(api, st.GetPublicKey()) {
		t.Fatalf("consensus certificate for %v (%v), want consensus/%s of the process's key", p, err, a.ID)
	}
	if len(st.GetMemberCertificate()) != 0 {
		t.Fatal("a worker's consensus process holds a member certificate")
	}

	// Every credential of the worker: its agent's node certificate, its
	// consensus process's certificate, and whatever the agent can obtain.
	nodeCert, _ := os.ReadFile(filepath.Join(rs.dataDir, "node.crt"))
	nodeKey, _ := os.ReadFile(filepath.Join(rs.dataDir, "node.key"))
	consKey, _ := os.ReadFile(filepath.Join(n.DataDir, "identity.key"))
	creds, err := rpc.NewCredentials(c.PKI.Cluster, c.PKI.CA.CertPEM, nodeCert, nodeKey)
	if err != nil {
		t.Fatal(err)
	}
	a.Creds = creds
	var obtained *curatorv1.IssueCertificatesResponse
	proctest.Eventually(t, 30*time.Second, func() (err error) {
		// (ResourceExhausted while the agent's own call is recent.)
		obtained, err = a.Curator(c.Running()).IssueCertificates(ctx, &curatorv1.IssueCertificatesRequest{ConsensusPublicKey: st.GetPublicKey()})
		return err
	})
	if len(obtained.GetMemberCertificate()) != 0 {
		t.Fatal("a worker's agent obtained a member certificate")
	}
	for name, pair := range map[string][2][]byte{
		"node certificate":               {nodeCert, nodeKey},
		"consensus certificate":          {st.GetCertificate(), consKey},
		"obtained node certificate":      {obtained.GetNodeCertificate(), nodeKey},
		"obtained consensus certificate": {obtained.GetConsensusCertificate(), consKey},
	} {
		for _, url := range []string{voter.ClientURL + "/version", voter.PeerURL + "/members"} {
			if err := etcdAdmits(t, c, url, pair[0], pair[1]); err == nil {
				t.Errorf("the worker's %s reached %s", name, url)
			}
		}
	}

	// With ConsensusMember: a learner, on the member certificate the role
	// carries, which etcd admits.
	updateRoles(t, c, a.ID, true)
	rs.eventuallyStatus(t, "member running", func(st *roleservev1.GetStatusResponse) bool {
		return st.Launcher.GetPhase() == "running" && running(st.Consensus)
	})
	node, err := getNode(t, c.Management(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	roleCert := node.GetRoles().GetConsensusMember().GetMemberCertificate()
	if got := n.Status().GetMemberCertificate(); string(got) != string(roleCert) || len(roleCert) == 0 {
		t.Fatal("the consensus process does not hold the member certificate of the role")
	}
	for _, url := range []string{voter.ClientURL + "/version", voter.PeerURL + "/members"} {
		if err := etcdAdmits(t, c, url, roleCert, consKey); err != nil {
			t.Fatalf("the member certificate is refused by %s: %v", url, err)
		}
	}

	// Without: removed first, then the role and its certificate go.
	updateRoles(t, c, a.ID, false)
	removed := time.Now()
	proctest.Eventually(t, 2*time.Second, func() error {
		if err := etcdAdmits(t, c, voter.ClientURL+"/version", roleCert, consKey); err == nil {
			return errors.New("etcd's client port still admits the member certificate")
		}
		if err := etcdAdmits(t, c, voter.PeerURL+"/members", roleCert, consKey); err == nil {
			return errors.New("etcd's peer port still admits the member certificate")
		}
		return nil
	})
	t.Logf("etcd refuses the member certificate %v after UpdateNodeRoles consensus_member=false answered", time.Since(removed).Round(time.Millisecond))
	rs.eventuallyStatus(t, "left", func(st *roleservev1.GetStatusResponse) bool {
		return st.Launcher.GetPhase() == "left" && st.Consensus.GetState() == consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE && len(st.Consensus.GetMemberCertificate()) == 0
	})
	if _, err := os.Stat(filepath.Join(n.DataDir, "member.crt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("member.crt after the node left: %v", err)
	}

	// Removed while its consensus process is down: back, its etcd cannot
	// learn of the removal (the peers refuse its revoked certificate), nor
	// ask etcd about it; it asks the curators, and leaves.
	updateRoles(t, c, a.ID, true)
	rs.eventuallyStatus(t, "member running again", func(st *roleservev1.GetStatusResponse) bool {
		return st.Launcher.GetPhase() == "running" && running(st.Consensus)
	})
	n.Stop()
	proctest.Eventually(t, time.Minute, func() error {
		if n.Running() {
			return errors.New("still running")
		}
		return nil
	})
	updateRoles(t, c, a.ID, false)
	n.Start()
	rs.eventuallyStatus(t, "left after a removal it missed", func(st *roleservev1.GetStatusResponse) bool {
		return st.Launcher.GetPhase() == "left" && st.Consensus.GetState() == consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE
	})
	if !n.LogContains("left the cluster and wiped etcd data") {
		t.Fatal("the consensus process did not say it left")
	}

	// A member node deleted (both bypasses): its member certificate is
	// refused by etcd, its node certificate by the curators, within 2s.
	updateRoles(t, c, a.ID, true)
	rs.eventuallyStatus(t, "member running once more", func(st *roleservev1.GetStatusResponse) bool {
		return st.Launcher.GetPhase() == "running" && running(st.Consensus) && len(st.Consensus.GetMemberCertificate()) > 0
	})
	memberCert := n.Status().GetMemberCertificate()
	if err := etcdAdmits(t, c, voter.ClientURL+"/version", memberCert, consKey); err != nil {
		t.Fatalf("the member certificate before the deletion: %v", err)
	}
	if _, err := c.Management().DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: a.ID, SafetyBypassHasRoles: true, SafetyBypassNotDecommissioned: true}); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	proctest.Eventually(t, 2*time.Second, func() error {
		for _, url := range []string{voter.ClientURL + "/version", voter.PeerURL + "/members"} {
			if etcdAdmits(t, c, url, memberCert, consKey) == nil {
				return fmt.Errorf("%s admits the deleted node's member certificate", url)
			}
		}
		stream, err := a.Curator(c.Running()).GetCurrentLeader(ctx, &curatorv1.GetCurrentLeaderRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		if err == nil {
			return errors.New("the curator admits the deleted node's certificate")
		}
		return nil
	})
	t.Logf("etcd and the curator refuse the deleted member node's certificates %v after DeleteNode answered", time.Since(deleted).Round(time.Millisecond))

	// The deleted node's machine reboots: its consensus process starts
	// with revoked certificates on disk, and serves (self-signed) instead
	// of exiting in a loop, which would keep the node's supervisor, and a
	// deployment waiting on health, from ever settling.
	served := func() int {
		b, _ := os.ReadFile(n.Log)
		return strings.Count(string(b), `msg="consensus serving"`)
	}
	before := served()
	n.Stop()
	n.Start()
	proctest.Eventually(t, time.Minute, func() error {
		if !n.Running() {
			t.Fatalf("the deleted node's consensus process exited at start; its log: %s", tailOf(n.Log))
		}
		if served() == before {
			return errors.New("not serving yet")
		}
		return nil
	})
	if !n.LogContains("revoked") {
		t.Fatal("the consensus process did not say its certificates on disk are revoked")
	}
}

// tailOf is the last lines of a log file.
func tailOf(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-10):], "\n")
}

// ofKeyPEM reports whether c certifies the ed25519 key pub.
func ofKeyPEM(c *x509.Certificate, pub []byte) bool {
	k, ok := c.PublicKey.(ed25519.PublicKey)
	return ok && bytes.Equal(k, pub)
}

// TestRenewal: with certificates valid for a minute, the agent renews its
// node certificate and its consensus process's certificates (the member's
// too) after two thirds of their life, without a restart, and the node keeps
// working across several renewals: its member runs, its heartbeats arrive,
// its API answers.
func TestRenewal(t *testing.T) {
	c := cut.New(t, 1, "--cert-validity", "1m")
	a, n, rs := enrolBare(t, c, "--renew-check", "2s")
	updateRoles(t, c, a.ID, true)
	rs.eventuallyStatus(t, "member running", func(st *roleservev1.GetStatusResponse) bool {
		return st.Launcher.GetPhase() == "running" && running(st.Consensus)
	})
	serial := func(pemBytes []byte) string {
		cert, err := pki.ParseCertPEM(pemBytes)
		if err != nil {
			return ""
		}
		return cert.SerialNumber.Text(16)
	}
	seen := map[string]map[string]bool{"node": {}, "consensus": {}, "member": {}}
	begun := time.Now()
	proctest.Eventually(t, 4*time.Minute, func() error {
		nodeCert, _ := os.ReadFile(filepath.Join(rs.dataDir, "node.crt"))
		st := n.Status()
		seen["node"][serial(nodeCert)] = true
		seen["consensus"][serial(st.GetCertificate())] = true
		seen["member"][serial(st.GetMemberCertificate())] = true
		// Working all along: never an expired certificate in use.
		for kind, b := range map[string][]byte{"node": nodeCert, "consensus": st.GetCertificate(), "member": st.GetMemberCertificate()} {
			if cert, err := pki.ParseCertPEM(b); err != nil || time.Now().After(cert.NotAfter) {
				t.Fatalf("the %s certificate in use is expired or missing (%v)", kind, err)
			}
		}
		if !running(st) {
			t.Fatalf("the member stopped: %v", st)
		}
		for kind, serials := range seen {
			if len(serials) < 4 {
				return fmt.Errorf("%s certificates seen: %d, want 4 (three renewals)", kind, len(serials))
			}
		}
		return nil
	})
	t.Logf("three renewals of each certificate in %v", time.Since(begun).Round(time.Second))
	node, err := getNode(t, c.Management(), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if node.Health != curatorv1.NodeHealth_NODE_HEALTH_HEALTHY {
		t.Fatalf("node health %v after the renewals", node.Health)
	}
	// A renewal replaces the agent's connections, so its heartbeat stream
	// reconnects: connected again within moments, not at once.
	rs.eventuallyStatus(t, "agent connected to the curator after the renewals", func(st *roleservev1.GetStatusResponse) bool {
		return st.CuratorConnected
	})

	// Down past the certificate's expiry: back, the agent commits again
	// with the node key and works.
	rs.Stop()
	certFile := filepath.Join(rs.dataDir, "node.crt")
	proctest.Eventually(t, 2*time.Minute, func() error {
		b, _ := os.ReadFile(certFile)
		if cert, err := pki.ParseCertPEM(b); err != nil || time.Now().Before(cert.NotAfter) {
			return fmt.Errorf("the node certificate has not expired yet (%v)", err)
		}
		return nil
	})
	rs.Start()
	rs.eventuallyStatus(t, "working again after its certificate expired", func(st *roleservev1.GetStatusResponse) bool {
		b, _ := os.ReadFile(certFile)
		cert, err := pki.ParseCertPEM(b)
		return err == nil && time.Now().Before(cert.NotAfter) && st.CuratorConnected && st.Launcher.GetPhase() == "running"
	})
}

// TestCARotation walks the documented CA rotation: every process trusts the
// old CA and a new one (a bundle), the curators switch to issuing with the
// new one, and the agent renews every certificate of its node — its own,
// its consensus process's consensus and member certificates — from the new
// CA without a restart, while the node keeps running its member; a node
// deleted afterwards is refused although the old CA issued its certificate.
func TestCARotation(t *testing.T) {
	c := cut.New(t, 1, "--cert-validity", "10m")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, n, rs := enrolBare(t, c, "--renew-check", "1s")
	updateRoles(t, c, a.ID, true)
	rs.eventuallyStatus(t, "member running", func(st *roleservev1.GetStatusResponse) bool {
		return st.Launcher.GetPhase() == "running" && running(st.Consensus)
	})
	old := c.NewAgent()
	old.Enrol(ctx)

	// 1. Every process trusts both CAs (a rolling restart).
	next, err := pki.NewCA(c.PKI.Cluster, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(c.PKI.Dir, pki.CACertFile)
	if err := os.WriteFile(caFile, append(append([]byte{}, c.PKI.CA.CertPEM...), next.CertPEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	restart(t, c.Voters[0])
	restart(t, n)
	for _, cur := range c.Curators {
		restart(t, cur)
	}
	restart(t, rs)
	rs.eventuallyStatus(t, "running on the bundle", func(st *roleservev1.GetStatusResponse) bool {
		return st.CuratorConnected && st.Launcher.GetPhase() == "running" && running(st.Consensus)
	})

	// 2. The curators issue with the new CA (its key, and a certificate of
	// it for themselves).
	keyPEM, err := next.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.PKI.Dir, pki.CAKeyFile), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	curFiles := c.PKI.Files(t, pki.Principal{Kind: pki.KindCurator})
	iss, err := next.Issue(pki.IssueRequest{Cluster: c.PKI.Cluster, Principal: pki.Principal{Kind: pki.KindCurator}, Validity: time.Hour, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(curFiles.Cert, iss.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(curFiles.Key, iss.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	switched := time.Now()
	for _, cur := range c.Curators {
		restart(t, cur)
	}

	// 3. The agent renews everything from the new CA.
	of := func(pemBytes []byte) bool {
		cert, err := pki.ParseCertPEM(pemBytes)
		return err == nil && cert.CheckSignatureFrom(next.Cert) == nil
	}
	proctest.Eventually(t, 2*time.Minute, func() error {
		nodeCert, _ := os.ReadFile(filepath.Join(rs.dataDir, "node.crt"))
		st := n.Status()
		if !of(nodeCert) || !of(st.GetCertificate()) || !of(st.GetMemberCertificate()) {
			return fmt.Errorf("of the new CA: node %v, consensus %v, member %v", of(nodeCert), of(st.GetCertificate()), of(st.GetMemberCertificate()))
		}
		if !running(st) {
			return fmt.Errorf("member %v", st.GetState())
		}
		return nil
	})
	t.Logf("every certificate of the node renewed from the new CA %v after the curators switched", time.Since(switched).Round(100*time.Millisecond))
	rs.eventuallyStatus(t, "working on the new CA's certificates", func(st *roleservev1.GetStatusResponse) bool {
		return st.CuratorConnected && st.Launcher.GetPhase() == "running" && running(st.Consensus)
	})

	// Revocation goes on across the switch: the CRL the new CA signs
	// lists a certificate of the old one. (Clients trust the bundle too.)
	bundle, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	oldKey, err := pki.MarshalPrivateKeyPEM(old.Key)
	if err != nil {
		t.Fatal(err)
	}
	if old.Creds, err = rpc.NewCredentials(c.PKI.Cluster, bundle, pki.EncodeCertPEM(old.Creds.Certificate().Certificate[0]), oldKey); err != nil {
		t.Fatal(err)
	}
	works := func() error {
		stream, err := old.Curator(c.Running()).GetCurrentLeader(ctx, &curatorv1.GetCurrentLeaderRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		return err
	}
	if err := works(); err != nil {
		t.Fatalf("a certificate of the old CA before its node's deletion: %v", err)
	}
	admin, err := rpc.Dial(c.Running().Addr, rpc.ClientConfig{Credentials: c.PKI.Creds(t, cut.Admin), ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := curatorv1.NewManagementClient(admin).DeleteNode(ctx, &curatorv1.DeleteNodeRequest{NodeId: old.ID, SafetyBypassNotDecommissioned: true}); err != nil {
		t.Fatal(err)
	}
	proctest.Eventually(t, 2*time.Second, func() error {
		if works() == nil {
			return errors.New("the deleted node's certificate of the old CA still works")
		}
		return nil
	})
}

// restart stops a process (SIGTERM), waits until it exited, and starts it.
func restart(t *testing.T, p interface {
	Stop()
	Running() bool
	Start()
}) {
	t.Helper()
	p.Stop()
	proctest.Eventually(t, time.Minute, func() error {
		if p.Running() {
			return errors.New("still running")
		}
		return nil
	})
	p.Start()
}
