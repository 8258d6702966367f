package curator

import (
	"context"
	"crypto/x509"
	"fmt"
	"math/big"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
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
	})
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
func (s *Service) revoke(ctx context.Context, serials ...string) (clientv3.Op, clientv3.Cmp, error) {
	resp, err := s.etcd.Get(ctx, keys.CRL)
	if err != nil {
		return clientv3.Op{}, clientv3.Cmp{}, fmt.Errorf("read CRL: %w", err)
	}
	var entries []x509.RevocationListEntry
	number := big.NewInt(1)
	var rev int64
	if len(resp.Kvs) > 0 {
		rev = resp.Kvs[0].ModRevision
		crl, err := pki.VerifyCRL(resp.Kvs[0].Value, s.ca.Cert)
		if err != nil {
			return clientv3.Op{}, clientv3.Cmp{}, fmt.Errorf("stored CRL: %w", err)
		}
		entries = crl.RevokedCertificateEntries
		number.Add(crl.Number, big.NewInt(1))
	}
	for _, serial := range serials {
		sn, ok := new(big.Int).SetString(serial, 16)
		if !ok {
			return clientv3.Op{}, clientv3.Cmp{}, fmt.Errorf("certificate serial %q is not hex", serial)
		}
		if !slices.ContainsFunc(entries, func(e x509.RevocationListEntry) bool { return e.SerialNumber.Cmp(sn) == 0 }) {
			entries = append(entries, x509.RevocationListEntry{SerialNumber: sn, RevocationTime: time.Now()})
		}
	}
	pem, err := s.ca.CRL(entries, number, crlValidity)
	if err != nil {
		return clientv3.Op{}, clientv3.Cmp{}, fmt.Errorf("sign CRL: %w", err)
	}
	return clientv3.OpPut(keys.CRL, string(pem)), clientv3.Compare(clientv3.ModRevision(keys.CRL), "=", rev), nil
}

// notTombstoned refuses a node id that was deleted.
func (s *Service) notTombstoned(ctx context.Context, id string) error {
	resp, err := s.etcd.Get(ctx, keys.Tombstone(id))
	if err != nil {
		return fmt.Errorf("read tombstone of %s: %w", id, err)
	}
	if len(resp.Kvs) > 0 {
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
