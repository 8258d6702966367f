package curator

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

// curatorServer implements curia.curator.v1.Curator.
type curatorServer struct {
	curatorv1.UnimplementedCuratorServer
	s *Service
}

// caller is the principal the interceptor verified.
func caller(ctx context.Context) pki.Principal {
	p, _ := rpc.PrincipalFromContext(ctx)
	return p
}

// nodeKey is a request's public key (32 bytes: its contract) and the node
// id it makes.
func nodeKey(pub []byte) (ed25519.PublicKey, string) {
	return ed25519.PublicKey(pub), pki.NodeID(pub)
}

func (x *curatorServer) BootstrapCluster(ctx context.Context, req *curatorv1.BootstrapClusterRequest) (*curatorv1.BootstrapClusterResponse, error) {
	resp, err := x.s.bootstrap(ctx, req)
	return resp, err
}

// bootstrap records the first node of a fresh cluster: the node whose
// consensus service bootstrapped etcd and is its only member. It is UP and
// holds ConsensusMember (its join parameters from an idempotent AddNode)
// and KubernetesController.
func (s *Service) bootstrap(ctx context.Context, req *curatorv1.BootstrapClusterRequest) (*curatorv1.BootstrapClusterResponse, error) {
	pub, id := nodeKey(req.GetPublicKey()) // a node's own (policy: ownKey)
	deployed, err := s.certs.Deployment(id, req.GetCertificates())
	if err != nil {
		return nil, err
	}
	if err := s.certs.NotTombstoned(ctx, id); err != nil {
		return nil, err
	}
	peerURL := req.GetStatus().GetConsensusPeerUrl()
	existing, err := s.etcd.Get(ctx, keys.NodesPrefix, clientv3.WithPrefix(), clientv3.WithLimit(2))
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
		return nil, fmt.Errorf("%w: the cluster is initialised already (it has nodes); new nodes register with the register ticket", errRefused)
	}

	f, err := s.lead.Fence()
	if err != nil {
		return nil, err
	}
	var members *consensusv1.ListMembersResponse
	var added *consensusv1.AddNodeResponse
	err = s.consensus.do(ctx, "bootstrap", func(c consensusv1.ConsensusClient) error {
		if members, err = c.ListMembers(ctx, &consensusv1.ListMembersRequest{}); err != nil {
			return err
		}
		isMember := false
		for _, m := range members.GetMembers() {
			isMember = isMember || m.GetNodeId() == id
		}
		if !isMember {
			return fmt.Errorf("%w: node %s is not an etcd member: start its consensus service with Start(bootstrap) first", errRefused, id)
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
		certs.RecordIssued(n, c, s.cfg.Cluster)
		switch p, _ := pki.PrincipalFromCert(c, s.cfg.Cluster); p.Kind {
		case pki.KindNode:
			n.CertificateSerial = c.SerialNumber.Text(16)
		case pki.KindMember:
			// The member the deployment made: the role carries its
			// certificate, as a role given later would.
			n.Roles.ConsensusMember.MemberCertificate = req.GetCertificates()[i]
		}
	}
	noTomb, _ := certs.Tombstone(id)
	_, err = s.lead.Txn(ctx,
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(keys.Node(id)), "=", 0), noTomb},
		nodestore.Put(n), s.audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_CLUSTER_BOOTSTRAP, id, "first node of the cluster"))
	if errors.Is(err, errConflict) {
		return s.bootstrap(ctx, req) // created meanwhile: answer as for an existing node
	}
	if err != nil {
		return nil, err
	}
	n, err = s.nodes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	s.log.Info("cluster bootstrapped", "node", id)
	return &curatorv1.BootstrapClusterResponse{Node: n}, nil
}

func (x *curatorServer) RegisterNode(ctx context.Context, req *curatorv1.RegisterNodeRequest) (*curatorv1.RegisterNodeResponse, error) {
	resp, err := x.s.register(ctx, req)
	return resp, err
}

func (s *Service) register(ctx context.Context, req *curatorv1.RegisterNodeRequest) (*curatorv1.RegisterNodeResponse, error) {
	pub, id := nodeKey(req.GetPublicKey()) // the caller's own (policy: ownKey)
	t, err := s.etcd.Get(ctx, keys.RegisterTicket)
	if err != nil {
		return nil, fmt.Errorf("read register ticket: %w", err)
	}
	if len(t.Kvs) == 0 {
		return nil, fmt.Errorf("%w: the cluster has no register ticket yet; retry shortly", errUnavailable)
	}
	if subtle.ConstantTimeCompare(t.Kvs[0].Value, req.GetRegisterTicket()) != 1 {
		return nil, fmt.Errorf("%w: wrong register ticket (an admin gets the right one with Management/GetRegisterTicket)", errDenied)
	}
	// Until the first node exists, BootstrapCluster must be able to find
	// an empty registry: a node that registers now would make it refuse.
	if any, err := s.etcd.Get(ctx, keys.NodesPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		return nil, fmt.Errorf("read nodes: %w", err)
	} else if any.Count == 0 {
		return nil, rpcerr.RetryAfter(fmt.Errorf("%w: the cluster is not bootstrapped yet; retry shortly", errUnavailable), shortRetry)
	}
	if n, err := s.nodes.Get(ctx, id); err == nil {
		// A node that registers again (a restarted agent) learns its state.
		return &curatorv1.RegisterNodeResponse{Node: n}, nil
	}
	if err := s.certs.NotTombstoned(ctx, id); err != nil {
		return nil, err
	}
	n := &curatorv1.Node{Id: id, PublicKey: pub, State: curatorv1.NodeState_NODE_STATE_NEW, Labels: req.GetLabels()}
	noTomb, _ := certs.Tombstone(id)
	_, err = s.lead.Txn(ctx,
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(keys.Node(id)), "=", 0), noTomb},
		nodestore.Put(n))
	if err != nil && !errors.Is(err, errConflict) {
		return nil, err
	}
	if n, err = s.nodes.Get(ctx, id); err != nil {
		return nil, err // deleted meanwhile
	}
	s.log.Info("node registered", "node", id)
	return &curatorv1.RegisterNodeResponse{Node: n}, nil
}

func (x *curatorServer) CommitNode(ctx context.Context, req *curatorv1.CommitNodeRequest) (*curatorv1.CommitNodeResponse, error) {
	resp, err := x.s.commit(ctx)
	return resp, err
}

// commit moves an approved node UP and issues its certificate. Committing
// an UP node again issues a new certificate for the same key, so an agent
// that lost the answer can finish; the certificate it replaces is revoked
// in the same write, so a node holds one valid certificate at a time.
func (s *Service) commit(ctx context.Context) (*curatorv1.CommitNodeResponse, error) {
	// A conflict (the node or the CRL changed): decide again.
	return rpcerr.RetryConflicts(ctx, "commit node "+caller(ctx).Name, func() (*curatorv1.CommitNodeResponse, error) { return s.commitOnce(ctx) })
}

func (s *Service) commitOnce(ctx context.Context) (*curatorv1.CommitNodeResponse, error) {
	id := caller(ctx).Name
	n, err := s.nodes.Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%w (register first)", err)
	}
	switch n.State {
	case curatorv1.NodeState_NODE_STATE_NEW:
		return nil, fmt.Errorf("%w: node %s is not approved yet: an admin approves it with Management/ApproveNode", errRefused, id)
	case curatorv1.NodeState_NODE_STATE_STANDBY, curatorv1.NodeState_NODE_STATE_UP:
	default:
		return nil, fmt.Errorf("%w: node %s is %s and cannot commit", errRefused, id, n.State)
	}
	replaced := n.CertificateSerial
	iss, err := s.certs.Issue(n, pki.KindNode, ed25519.PublicKey(n.PublicKey))
	if err != nil {
		return nil, err
	}
	n.State = curatorv1.NodeState_NODE_STATE_UP
	n.CertificateSerial = iss.Cert.SerialNumber.Text(16)
	why := "node committed, certificate " + n.CertificateSerial
	cmps := []clientv3.Cmp{nodestore.Unchanged(n)}
	var ops []clientv3.Op
	if replaced != "" {
		put, cmp, err := s.certs.Revoke(ctx, replaced)
		if err != nil {
			return nil, err
		}
		certs.MarkRevoked(n, []string{replaced})
		ops, cmps = append(ops, put), append(cmps, cmp)
		why += "; certificate " + replaced + " it replaces revoked"
	}
	ops = append(ops, nodestore.Put(n))
	if _, err := s.lead.Txn(ctx, cmps, append(ops, s.audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_COMMIT, id, why))...); err != nil {
		return nil, err
	}
	if n, err = s.nodes.Get(ctx, id); err != nil {
		return nil, err
	}
	s.log.Info("node committed", "node", id, "serial", n.CertificateSerial)
	return &curatorv1.CommitNodeResponse{Node: n, Certificate: iss.CertPEM, CaCertificate: s.creds.CAPEM}, nil
}
