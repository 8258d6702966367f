// Package certs is the certificates the curator leader issues to nodes and
// revokes (DESIGN §2): every certificate issued to a node is recorded on
// its record (Node.certificates) until it expires, the bootstrap node's
// from the deployment included; a re-commit revokes the certificate it
// replaces; DeleteNode revokes every recorded one still valid and
// tombstones the id, which never registers again. The revocation list
// lives in etcd (keys.CRL); every replica follows it and serves it
// (WatchCRL) to the servers that have no etcd access.
//
// An Issuer gets the cluster CA (its key included), the trust bundle, the
// etcd client, the leadership's guarded write and the replica's CRL
// watcher. The functions on a node record alone (RecordIssued, Unrevoked,
// ...) write nothing: the caller puts the record in its own transaction.
package certs

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/crl"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpcerr"
)

// Leadership is this replica's leadership.
type Leadership interface {
	// Txn runs ops in a transaction guarded by this replica's term, plus
	// cmps: a lost term is rpcerr.NotLeader, failed cmps rpcerr.Conflict.
	Txn(ctx context.Context, cmps []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, error)
}

// Issuer issues and revokes the certificates of nodes.
type Issuer struct {
	// Cluster is the trust domain; Validity how long a certificate issued
	// to a node lives.
	Cluster  string
	Validity time.Duration
	// CA issues the certificates and signs the CRL; Trusted is the whole
	// bundle (two CAs during a rotation), Pool the same as a pool.
	CA      *pki.CA
	Trusted []*x509.Certificate
	Pool    *x509.CertPool
	Etcd    *clientv3.Client
	Lead    Leadership
	// CRL is this replica's view of the list in etcd.
	CRL *crl.Watcher
	Log *slog.Logger
}

// crlValidity is how long a CRL stays valid; it is re-signed on every
// revocation.
const crlValidity = 365 * 24 * time.Hour

// RecordIssued adds cert to n's certificates, and drops the entries of
// certificates that have expired: nothing can use them any more.
func RecordIssued(n *curatorv1.Node, cert *x509.Certificate, cluster string) {
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

// Issue issues n a certificate of principal kind k for pub, with SANs
// for hosts (a loopback address brings 127.0.0.1 along: the source address
// of every connection over loopback), and records it on n.
func (is *Issuer) Issue(n *curatorv1.Node, k pki.Kind, pub crypto.PublicKey, hosts ...string) (*pki.Issued, error) {
	req := pki.IssueRequest{Cluster: is.Cluster, Principal: pki.Principal{Kind: k, Name: n.Id}, PublicKey: pub, Validity: is.Validity}
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
	iss, err := is.CA.Issue(req)
	if err != nil {
		return nil, fmt.Errorf("issue %s: %w", req.Principal, err)
	}
	RecordIssued(n, iss.Cert, is.Cluster)
	return iss, nil
}

// ConsensusKey is the key of n's consensus process, or an error saying the
// node has not reported one.
func ConsensusKey(n *curatorv1.Node) (ed25519.PublicKey, error) {
	k := n.GetStatus().GetConsensusPublicKey()
	if len(k) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: node %s has not reported its consensus key (status.consensus_public_key): its agent does once its consensus process runs", rpcerr.Refused, n.Id)
	}
	return ed25519.PublicKey(k), nil
}

// HostOf is the host of a URL (or host:port), "" if it has none.
func HostOf(s string) string {
	if u, err := url.Parse(s); err == nil && u.Host != "" {
		return u.Hostname()
	}
	if h, _, err := net.SplitHostPort(s); err == nil {
		return h
	}
	return ""
}

// IssueMember issues n's member certificate, for its consensus key, naming
// the hosts of its consensus peer and client URLs (peers bind it to the
// address they see it connect from).
func (is *Issuer) IssueMember(n *curatorv1.Node) (*pki.Issued, error) {
	key, err := ConsensusKey(n)
	if err != nil {
		return nil, err
	}
	st := n.GetStatus()
	return is.Issue(n, pki.KindMember, key, HostOf(st.GetConsensusPeerUrl()), HostOf(st.GetConsensusClientUrl()))
}

// WithMemberCertificate completes a role write on n (whose roles become
// roles): a ConsensusMember that is new gets its member certificate, and
// when the role goes, or names another member than before, every member
// certificate of n that the new roles do not carry is revoked. A role
// written for a member whose record had lost it (the reconciler completing
// "membership ahead of roles") revokes nothing: the running member may use
// any of them. It returns the CRL write and its guard, if any.
func (is *Issuer) WithMemberCertificate(ctx context.Context, n *curatorv1.Node, roles *curatorv1.Roles) ([]clientv3.Op, []clientv3.Cmp, error) {
	cm := roles.GetConsensusMember()
	old := n.GetRoles().GetConsensusMember()
	revoking := cm == nil || (old != nil && old.GetJoin().GetMemberId() != cm.GetJoin().GetMemberId())
	if cm != nil && len(cm.GetMemberCertificate()) == 0 {
		iss, err := is.IssueMember(n)
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
	put, cmp, err := is.Revoke(ctx, stale...)
	if err != nil {
		return nil, nil, err
	}
	MarkRevoked(n, stale)
	return []clientv3.Op{put}, []clientv3.Cmp{cmp}, nil
}

// Unrevoked are the serials of n's recorded certificates that are neither
// revoked nor expired, and of its current node certificate (a record made
// before certificates were recorded has only that).
func Unrevoked(n *curatorv1.Node) []string {
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

// MarkRevoked marks the recorded certificates with these serials revoked.
func MarkRevoked(n *curatorv1.Node, serials []string) {
	for _, c := range n.GetCertificates() {
		if slices.Contains(serials, c.GetSerial()) {
			c.Revoked = true
		}
	}
}

// Deployment parses the certificates a bootstrap request brings
// and checks each: of the cluster CA, valid now, and for node id.
func (is *Issuer) Deployment(id string, pems [][]byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for i, b := range pems {
		cert, err := pki.ParseCertPEM(b)
		if err != nil {
			return nil, fmt.Errorf("%w: certificates[%d]: %v", rpcerr.Invalid, i, err)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: is.Pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			return nil, fmt.Errorf("%w: certificates[%d] (serial %x) is not a valid certificate of this cluster's CA: %v", rpcerr.Invalid, i, cert.SerialNumber, err)
		}
		p, err := pki.PrincipalFromCert(cert, is.Cluster)
		if err != nil || p.Name != id {
			return nil, fmt.Errorf("%w: certificates[%d] is for %v, not for node %s (%v)", rpcerr.Invalid, i, p, id, err)
		}
		out = append(out, cert)
	}
	return out, nil
}

// Revoke returns the write of a new CRL that also revokes serials (hex), and
// the comparison that the CRL did not change since it was read. A serial
// already on the list is not listed twice.
//
// The list this replica holds (its watcher's: the newest it saw) may be
// newer than the one stored: etcd restored from a snapshot, or recovered
// from an older state, steps back, while every process keeps the newest list
// it saw and refuses an older one. So the new list is numbered past both,
// and keeps both lists' revocations (DESIGN §5: CRL numbers never go
// backwards, and no revocation is lost).
func (is *Issuer) Revoke(ctx context.Context, serials ...string) (clientv3.Op, clientv3.Cmp, error) {
	resp, err := is.Etcd.Get(ctx, keys.CRL)
	if err != nil {
		return clientv3.Op{}, clientv3.Cmp{}, fmt.Errorf("read CRL: %w", err)
	}
	var entries []x509.RevocationListEntry
	number := big.NewInt(0)
	var rev int64
	if len(resp.Kvs) > 0 {
		rev = resp.Kvs[0].ModRevision
		crl, _, err := pki.VerifyCRLOf(resp.Kvs[0].Value, is.Trusted)
		if err != nil {
			return clientv3.Op{}, clientv3.Cmp{}, fmt.Errorf("stored CRL: %w", err)
		}
		entries = crl.RevokedCertificateEntries
		number.Set(crl.Number)
	}
	if held, err := is.held(); err != nil {
		return clientv3.Op{}, clientv3.Cmp{}, err
	} else if held != nil && held.Number.Cmp(number) > 0 {
		is.Log.Warn("the CRL in etcd is older than the one this curator holds (etcd restored or recovered from an older state): the new list is numbered past the held one and keeps its revocations",
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
	pem, err := is.CA.CRL(entries, number, crlValidity)
	if err != nil {
		return clientv3.Op{}, clientv3.Cmp{}, fmt.Errorf("sign CRL: %w", err)
	}
	return clientv3.OpPut(keys.CRL, string(pem)), clientv3.Compare(clientv3.ModRevision(keys.CRL), "=", rev), nil
}

// held is the list this replica's watcher holds (verified when it was
// loaded), nil before any.
func (is *Issuer) held() (*x509.RevocationList, error) {
	_, der, _, _ := is.CRL.Current()
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

// ResignCRL signs the CRL again with this curator's CA when another CA of
// the bundle signed the one in etcd (or there is none): after a CA rotation
// switched the curators to the new CA, the list carries the old CA's
// revocations over, and its new issuer tells the agents to renew their
// certificates (roleserve: certificates.go). The write is the leader's.
func (is *Issuer) ResignCRL(ctx context.Context) error {
	resp, err := is.Etcd.Get(ctx, keys.CRL)
	if err != nil {
		return fmt.Errorf("read CRL: %w", err)
	}
	if len(resp.Kvs) > 0 {
		if _, issuer, err := pki.VerifyCRLOf(resp.Kvs[0].Value, is.Trusted); err == nil && issuer.Equal(is.CA.Cert) {
			return nil
		}
	}
	put, cmp, err := is.Revoke(ctx)
	if err != nil {
		return err
	}
	if _, err := is.Lead.Txn(ctx, []clientv3.Cmp{cmp}, put); err != nil && !errors.Is(err, rpcerr.Conflict) {
		return err
	}
	is.Log.Info("CRL signed by this curator's CA", "ca", is.CA.Cert.Subject.String())
	return nil
}

// NotTombstoned refuses a node id that was deleted.
func (is *Issuer) NotTombstoned(ctx context.Context, id string) error {
	resp, err := is.Etcd.Get(ctx, keys.Tombstone(id))
	if err != nil {
		return fmt.Errorf("read tombstone of %s: %w", id, err)
	}
	if len(resp.Kvs) > 0 && !failpoint.Mutated(failpoint.NoTombstones) {
		return fmt.Errorf("%w: node %s was deleted (%s) and node ids are never reused: give the node a new identity (wipe its agent's data directory, or a new --node-key)", rpcerr.Denied, id, resp.Kvs[0].Value)
	}
	return nil
}

// Tombstone is the comparison that id has no tombstone yet and the write
// that gives it one, for the deleting transaction.
func Tombstone(id string) (clientv3.Cmp, clientv3.Op) {
	return clientv3.Compare(clientv3.CreateRevision(keys.Tombstone(id)), "=", 0),
		clientv3.OpPut(keys.Tombstone(id), time.Now().UTC().Format(time.RFC3339))
}

// WatchCRL is Curator/WatchCRL: this replica's view of the CRL in etcd,
// the current list, then every newer one.
func (is *Issuer) WatchCRL(stream curatorv1.Curator_WatchCRLServer) error {
	var sent *big.Int
	for {
		pem, _, number, changed := is.CRL.Current()
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

// RecentlyIssued refuses an IssueCertificates that would issue only
// principals the node got a certificate of in the last issueInterval (the
// node certificate of a commit just made does not stop the first consensus
// certificate).
func RecentlyIssued(n *curatorv1.Node) error {
	want := []string{"node/" + n.Id}
	if _, err := ConsensusKey(n); err == nil {
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
	return fmt.Errorf("%w: node %s got these certificates %v ago; retry in %v", rpcerr.Exhausted, n.Id, last.Round(time.Second), (issueInterval - last).Round(time.Second))
}
