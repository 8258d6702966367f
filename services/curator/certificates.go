package curator

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpcerr"
)

// Certificates of nodes (DESIGN §2): every certificate issued to a node is
// recorded on its record (Node.certificates) until it expires, the bootstrap
// node's from the deployment included; a re-commit revokes the certificate it
// replaces; DeleteNode revokes every recorded one still valid and tombstones
// the id, which never registers again. The revocation list lives in etcd
// (keys.CRL); every replica follows it and serves it (WatchCRL) to the
// servers that have no etcd access.

// crlValidity is how long a CRL stays valid; it is re-signed on every
// revocation.
const crlValidity = 365 * 24 * time.Hour

// recordIssued adds cert to n's certificates, and drops the entries of
// certificates that have expired: nothing can use them any more.
func recordIssued(n *curatorv1.Node, cert *x509.Certificate, cluster string) {
	now := time.Now()
	n.Certificates = slices.DeleteFunc(n.Certificates, func(c *curatorv1.IssuedCertificate) bool {
		return c.GetNotAfter().AsTime().Before(now)
	})
	p, _ := pki.PrincipalFromCert(cert, cluster)
	n.Certificates = append(n.Certificates, &curatorv1.IssuedCertificate{
		Serial:    cert.SerialNumber.Text(16),
		Principal: p.String(),
		NotAfter:  timestamppb.New(cert.NotAfter),
		Issued:    timestamppb.New(now),
	})
}

// issueFor issues n a certificate of principal kind k for pub, with SANs
// for hosts (a loopback address brings 127.0.0.1 along: the source address
// of every connection over loopback), and records it on n.
func (s *Service) issueFor(n *curatorv1.Node, k pki.Kind, pub crypto.PublicKey, hosts ...string) (*pki.Issued, error) {
	req := pki.IssueRequest{Cluster: s.cfg.Cluster, Principal: pki.Principal{Kind: k, Name: n.Id}, PublicKey: pub, Validity: s.cfg.CertValidity}
	for _, h := range hosts {
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			req.IPs = append(req.IPs, ip)
			if ip.IsLoopback() && !ip.Equal(net.IPv4(127, 0, 0, 1)) {
				req.IPs = append(req.IPs, net.IPv4(127, 0, 0, 1))
			}
		} else if !slices.Contains(req.DNSNames, h) {
			req.DNSNames = append(req.DNSNames, h)
		}
	}
	iss, err := s.ca.Issue(req)
	if err != nil {
		return nil, fmt.Errorf("issue %s: %w", req.Principal, err)
	}
	recordIssued(n, iss.Cert, s.cfg.Cluster)
	return iss, nil
}

// consensusKey is the key of n's consensus process, or an error saying the
// node has not reported one.
func consensusKey(n *curatorv1.Node) (ed25519.PublicKey, error) {
	k := n.GetStatus().GetConsensusPublicKey()
	if len(k) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: node %s has not reported its consensus key (status.consensus_public_key): its agent does once its consensus process runs", errRefused, n.Id)
	}
	return ed25519.PublicKey(k), nil
}

// hostOf is the host of a URL (or host:port), "" if it has none.
func hostOf(s string) string {
	if u, err := url.Parse(s); err == nil && u.Host != "" {
		return u.Hostname()
	}
	if h, _, err := net.SplitHostPort(s); err == nil {
		return h
	}
	return ""
}

// issueMember issues n's member certificate, for its consensus key, naming
// the hosts of its consensus peer and client URLs (peers bind it to the
// address they see it connect from).
func (s *Service) issueMember(n *curatorv1.Node) (*pki.Issued, error) {
	key, err := consensusKey(n)
	if err != nil {
		return nil, err
	}
	st := n.GetStatus()
	return s.issueFor(n, pki.KindMember, key, hostOf(st.GetConsensusPeerUrl()), hostOf(st.GetConsensusClientUrl()))
}

// withMemberCertificate completes a role write on n (whose roles become
// roles): a ConsensusMember that is new gets its member certificate, and
// when the role goes, or names another member than before, every member
// certificate of n that the new roles do not carry is revoked. A role
// written for a member whose record had lost it (the reconciler completing
// "membership ahead of roles") revokes nothing: the running member may use
// any of them. It returns the CRL write and its guard, if any.
func (s *Service) withMemberCertificate(ctx context.Context, n *curatorv1.Node, roles *curatorv1.Roles) ([]clientv3.Op, []clientv3.Cmp, error) {
	cm := roles.GetConsensusMember()
	old := n.GetRoles().GetConsensusMember()
	revoking := cm == nil || (old != nil && old.GetJoin().GetMemberId() != cm.GetJoin().GetMemberId())
	if cm != nil && len(cm.GetMemberCertificate()) == 0 {
		iss, err := s.issueMember(n)
		if err != nil {
			return nil, nil, err
		}
		cm = &curatorv1.ConsensusMember{Join: cm.GetJoin(), MemberCertificate: iss.CertPEM}
		roles.ConsensusMember = cm
	}
	var keep string
	if cm != nil {
		if c, err := pki.ParseCertPEM(cm.GetMemberCertificate()); err == nil {
			keep = c.SerialNumber.Text(16)
		}
	}
	var stale []string
	for _, c := range n.GetCertificates() {
		if !revoking {
			break
		}
		if strings.HasPrefix(c.GetPrincipal(), string(pki.KindMember)+"/") && !c.GetRevoked() && c.GetSerial() != keep && c.GetNotAfter().AsTime().After(time.Now()) {
			stale = append(stale, c.GetSerial())
		}
	}
	if len(stale) == 0 {
		return nil, nil, nil
	}
	put, cmp, err := s.revoke(ctx, stale...)
	if err != nil {
		return nil, nil, err
	}
	markRevoked(n, stale)
	return []clientv3.Op{put}, []clientv3.Cmp{cmp}, nil
}

// unrevoked are the serials of n's recorded certificates that are neither
// revoked nor expired, and of its current node certificate (a record made
// before certificates were recorded has only that).
func unrevoked(n *curatorv1.Node) []string {
	now := time.Now()
	var out []string
	for _, c := range n.GetCertificates() {
		if !c.GetRevoked() && c.GetNotAfter().AsTime().After(now) {
			out = append(out, c.GetSerial())
		}
	}
	if s := n.GetCertificateSerial(); s != "" && !slices.Contains(out, s) && !slices.ContainsFunc(n.GetCertificates(), func(c *curatorv1.IssuedCertificate) bool { return c.GetSerial() == s }) {
		out = append(out, s)
	}
	return out
}

// markRevoked marks the recorded certificates with these serials revoked.
func markRevoked(n *curatorv1.Node, serials []string) {
	for _, c := range n.GetCertificates() {
		if slices.Contains(serials, c.GetSerial()) {
			c.Revoked = true
		}
	}
}

// deploymentCertificates parses the certificates a bootstrap request brings
// and checks each: of the cluster CA, valid now, and for node id.
func (s *Service) deploymentCertificates(id string, pems [][]byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for i, b := range pems {
		cert, err := pki.ParseCertPEM(b)
		if err != nil {
			return nil, fmt.Errorf("%w: certificates[%d]: %v", errBadRequest, i, err)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: s.creds.CAPool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return nil, fmt.Errorf("%w: certificates[%d] (serial %x) is not a valid certificate of this cluster's CA: %v", errBadRequest, i, cert.SerialNumber, err)
		}
		p, err := pki.PrincipalFromCert(cert, s.cfg.Cluster)
		if err != nil || p.Name != id {
			return nil, fmt.Errorf("%w: certificates[%d] is for %v, not for node %s (%v)", errBadRequest, i, p, id, err)
		}
		out = append(out, cert)
	}
	return out, nil
}

// revoke returns the write of a new CRL that also revokes serials (hex), and
// the comparison that the CRL did not change since it was read. A serial
// already on the list is not listed twice.
//
// The list this replica holds (its watcher's: the newest it saw) may be
// newer than the one stored: etcd restored from a snapshot, or recovered
// from an older state, steps back, while every process keeps the newest list
// it saw and refuses an older one. So the new list is numbered past both,
// and keeps both lists' revocations (DESIGN §5: CRL numbers never go
// backwards, and no revocation is lost).
func (s *Service) revoke(ctx context.Context, serials ...string) (clientv3.Op, clientv3.Cmp, error) {
	resp, err := s.etcd.Get(ctx, keys.CRL)
	if err != nil {
		return clientv3.Op{}, clientv3.Cmp{}, fmt.Errorf("read CRL: %w", err)
	}
	var entries []x509.RevocationListEntry
	number := big.NewInt(0)
	var rev int64
	if len(resp.Kvs) > 0 {
		rev = resp.Kvs[0].ModRevision
		crl, _, err := pki.VerifyCRLOf(resp.Kvs[0].Value, s.trusted)
		if err != nil {
			return clientv3.Op{}, clientv3.Cmp{}, fmt.Errorf("stored CRL: %w", err)
		}
		entries = crl.RevokedCertificateEntries
		number.Set(crl.Number)
	}
	if held, err := s.heldCRL(); err != nil {
		return clientv3.Op{}, clientv3.Cmp{}, err
	} else if held != nil && held.Number.Cmp(number) > 0 {
		s.log.Warn("the CRL in etcd is older than the one this curator holds (etcd restored or recovered from an older state): the new list is numbered past the held one and keeps its revocations",
			"stored_number", number, "held_number", held.Number, "stored_revoked", len(entries), "held_revoked", len(held.RevokedCertificateEntries))
		if !failpoint.Mutated(failpoint.CRLNumberFromEtcd) {
			number.Set(held.Number)
		}
		if !failpoint.Mutated(failpoint.NoCRLUnion) {
			entries = unionEntries(entries, held.RevokedCertificateEntries)
		}
	}
	number.Add(number, big.NewInt(1))
	for _, serial := range serials {
		sn, ok := new(big.Int).SetString(serial, 16)
		if !ok {
			return clientv3.Op{}, clientv3.Cmp{}, fmt.Errorf("certificate serial %q is not hex", serial)
		}
		entries = unionEntries(entries, []x509.RevocationListEntry{{SerialNumber: sn, RevocationTime: time.Now()}})
	}
	pem, err := s.ca.CRL(entries, number, crlValidity)
	if err != nil {
		return clientv3.Op{}, clientv3.Cmp{}, fmt.Errorf("sign CRL: %w", err)
	}
	return clientv3.OpPut(keys.CRL, string(pem)), clientv3.Compare(clientv3.ModRevision(keys.CRL), "=", rev), nil
}

// heldCRL is the list this replica's watcher holds (verified when it was
// loaded), nil before any.
func (s *Service) heldCRL() (*x509.RevocationList, error) {
	_, der, _, _ := s.crl.Current()
	if der == nil {
		return nil, nil
	}
	l, err := x509.ParseRevocationList(der)
	if err != nil {
		return nil, fmt.Errorf("the CRL held: %w", err)
	}
	return l, nil
}

// unionEntries is a with the entries of b whose serial a does not list
// appended (the watchers revoke by serial alone).
func unionEntries(a, b []x509.RevocationListEntry) []x509.RevocationListEntry {
	for _, e := range b {
		if !slices.ContainsFunc(a, func(x x509.RevocationListEntry) bool { return x.SerialNumber.Cmp(e.SerialNumber) == 0 }) {
			a = append(a, e)
		}
	}
	return a
}

// resignCRL signs the CRL again with this curator's CA when another CA of
// the bundle signed the one in etcd (or there is none): after a CA rotation
// switched the curators to the new CA, the list carries the old CA's
// revocations over, and its new issuer tells the agents to renew their
// certificates (roleserve: certificates.go). The write is the leader's.
func (s *Service) resignCRL(ctx context.Context) error {
	resp, err := s.etcd.Get(ctx, keys.CRL)
	if err != nil {
		return fmt.Errorf("read CRL: %w", err)
	}
	if len(resp.Kvs) > 0 {
		if _, issuer, err := pki.VerifyCRLOf(resp.Kvs[0].Value, s.trusted); err == nil && issuer.Equal(s.ca.Cert) {
			return nil
		}
	}
	put, cmp, err := s.revoke(ctx)
	if err != nil {
		return err
	}
	if _, err := s.lead.Txn(ctx, []clientv3.Cmp{cmp}, put); err != nil && !errors.Is(err, errConflict) {
		return err
	}
	s.log.Info("CRL signed by this curator's CA", "ca", s.ca.Cert.Subject.String())
	return nil
}

// notTombstoned refuses a node id that was deleted.
func (s *Service) notTombstoned(ctx context.Context, id string) error {
	resp, err := s.etcd.Get(ctx, keys.Tombstone(id))
	if err != nil {
		return fmt.Errorf("read tombstone of %s: %w", id, err)
	}
	if len(resp.Kvs) > 0 && !failpoint.Mutated(failpoint.NoTombstones) {
		return fmt.Errorf("%w: node %s was deleted (%s) and node ids are never reused: give the node a new identity (wipe its agent's data directory, or a new --node-key)", errDenied, id, resp.Kvs[0].Value)
	}
	return nil
}

// tombstone is the comparison that id has no tombstone yet and the write
// that gives it one, for the deleting transaction.
func tombstone(id string) (clientv3.Cmp, clientv3.Op) {
	return clientv3.Compare(clientv3.CreateRevision(keys.Tombstone(id)), "=", 0),
		clientv3.OpPut(keys.Tombstone(id), time.Now().UTC().Format(time.RFC3339))
}

// WatchCRL streams this replica's view of the CRL in etcd: the current list,
// then every newer one.
func (x *curatorServer) WatchCRL(_ *curatorv1.WatchCRLRequest, stream curatorv1.Curator_WatchCRLServer) error {
	var sent *big.Int
	for {
		pem, _, number, changed := x.s.crl.Current()
		if sent == nil || (number != nil && number.Cmp(sent) > 0) {
			resp := &curatorv1.WatchCRLResponse{Crl: pem}
			if number != nil {
				resp.Number = number.String()
			}
			if err := stream.Send(resp); err != nil {
				return err
			}
			sent = number
			if sent == nil {
				sent = big.NewInt(-1)
			}
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// issueInterval is the least time between two IssueCertificates of a node:
// each call writes the node's record.
const issueInterval = 10 * time.Second

func (x *curatorServer) IssueCertificates(ctx context.Context, req *curatorv1.IssueCertificatesRequest) (*curatorv1.IssueCertificatesResponse, error) {
	resp, err := x.s.issueCertificates(ctx, req)
	return resp, err
}

// issueCertificates issues the calling node fresh certificates (renewal, and
// its consensus process's), records them and, with them, the consensus key
// they certify. The certificates they renew stay valid until they expire.
func (s *Service) issueCertificates(ctx context.Context, req *curatorv1.IssueCertificatesRequest) (*curatorv1.IssueCertificatesResponse, error) {
	id := caller(ctx).Name
	return rpcerr.RetryConflicts(ctx, "issue certificates to node "+id, func() (*curatorv1.IssueCertificatesResponse, error) {
		n, err := s.getNode(ctx, id)
		if err != nil {
			return nil, err
		}
		if n.State != curatorv1.NodeState_NODE_STATE_UP {
			return nil, fmt.Errorf("%w: node %s is %s: certificates are for UP nodes", errRefused, id, n.State)
		}
		if k := req.GetConsensusPublicKey(); len(k) > 0 {
			if n.Status == nil {
				n.Status = &curatorv1.NodeStatus{}
			}
			n.Status.ConsensusPublicKey = k
		}
		if err := recentlyIssued(n); err != nil {
			return nil, err
		}
		resp := &curatorv1.IssueCertificatesResponse{CaCertificate: s.creds.CAPEM}
		iss, err := s.issueFor(n, pki.KindNode, ed25519.PublicKey(n.PublicKey))
		if err != nil {
			return nil, err
		}
		n.CertificateSerial, resp.NodeCertificate = iss.Cert.SerialNumber.Text(16), iss.CertPEM
		issued := []string{n.CertificateSerial}
		if key, err := consensusKey(n); err == nil {
			if iss, err = s.issueFor(n, pki.KindConsensus, key, hostOf(n.GetStatus().GetConsensusApi())); err != nil {
				return nil, err
			}
			resp.ConsensusCertificate = iss.CertPEM
			issued = append(issued, iss.Cert.SerialNumber.Text(16))
			if n.GetRoles().GetConsensusMember() != nil {
				if iss, err = s.issueMember(n); err != nil {
					return nil, err
				}
				resp.MemberCertificate = iss.CertPEM
				issued = append(issued, iss.Cert.SerialNumber.Text(16))
			}
		}
		// A conflict (the record changed): decide again.
		if _, err := s.lead.Txn(ctx, []clientv3.Cmp{unchanged(n)}, putNode(n), s.audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_CERTIFICATES, id, "certificates issued: "+strings.Join(issued, ", "))); err != nil {
			return nil, err
		}
		s.log.Info("certificates issued", "node", id, "serials", issued)
		return resp, nil
	})
}

// recentlyIssued refuses an IssueCertificates that would issue only
// principals the node got a certificate of in the last issueInterval (the
// node certificate of a commit just made does not stop the first consensus
// certificate).
func recentlyIssued(n *curatorv1.Node) error {
	want := []string{"node/" + n.Id}
	if _, err := consensusKey(n); err == nil {
		want = append(want, "consensus/"+n.Id)
		if n.GetRoles().GetConsensusMember() != nil {
			want = append(want, "member/"+n.Id)
		}
	}
	var last time.Duration
	for _, p := range want {
		recent := false
		for _, c := range n.GetCertificates() {
			if since := time.Since(c.GetIssued().AsTime()); c.GetPrincipal() == p && since < issueInterval {
				recent, last = true, since
			}
		}
		if !recent {
			return nil
		}
	}
	return fmt.Errorf("%w: node %s got these certificates %v ago; retry in %v", errExhausted, n.Id, last.Round(time.Second), (issueInterval - last).Round(time.Second))
}

func (x *curatorServer) GetMembership(ctx context.Context, _ *curatorv1.GetMembershipRequest) (*curatorv1.GetMembershipResponse, error) {
	members, err := x.s.consensus.listMembers(ctx)
	if err != nil {
		return nil, err
	}
	return &curatorv1.GetMembershipResponse{Members: members}, nil
}
