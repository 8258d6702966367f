package registry

import (
	"context"
	"crypto/ed25519"
	"crypto/subtle"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
	"curia.dev/services/curator/internal/certs"
	"curia.dev/services/curator/internal/nodestore"
)

// nodeKey is a request's public key (32 bytes: its contract) and the node
// id it makes.
func nodeKey(pub []byte) (ed25519.PublicKey, string) {
	return ed25519.PublicKey(pub), pki.NodeID(pub)
}

// Bootstrap records the first node of a fresh cluster: the node whose
// consensus service bootstrapped etcd and is its only member. It is UP and
// holds ConsensusMember (its join parameters from an idempotent AddNode)
// and KubernetesController.
func (r *Registry) Bootstrap(ctx context.Context, req *curatorv1.BootstrapClusterRequest) (*curatorv1.BootstrapClusterResponse, error) {
	pub, id := nodeKey(req.GetPublicKey()) // a node's own (policy: ownKey)
	deployed, err := r.Certs.Deployment(id, req.GetCertificates())
	if err != nil {
		return nil, err
	}
	if err := r.Certs.NotTombstoned(ctx, id); err != nil {
		return nil, err
	}
	peerURL := req.GetStatus().GetConsensusPeerUrl()
	existing, err := r.Etcd.Get(ctx, keys.NodesPrefix, clientv3.WithPrefix(), clientv3.WithLimit(2))
	if err != nil {
		return nil, fmt.Errorf("read nodes: %w", err)
	}
	for _, kv := range existing.Kvs {
		n, err := nodestore.Decode(kv.Value, kv.ModRevision)
		if err == nil && n.Id == id {
			return &curatorv1.BootstrapClusterResponse{Node: n, AlreadyBootstrapped: true}, nil
		}
	}
	if len(existing.Kvs) > 0 {
		return nil, fmt.Errorf("%w: the cluster is initialised already (it has nodes); new nodes register with the register ticket", rpcerr.Refused)
	}

	f, err := r.Lead.Fence()
	if err != nil {
		return nil, err
	}
	var members *consensusv1.ListMembersResponse
	var added *consensusv1.AddNodeResponse
	err = r.Consensus.Do(ctx, "bootstrap", func(c consensusv1.ConsensusClient) error {
		if members, err = c.ListMembers(ctx, &consensusv1.ListMembersRequest{}); err != nil {
			return err
		}
		isMember := false
		for _, m := range members.GetMembers() {
			isMember = isMember || m.GetNodeId() == id
		}
		if !isMember {
			return fmt.Errorf("%w: node %s is not an etcd member: start its consensus service with Start(bootstrap) first", rpcerr.Refused, id)
		}
		// Already a member: AddNode changes nothing and answers with the
		// join parameters the role carries.
		added, err = c.AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: id, PeerUrl: peerURL, Fence: f.WithEpoch(members.GetMembershipEpoch()).Proto()})
		return err
	})
	if err != nil {
		return nil, err
	}
	n := &curatorv1.Node{
		Id:        id,
		PublicKey: pub,
		State:     curatorv1.NodeState_NODE_STATE_UP,
		Roles: &curatorv1.Roles{
			ConsensusMember:      &curatorv1.ConsensusMember{Join: added.GetJoin()},
			KubernetesController: &curatorv1.KubernetesController{},
		},
		Status: req.GetStatus(),
		Labels: req.GetLabels(),
	}
	for i, c := range deployed {
		certs.RecordIssued(n, c, r.Cluster)
		switch p, _ := pki.PrincipalFromCert(c, r.Cluster); p.Kind {
		case pki.KindNode:
			n.CertificateSerial = c.SerialNumber.Text(16)
		case pki.KindMember:
			// The member the deployment made: the role carries its
			// certificate, as a role given later would.
			n.Roles.ConsensusMember.MemberCertificate = req.GetCertificates()[i]
		}
	}
	noTomb, _ := certs.Tombstone(id)
	_, err = r.Lead.Txn(ctx,
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(keys.Node(id)), "=", 0), noTomb},
		nodestore.Put(n), r.Audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_CLUSTER_BOOTSTRAP, id, "first node of the cluster"))
	if errors.Is(err, rpcerr.Conflict) {
		return r.Bootstrap(ctx, req) // created meanwhile: answer as for an existing node
	}
	if err != nil {
		return nil, err
	}
	n, err = r.Nodes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	r.Log.Info("cluster bootstrapped", "node", id)
	return &curatorv1.BootstrapClusterResponse{Node: n}, nil
}

// Register records a node that asks to join with the register ticket: NEW,
// no roles, until an admin approves it. A node that registers again (its
// agent restarted) is answered with its record as it is; a tombstoned id
// is refused.
func (r *Registry) Register(ctx context.Context, req *curatorv1.RegisterNodeRequest) (*curatorv1.RegisterNodeResponse, error) {
	pub, id := nodeKey(req.GetPublicKey()) // the caller's own (policy: ownKey)
	t, err := r.Etcd.Get(ctx, keys.RegisterTicket)
	if err != nil {
		return nil, fmt.Errorf("read register ticket: %w", err)
	}
	if len(t.Kvs) == 0 {
		return nil, fmt.Errorf("%w: the cluster has no register ticket yet; retry shortly", rpcerr.Unavailable)
	}
	if subtle.ConstantTimeCompare(t.Kvs[0].Value, req.GetRegisterTicket()) != 1 {
		return nil, fmt.Errorf("%w: wrong register ticket (an admin gets the right one with Management/GetRegisterTicket)", rpcerr.Denied)
	}
	// Until the first node exists, BootstrapCluster must be able to find
	// an empty registry: a node that registers now would make it refuse.
	if any, err := r.Etcd.Get(ctx, keys.NodesPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		return nil, fmt.Errorf("read nodes: %w", err)
	} else if any.Count == 0 {
		return nil, rpcerr.RetryAfter(fmt.Errorf("%w: the cluster is not bootstrapped yet; retry shortly", rpcerr.Unavailable), notBootstrappedRetry)
	}
	if n, err := r.Nodes.Get(ctx, id); err == nil {
		// A node that registers again (a restarted agent) learns its state.
		return &curatorv1.RegisterNodeResponse{Node: n}, nil
	}
	if err := r.Certs.NotTombstoned(ctx, id); err != nil {
		return nil, err
	}
	n := &curatorv1.Node{Id: id, PublicKey: pub, State: curatorv1.NodeState_NODE_STATE_NEW, Labels: req.GetLabels()}
	noTomb, _ := certs.Tombstone(id)
	_, err = r.Lead.Txn(ctx,
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(keys.Node(id)), "=", 0), noTomb},
		nodestore.Put(n))
	if err != nil && !errors.Is(err, rpcerr.Conflict) {
		return nil, err
	}
	if n, err = r.Nodes.Get(ctx, id); err != nil {
		return nil, err // deleted meanwhile
	}
	r.Log.Info("node registered", "node", id)
	return &curatorv1.RegisterNodeResponse{Node: n}, nil
}

// Commit moves an approved node UP and issues its certificate. Committing
// an UP node again issues a new certificate for the same key, so an agent
// that lost the answer can finish; the certificate it replaces is revoked
// in the same write, so a node holds one valid certificate at a time.
func (r *Registry) Commit(ctx context.Context) (*curatorv1.CommitNodeResponse, error) {
	// A conflict (the node or the CRL changed): decide again.
	return rpcerr.RetryConflicts(ctx, "commit node "+rpc.Caller(ctx).Name, func() (*curatorv1.CommitNodeResponse, error) { return r.commitOnce(ctx) })
}

// commitOnce is one attempt of Commit.
func (r *Registry) commitOnce(ctx context.Context) (*curatorv1.CommitNodeResponse, error) {
	id := rpc.Caller(ctx).Name
	n, err := r.Nodes.Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%w (register first)", err)
	}
	switch n.State {
	case curatorv1.NodeState_NODE_STATE_NEW:
		return nil, fmt.Errorf("%w: node %s is not approved yet: an admin approves it with Management/ApproveNode", rpcerr.Refused, id)
	case curatorv1.NodeState_NODE_STATE_STANDBY, curatorv1.NodeState_NODE_STATE_UP:
	default:
		return nil, fmt.Errorf("%w: node %s is %s and cannot commit", rpcerr.Refused, id, n.State)
	}
	replaced := n.CertificateSerial
	iss, err := r.Certs.Issue(n, pki.KindNode, ed25519.PublicKey(n.PublicKey))
	if err != nil {
		return nil, err
	}
	n.State = curatorv1.NodeState_NODE_STATE_UP
	n.CertificateSerial = iss.Cert.SerialNumber.Text(16)
	why := "node committed, certificate " + n.CertificateSerial
	cmps := []clientv3.Cmp{nodestore.Unchanged(n)}
	var ops []clientv3.Op
	if replaced != "" {
		put, cmp, err := r.Certs.Revoke(ctx, replaced)
		if err != nil {
			return nil, err
		}
		certs.MarkRevoked(n, []string{replaced})
		ops, cmps = append(ops, put), append(cmps, cmp)
		why += "; certificate " + replaced + " it replaces revoked"
	}
	ops = append(ops, nodestore.Put(n))
	if _, err := r.Lead.Txn(ctx, cmps, append(ops, r.Audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_COMMIT, id, why))...); err != nil {
		return nil, err
	}
	if n, err = r.Nodes.Get(ctx, id); err != nil {
		return nil, err
	}
	r.Log.Info("node committed", "node", id, "serial", n.CertificateSerial)
	return &curatorv1.CommitNodeResponse{Node: n, Certificate: iss.CertPEM, CaCertificate: r.CAPEM}, nil
}
