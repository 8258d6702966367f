// Package keys is the layout of curia's data in etcd. Every key curia reads or
// writes is built here, with a comment saying what it holds and who writes it.
// Values are protobuf unless a comment says otherwise. Node records, the
// pending membership change and the cluster configuration are private
// curia.storage.v1 records, not the API messages they are served as, read
// and written through platform/records.
//
//	/curia/
//	├── leader/<lease id>          curator election (concurrency.Election)
//	├── leases/<name>              named leases (JSON), e.g. leases/reconciler
//	├── membership/epoch           bumped twice by every membership change (start, finish)
//	├── membership/pending         the one membership change in flight, cluster-wide
//	├── membership/joining/<url>   node id a learner was added for, by peer URL
//	├── audit/<time>-<recorder>    audit log of membership and role changes
//	├── nodes/<node id>            the node registry
//	├── heartbeat-shards/<n>       the last heartbeat and health of up to 1,000 nodes
//	├── heartbeats/<node id>       (older curators) a node's last heartbeat, bound to an etcd lease
//	├── heartbeats-seen/<node id>  (older curators) a node's last recorded heartbeat, no lease
//	├── tombstones/<node id>       a deleted node's id, never to register again
//	├── cluster/register-ticket    the ticket nodes register with (raw bytes)
//	├── cluster/config             the cluster configuration (autopilot's settings)
//	├── pki/crl                    the cluster CA's revocation list (PEM)
//	├── recovery/reports/<time>    the report of a quorum-loss recovery
//	└── recovery/superseded/<id>   a cluster id a recovery replaced (hex), and by what
package keys

import (
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Prefix holds all of curia's data; nothing else in etcd is ours.
const Prefix = "/curia/"

const (
	// LeaderElection is the curator's election prefix. The leader's key lives
	// under it; its create revision is the leader's term, and the curator's
	// fence is [leader key @ term]. Written by concurrency.Election.
	LeaderElection = Prefix + "leader/"

	// LeasesPrefix holds named leases granted by the curator leader,
	// leases/<name> (a DNS label, e.g. leases/reconciler). The value is JSON
	// (not protobuf; no proto message exists for it):
	//
	//	{"holder": "<who acquired it>", "term": <granting leader's term>,
	//	 "leader_key": "<its election key>", "ttl_seconds": <etcd lease TTL>,
	//	 "granted": "<RFC 3339 time of the grant>"}
	//
	// Each record is bound to an etcd lease of the TTL and created by the
	// leader in a term-guarded txn with CreateRevision == 0; it is never
	// rewritten in place (keep-alives extend only the etcd lease, which is
	// the truth about expiry), only deleted and created anew. The holder's
	// fence is [leader_key @ term, leases/<name> @ create revision]. A record
	// of an older term is never kept alive and is replaced by the next
	// Acquire.
	LeasesPrefix = Prefix + "leases/"

	// MembershipPrefix holds the membership records below; one read of it
	// is one consistent view of them.
	MembershipPrefix = Prefix + "membership/"

	// MembershipEpoch is bumped (re-Put) in the fenced transaction that
	// starts every etcd membership change and again in the one that
	// finishes it. The epoch is the key's ModRevision, so it only ever
	// grows; the value is the recorder's name, for humans. Every consensus
	// process creates it when its member starts, if it is missing.
	MembershipEpoch = Prefix + "membership/epoch"

	// MembershipPending is the one membership change in flight, cluster-wide
	// (curia.storage.v1.PendingChangeRecord). The fenced transaction that allows
	// a change creates it (CreateRevision == 0, so a second change anywhere
	// is refused); the transaction that finishes the change deletes it. A
	// record whose recorder died is resolved from the live member list by
	// the next consensus process that has watched it past its deadline.
	MembershipPending = Prefix + "membership/pending"

	// MembershipJoining maps a learner's peer URL to the node it was added
	// for (value: the node id as plain text). etcd knows an unstarted
	// learner only by its peer URL; this record names its node until it
	// starts and publishes its name. Written in the same fenced transaction
	// that starts the add; deleted when the add did not happen, or when the
	// member's removal is finished.
	MembershipJoining = Prefix + "membership/joining/"

	// AuditPrefix holds the audit log (curia.audit.v1.Event), one key per
	// event, ordered by time: audit/<unix nanos, 20 digits>-<recorder>.
	AuditPrefix = Prefix + "audit/"

	// NodesPrefix holds the node registry, nodes/<node id> =
	// curia.storage.v1.NodeRecord, written by the curator leader.
	NodesPrefix = Prefix + "nodes/"

	// HeartbeatShardsPrefix holds the nodes' heartbeats in shards,
	// heartbeat-shards/<n> (n: 4 digits or more, from 0000), written only by
	// the curator leader, which keeps every node's last beat in memory. The
	// value is plain text (not protobuf), one line per node, sorted by id:
	//
	//	<node id> <unix nanoseconds of its last beat> <h|t>\n
	//
	// h: HEALTHY, t: HEARTBEAT_TIMEOUT; a node in no shard is UNKNOWN. A
	// shard holds up to 1,000 nodes; a node stays in its shard. Every
	// changed shard is written every heartbeat timeout / 2, all in one
	// term-guarded transaction (split at etcd's request limits), and at
	// once when a node's health changes. A timed-out node that no longer
	// exists leaves its shard. See services/curator/internal/nodewatch/beats.go.
	HeartbeatShardsPrefix = Prefix + "heartbeat-shards/"

	// HeartbeatsPrefix and HeartbeatsSeenPrefix are the per-node heartbeat
	// keys of curators before the shards. A curator leader reads them once
	// into the shards and deletes them; DeleteNode deletes them with the
	// node. Until then the watch hub serves them for nodes in no shard.
	//
	// HeartbeatsPrefix holds heartbeats/<node id> = time of the node's last
	// heartbeat (RFC 3339), bound to an etcd lease of the heartbeat timeout:
	// the key exists while the node is healthy, and survives a curator
	// leader change because etcd keeps it, not the leader's memory.
	HeartbeatsPrefix = Prefix + "heartbeats/"

	// HeartbeatsSeenPrefix holds heartbeats-seen/<node id> = time of the
	// node's last recorded heartbeat (RFC 3339), without a lease. It tells a
	// node whose heartbeats stopped (HEARTBEAT_TIMEOUT: this key, no
	// heartbeats/<node id>) from one that never sent any (UNKNOWN: neither
	// key), also after a curator leader change, and says when the silent node
	// was last heard. The curator leader writes it in the same transaction as
	// heartbeats/<node id>; it is deleted with the node.
	HeartbeatsSeenPrefix = Prefix + "heartbeats-seen/"

	// TombstonesPrefix holds tombstones/<node id> = RFC 3339 time of the
	// node's deletion (plain text), written by DeleteNode in the same
	// transaction that deletes the record and revokes its certificates, and
	// never deleted: a node id is never reused (DESIGN §2), so RegisterNode,
	// CommitNode and BootstrapCluster refuse a tombstoned id.
	TombstonesPrefix = Prefix + "tombstones/"

	// RegisterTicket is the cluster's register ticket (raw bytes), created
	// by the first curator leader.
	RegisterTicket = Prefix + "cluster/register-ticket"

	// ClusterConfig is the cluster configuration
	// (curia.storage.v1.ClusterConfigRecord), written whole by the curator
	// leader (UpdateClusterConfig) in a transaction guarded by the
	// ModRevision it read, which is the configuration's revision. Absent
	// until the first update: every field reads as its default.
	ClusterConfig = Prefix + "cluster/config"

	// CRL is the cluster CA's current certificate revocation list (PEM),
	// written by the curator when it revokes a node's certificate.
	CRL = Prefix + "pki/crl"

	// RecoveryReports holds one curia.consensus.v1.RecoveryReport per
	// quorum-loss recovery, recovery/reports/<RFC 3339 nano time>, written
	// by the consensus process that recovered, in its first transaction.
	RecoveryReports = Prefix + "recovery/reports/"

	// RecoverySuperseded names the clusters a recovery replaced:
	// recovery/superseded/<old cluster id, hex>, value the new cluster's id
	// (hex, plain text). A member of the old cluster holds data that no
	// member of this cluster needs: its node may wipe it (Leave), although
	// the answering cluster's id is not its own.
	RecoverySuperseded = Prefix + "recovery/superseded/"

	// ClusterID is the id (hex, plain text) of the etcd cluster that holds
	// the data: written by a member if missing, and by a recovery, which
	// reads it first. A snapshot carries the id of the cluster it was
	// taken of, so that a restore onto wiped members (which know no
	// cluster of their own) still records which cluster it supersedes
	// (RecoverySuperseded), and clients pinned to it follow.
	ClusterID = Prefix + "cluster/id"

	// MaintenanceMarker serialises node maintenance: every start (and
	// end) of a maintenance writes it, comparing the revision read before
	// it checked that no other node is in maintenance, so two starts for
	// two nodes cannot both pass that check. Its value is the node id.
	MaintenanceMarker = Prefix + "maintenance/marker"
)

// RecoveryReport is the key of the report of a recovery finished at t.
func RecoveryReport(t time.Time) string {
	return RecoveryReports + t.UTC().Format(time.RFC3339Nano)
}

// Superseded is the key that says cluster id was replaced by a recovery.
func Superseded(clusterID uint64) string { return RecoverySuperseded + fmt.Sprintf("%016x", clusterID) }

// Lease is the key of the named lease.
func Lease(name string) string { return LeasesPrefix + name }

// ReconcilerLease names the curator lease the active reconciler holds
// (Leases/Acquire): the consensus service wants it in every membership
// change's fence, the curator pairs it with its leader key.
const ReconcilerLease = "reconciler"

// Joining is the key of the joining record of a learner's peer URL.
func Joining(peerURL string) string { return MembershipJoining + url.PathEscape(peerURL) }

// JoiningPeerURL recovers the peer URL from a joining record key.
func JoiningPeerURL(key string) (string, error) {
	return url.PathUnescape(strings.TrimPrefix(key, MembershipJoining))
}

// Audit is the key of an audit event recorded at t by recorder.
func Audit(t time.Time, recorder string) string {
	return fmt.Sprintf("%s%020d-%s", AuditPrefix, t.UnixNano(), recorder)
}

// Node is the key of a node's record.
func Node(id string) string { return NodesPrefix + id }

// HeartbeatShard is the key of heartbeat shard i.
func HeartbeatShard(i int) string { return fmt.Sprintf("%s%04d", HeartbeatShardsPrefix, i) }

// Heartbeat is the key of a node's heartbeat (older curators).
func Heartbeat(id string) string { return HeartbeatsPrefix + id }

// Tombstone is the key of a deleted node's tombstone.
func Tombstone(id string) string { return TombstonesPrefix + id }

// HeartbeatSeen is the key of the record that a node has sent heartbeats.
func HeartbeatSeen(id string) string { return HeartbeatsSeenPrefix + id }
