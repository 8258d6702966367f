// Package records is the one place curia's records in etcd are encoded and
// decoded. etcd holds the private curia.storage.v1 messages
// (proto/curia/storage/v1/storage.proto), never the API messages they are
// served as; each record converts to and from its API message here, once,
// and every reader and writer goes through that: the services, the deploy
// tools, and the tests that read or write etcd directly.
//
//	curatorv1.Node ──RecordFromNode──▶ storagev1.NodeRecord ──▶ nodes/<id>
//	               ◀──NodeFromRecord──                       ◀──
//	         EncodeNode and DecodeNode do both steps.
//
//	curatorv1.ClusterConfig ──EncodeClusterConfig──▶ cluster/config
//	                        ◀──DecodeClusterConfig──  (defaults filled in)
//
// The API message may gain fields the record lacks (computed on read: a
// node's health, last heartbeat, revision); the conversion leaves them
// unset, and the reader fills them in. See docs/design/api.md,
// "Storage records".
package records

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	storagev1 "curia.dev/gen/curia/storage/v1"
)

// RecordFromNode is what is stored of n: every field but those computed on
// read (health, last_heartbeat, revision, unreadable). The record shares
// n's nested messages and labels: encode it, do not change it apart from n.
func RecordFromNode(n *curatorv1.Node) *storagev1.NodeRecord {
	return &storagev1.NodeRecord{
		Id:                n.GetId(),
		PublicKey:         n.GetPublicKey(),
		State:             n.GetState(),
		Roles:             n.GetRoles(),
		Status:            n.GetStatus(),
		Labels:            n.GetLabels(),
		CertificateSerial: n.GetCertificateSerial(),
		Certificates:      n.GetCertificates(),
		Maintenance:       n.GetMaintenance(),
	}
}

// NodeFromRecord is the API's Node of a stored record, with the fields
// computed on read unset. The node shares r's nested messages and labels.
func NodeFromRecord(r *storagev1.NodeRecord) *curatorv1.Node {
	return &curatorv1.Node{
		Id:                r.GetId(),
		PublicKey:         r.GetPublicKey(),
		State:             r.GetState(),
		Roles:             r.GetRoles(),
		Status:            r.GetStatus(),
		Labels:            r.GetLabels(),
		CertificateSerial: r.GetCertificateSerial(),
		Certificates:      r.GetCertificates(),
		Maintenance:       r.GetMaintenance(),
	}
}

// EncodeNode is the value stored under keys.Node(n.Id) for n.
func EncodeNode(n *curatorv1.Node) ([]byte, error) {
	b, err := proto.Marshal(RecordFromNode(n))
	if err != nil {
		return nil, fmt.Errorf("encode node record %s: %w", n.GetId(), err)
	}
	return b, nil
}

// DecodeNode reads a value stored under keys.Node as the API's Node, with
// the fields computed on read unset.
func DecodeNode(b []byte) (*curatorv1.Node, error) {
	r := &storagev1.NodeRecord{}
	if err := proto.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("decode node record: %w", err)
	}
	return NodeFromRecord(r), nil
}

// RecordFromPendingChange is what is stored of p: all of it. The record
// shares p's timestamps and fence list.
func RecordFromPendingChange(p *consensusv1.PendingChange) *storagev1.PendingChangeRecord {
	return &storagev1.PendingChangeRecord{
		Id:         p.GetId(),
		Operation:  p.GetOperation(),
		MemberId:   p.GetMemberId(),
		NodeId:     p.GetNodeId(),
		PeerUrl:    p.GetPeerUrl(),
		Actor:      p.GetActor(),
		Fence:      p.GetFence(),
		RecordedBy: p.GetRecordedBy(),
		Started:    p.GetStarted(),
		Deadline:   p.GetDeadline(),
	}
}

// PendingChangeFromRecord is the API's PendingChange of a stored record.
// It shares r's timestamps and fence list.
func PendingChangeFromRecord(r *storagev1.PendingChangeRecord) *consensusv1.PendingChange {
	return &consensusv1.PendingChange{
		Id:         r.GetId(),
		Operation:  r.GetOperation(),
		MemberId:   r.GetMemberId(),
		NodeId:     r.GetNodeId(),
		PeerUrl:    r.GetPeerUrl(),
		Actor:      r.GetActor(),
		Fence:      r.GetFence(),
		RecordedBy: r.GetRecordedBy(),
		Started:    r.GetStarted(),
		Deadline:   r.GetDeadline(),
	}
}

// EncodePendingChange is the value stored under keys.MembershipPending for p.
func EncodePendingChange(p *consensusv1.PendingChange) ([]byte, error) {
	b, err := proto.Marshal(RecordFromPendingChange(p))
	if err != nil {
		return nil, fmt.Errorf("encode pending change %s: %w", p.GetId(), err)
	}
	return b, nil
}

// DecodePendingChange reads the value stored under keys.MembershipPending
// as the API's PendingChange.
func DecodePendingChange(b []byte) (*consensusv1.PendingChange, error) {
	r := &storagev1.PendingChangeRecord{}
	if err := proto.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("decode pending change record: %w", err)
	}
	return PendingChangeFromRecord(r), nil
}

// DefaultClusterConfig is the cluster configuration of a cluster that never
// wrote one, and what each field never written reads as: manual membership
// (control_plane_size 0), dead_node_threshold 5m, min_quorum 1,
// stabilization 2s, not paused. It is here, with the decoder that fills
// it in, so that the curator (which serves it) and the reconciler (which
// acts on it before its first read) share one set of defaults.
func DefaultClusterConfig() *curatorv1.ClusterConfig {
	return &curatorv1.ClusterConfig{
		ControlPlaneSize:  0,
		DeadNodeThreshold: durationpb.New(5 * time.Minute),
		MinQuorum:         1,
		Stabilization:     durationpb.New(2 * time.Second),
	}
}

// EncodeClusterConfig is the value stored under keys.ClusterConfig for c:
// all of it.
func EncodeClusterConfig(c *curatorv1.ClusterConfig) ([]byte, error) {
	r := &storagev1.ClusterConfigRecord{
		ControlPlaneSize:  c.GetControlPlaneSize(),
		DeadNodeThreshold: c.GetDeadNodeThreshold(),
		Stabilization:     c.GetStabilization(),
		Paused:            c.GetPaused(),
		PauseReason:       c.GetPauseReason(),
	}
	if c.GetMinQuorum() != 0 {
		r.MinQuorum = proto.Uint32(c.GetMinQuorum())
	}
	b, err := proto.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode cluster config record: %w", err)
	}
	return b, nil
}

// DecodeClusterConfig reads the value stored under keys.ClusterConfig as
// the API's ClusterConfig, every field that the record does not set
// (dead_node_threshold, min_quorum, stabilization) taken from
// DefaultClusterConfig.
func DecodeClusterConfig(b []byte) (*curatorv1.ClusterConfig, error) {
	r := &storagev1.ClusterConfigRecord{}
	if err := proto.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("decode cluster config record: %w", err)
	}
	c := DefaultClusterConfig()
	c.ControlPlaneSize = r.GetControlPlaneSize()
	if r.DeadNodeThreshold != nil {
		c.DeadNodeThreshold = r.GetDeadNodeThreshold()
	}
	if r.MinQuorum != nil {
		c.MinQuorum = r.GetMinQuorum()
	}
	if r.Stabilization != nil {
		c.Stabilization = r.GetStabilization()
	}
	c.Paused = r.GetPaused()
	c.PauseReason = r.GetPauseReason()
	return c, nil
}
