package registry

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
	"curia.dev/services/curator/internal/certs"
	"curia.dev/services/curator/internal/nodestore"
	"curia.dev/services/curator/internal/roles"
)

// Approve moves NEW to STANDBY; STANDBY and UP are left alone.
func (r *Registry) Approve(ctx context.Context, id string) (*curatorv1.Node, error) {
	n, err := r.Nodes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	switch n.State {
	case curatorv1.NodeState_NODE_STATE_STANDBY, curatorv1.NodeState_NODE_STATE_UP:
		return n, nil
	case curatorv1.NodeState_NODE_STATE_NEW:
	default:
		return nil, fmt.Errorf("%w: node %s is %s; only NEW nodes are approved", rpcerr.Refused, id, n.State)
	}
	n.State = curatorv1.NodeState_NODE_STATE_STANDBY
	if _, err := r.Lead.Txn(ctx, []clientv3.Cmp{nodestore.Unchanged(n)}, nodestore.Put(n), r.Audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_APPROVE, id, "approved")); err != nil {
		return nil, err
	}
	r.Log.Info("node approved", "node", id, "by", rpc.Caller(ctx).String())
	return r.Nodes.Get(ctx, id)
}

// Delete deletes a node, revokes every certificate issued to it that is
// still valid and tombstones its id, in one write. A node that is still an
// etcd member loses that membership to the reconciler afterwards.
func (r *Registry) Delete(ctx context.Context, req *curatorv1.DeleteNodeRequest) (*curatorv1.DeleteNodeResponse, error) {
	return rpcerr.RetryConflicts(ctx, "delete node "+req.GetNodeId(), func() (*curatorv1.DeleteNodeResponse, error) {
		n, err := r.Nodes.Get(ctx, req.GetNodeId())
		if err != nil {
			return nil, err
		}
		if roles.Of(n.GetRoles()).Any() && !req.GetSafetyBypassHasRoles() {
			return nil, fmt.Errorf("%w: node %s has roles (%s): take them away with UpdateNodeRoles first, or set safety_bypass_has_roles (the reconciler then removes its etcd member)", rpcerr.Refused, n.Id, roles.Names(n.GetRoles()))
		}
		if n.State == curatorv1.NodeState_NODE_STATE_UP && !req.GetSafetyBypassNotDecommissioned() {
			return nil, fmt.Errorf("%w: node %s is UP, not decommissioned: set safety_bypass_not_decommissioned to delete it anyway", rpcerr.Refused, n.Id)
		}
		serials := certs.Unrevoked(n)
		why := "deleted, id tombstoned; certificates revoked: " + strings.Join(serials, ", ")
		if len(serials) == 0 {
			why = "deleted, id tombstoned; it had no valid certificate to revoke"
		}
		_, tomb := certs.Tombstone(n.Id)
		ops := []clientv3.Op{clientv3.OpDelete(keys.Node(n.Id)), clientv3.OpDelete(keys.Heartbeat(n.Id)), clientv3.OpDelete(keys.HeartbeatSeen(n.Id)), tomb, r.Audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_DELETE, n.Id, why)}
		cmps := []clientv3.Cmp{nodestore.Unchanged(n)}
		if len(serials) > 0 {
			put, cmp, err := r.Certs.Revoke(ctx, serials...)
			if err != nil {
				return nil, err
			}
			ops, cmps = append(ops, put), append(cmps, cmp)
		}
		// A conflict (the node or the CRL changed): decide again.
		if _, err := r.Lead.Txn(ctx, cmps, ops...); err != nil {
			return nil, err
		}
		r.Log.Info("node deleted", "node", n.Id, "revoked", serials, "by", rpc.Caller(ctx).String())
		return &curatorv1.DeleteNodeResponse{RevokedSerial: n.CertificateSerial, RevokedSerials: serials}, nil
	})
}

// UpdateStatus writes a node's status, guarded by the record's revision
// (a role write may land in between: read again and retry).
func (r *Registry) UpdateStatus(ctx context.Context, req *curatorv1.UpdateNodeStatusRequest) error {
	_, err := rpcerr.RetryConflicts(ctx, "update the status of node "+req.GetNodeId(), func() (struct{}, error) {
		n, err := r.Nodes.Get(ctx, req.GetNodeId())
		if err != nil || proto.Equal(n.Status, req.GetStatus()) {
			return struct{}{}, err
		}
		n.Status = req.GetStatus()
		_, err = r.Lead.Txn(ctx, []clientv3.Cmp{nodestore.Unchanged(n)}, nodestore.Put(n))
		return struct{}{}, err
	})
	return err
}

// IssueCertificates issues the calling node fresh certificates (renewal, and
// its consensus process's), records them and, with them, the consensus key
// they certify. The certificates they renew stay valid until they expire.
func (r *Registry) IssueCertificates(ctx context.Context, req *curatorv1.IssueCertificatesRequest) (*curatorv1.IssueCertificatesResponse, error) {
	id := rpc.Caller(ctx).Name
	return rpcerr.RetryConflicts(ctx, "issue certificates to node "+id, func() (*curatorv1.IssueCertificatesResponse, error) {
		n, err := r.Nodes.Get(ctx, id)
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
		resp := &curatorv1.IssueCertificatesResponse{CaCertificate: r.CAPEM}
		iss, err := r.Certs.Issue(n, pki.KindNode, ed25519.PublicKey(n.PublicKey))
		if err != nil {
			return nil, err
		}
		n.CertificateSerial, resp.NodeCertificate = iss.Cert.SerialNumber.Text(16), iss.CertPEM
		issued := []string{n.CertificateSerial}
		if key, err := certs.ConsensusKey(n); err == nil {
			if iss, err = r.Certs.Issue(n, pki.KindConsensus, key, certs.HostOf(n.GetStatus().GetConsensusApi())); err != nil {
				return nil, err
			}
			resp.ConsensusCertificate = iss.CertPEM
			issued = append(issued, iss.Cert.SerialNumber.Text(16))
			if n.GetRoles().GetConsensusMember() != nil {
				if iss, err = r.Certs.IssueMember(n); err != nil {
					return nil, err
				}
				resp.MemberCertificate = iss.CertPEM
				issued = append(issued, iss.Cert.SerialNumber.Text(16))
			}
		}
		// A conflict (the record changed): decide again.
		if _, err := r.Lead.Txn(ctx, []clientv3.Cmp{nodestore.Unchanged(n)}, nodestore.Put(n), r.Audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_CERTIFICATES, id, "certificates issued: "+strings.Join(issued, ", "))); err != nil {
			return nil, err
		}
		r.Log.Info("certificates issued", "node", id, "serials", issued)
		return resp, nil
	})
}
