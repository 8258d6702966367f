package curator

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpcerr"
	"curia.dev/services/curator/internal/certs"
	"curia.dev/services/curator/internal/nodestore"
)

// The certificate RPCs of the Curator service; internal/certs issues and
// revokes.

// WatchCRL streams this replica's view of the CRL in etcd: the current list,
// then every newer one.
func (x *curatorServer) WatchCRL(_ *curatorv1.WatchCRLRequest, stream curatorv1.Curator_WatchCRLServer) error {
	return x.s.certs.WatchCRL(stream)
}

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
		n, err := s.nodes.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if n.State != curatorv1.NodeState_NODE_STATE_UP {
			return nil, fmt.Errorf("%w: node %s is %s: certificates are for UP nodes", rpcerr.Refused, id, n.State)
		}
		if k := req.GetConsensusPublicKey(); len(k) > 0 {
			if n.Status == nil {
				n.Status = &curatorv1.NodeStatus{}
			}
			n.Status.ConsensusPublicKey = k
		}
		if err := certs.RecentlyIssued(n); err != nil {
			return nil, err
		}
		resp := &curatorv1.IssueCertificatesResponse{CaCertificate: s.creds.CAPEM}
		iss, err := s.certs.Issue(n, pki.KindNode, ed25519.PublicKey(n.PublicKey))
		if err != nil {
			return nil, err
		}
		n.CertificateSerial, resp.NodeCertificate = iss.Cert.SerialNumber.Text(16), iss.CertPEM
		issued := []string{n.CertificateSerial}
		if key, err := certs.ConsensusKey(n); err == nil {
			if iss, err = s.certs.Issue(n, pki.KindConsensus, key, certs.HostOf(n.GetStatus().GetConsensusApi())); err != nil {
				return nil, err
			}
			resp.ConsensusCertificate = iss.CertPEM
			issued = append(issued, iss.Cert.SerialNumber.Text(16))
			if n.GetRoles().GetConsensusMember() != nil {
				if iss, err = s.certs.IssueMember(n); err != nil {
					return nil, err
				}
				resp.MemberCertificate = iss.CertPEM
				issued = append(issued, iss.Cert.SerialNumber.Text(16))
			}
		}
		// A conflict (the record changed): decide again.
		if _, err := s.lead.Txn(ctx, []clientv3.Cmp{nodestore.Unchanged(n)}, nodestore.Put(n), s.audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_CERTIFICATES, id, "certificates issued: "+strings.Join(issued, ", "))); err != nil {
			return nil, err
		}
		s.log.Info("certificates issued", "node", id, "serials", issued)
		return resp, nil
	})
}

func (x *curatorServer) GetMembership(ctx context.Context, _ *curatorv1.GetMembershipRequest) (*curatorv1.GetMembershipResponse, error) {
	members, err := x.s.consensus.listMembers(ctx)
	if err != nil {
		return nil, err
	}
	return &curatorv1.GetMembershipResponse{Members: members}, nil
}
