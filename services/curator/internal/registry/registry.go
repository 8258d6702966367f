// Package registry is the curator's node registry (DESIGN §3): a node
// registers, an admin approves it, it commits and gets its certificate;
// roles are given and taken (etcd membership first, DESIGN §5), by an
// operator (UpdateRoles) or by the reconciler's fenced writes
// (ReconcileNodeRoles); a node reports its status and renews its
// certificates; a node is deleted and its id tombstoned.
//
// Every write is one etcd transaction under the curator leader's term
// (Leadership.Txn), conditional on the node's record as read
// (nodestore.Unchanged) and carrying its audit event; a conflict reads
// again and decides again, a bounded number of times.
//
// A Registry gets the etcd client, the node store, the leadership, the
// consensus services (membership changes), the certificate issuer and the
// audit log, plus the cluster's name, this replica's and the CA
// certificate; nothing else of the curator. Who may call what is the
// curator's policy, checked before a method runs.
//
// Files: registry.go (the Registry, what it gets), enrolment.go
// (BootstrapCluster, RegisterNode, CommitNode), nodes.go (approve, delete,
// status, certificates), roles.go (UpdateNodeRoles: the etcd step, then
// the role write), reconcile.go (the reconciler's fenced role writes).
package registry

import (
	"context"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/fence"
	"curia.dev/platform/rpcerr"
	"curia.dev/services/curator/internal/auditlog"
	"curia.dev/services/curator/internal/certs"
	"curia.dev/services/curator/internal/nodestore"
)

// Leadership is this replica's curator leadership.
type Leadership interface {
	// Ours is the leader key and term this replica holds; ok is false
	// when it does not lead.
	Ours() (key string, term int64, ok bool)
	// Fence is the fence of this replica's term, for calls to consensus.
	Fence() (fence.Fence, error)
	// Txn runs ops in a transaction guarded by this replica's term, plus
	// cmps: a lost term is rpcerr.NotLeader, failed cmps rpcerr.Conflict.
	Txn(ctx context.Context, cmps []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, error)
	// Lost says that the term ended (a write found the leader key gone).
	Lost()
}

// Consensus reaches the consensus services.
type Consensus interface {
	// Do calls f on consensus services until one answers with anything
	// but Unavailable (membership calls are idempotent per node).
	Do(ctx context.Context, what string, f func(consensusv1.ConsensusClient) error) error
	// ListMembers reads a fresh member list, with its epoch and pending
	// change.
	ListMembers(ctx context.Context) (*consensusv1.ListMembersResponse, error)
}

// Registry serves the node registry's calls on the curator leader.
type Registry struct {
	// Cluster is the trust domain; Name this replica's name (the audit
	// log's recorded_by); CAPEM the CA certificate answers carry.
	Cluster, Name string
	CAPEM         []byte

	Etcd      *clientv3.Client
	Nodes     nodestore.Store
	Lead      Leadership
	Consensus Consensus
	Certs     *certs.Issuer
	Audit     *auditlog.Log
	Log       *slog.Logger
}

// notBootstrappedRetry is the RetryInfo of a registration before the first
// node exists: the bootstrap is seconds away.
const notBootstrappedRetry = 250 * time.Millisecond

// errStale: what the caller read (a node's revision) changed since; read
// again and decide again. (A stale fence is rpcerr.FenceStale, a
// membership change in flight rpcerr.ChangePending.)
var errStale = rpcerr.Conflict.Sub("stale")
