// Package maintenance takes one node out of service for a bounded time (a
// restart, an upgrade) and, through it, out of service for good
// (DecommissionNode). The record is the node's (Node.maintenance); the
// reconciler reads it with the node and neither replaces the node's voter
// nor adds a standby for it while it lasts
// (services/reconciler/internal/plan).
//
// One node at a time (the marker keys.MaintenanceMarker moves with every
// start, and a start compares it), and a voter's node only while the
// cluster can lose that voter: no membership change pending, no learner
// catching up, and a failure tolerance of at least 1 among the voters that
// answer. If the node's member leads etcd, leadership moves to a caught-up
// voter first (as defragmentation does), so the restart costs no election.
//
// It ends by End (EndNodeMaintenance), or by itself at
// Node.maintenance.until: the leader clears expired records every
// sweepEvery (RunExpiry), audited.
//
// A Maintenance gets the etcd client (the marker), the node store, the
// leadership's guarded Txn, the audit log's Op, etcd's members observed
// (and leadership moved) and, for a decommission, the role write; nothing
// else of the curator.
//
// Files: maintenance.go (start, end, expiry, decommission).
package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
	"curia.dev/platform/run"
	"curia.dev/services/curator/internal/etcdmaint"
	"curia.dev/services/curator/internal/nodestore"
	"curia.dev/services/curator/internal/roles"
)

const (
	// defaultDuration is a maintenance's length when the request gives
	// none.
	defaultDuration = 10 * time.Minute
	// sweepEvery is how often the leader looks for expired maintenance.
	sweepEvery = 5 * time.Second
)

// Leadership is this replica's leadership.
type Leadership interface {
	Ours() (key string, term int64, ok bool)
	// Txn runs ops in a transaction guarded by this replica's term, plus
	// cmps: a lost term is rpcerr.NotLeader, failed cmps rpcerr.Conflict.
	Txn(ctx context.Context, cmps []clientv3.Cmp, ops ...clientv3.Op) (*clientv3.TxnResponse, error)
}

// Members is etcd's members as the curator observes them, and the move
// of etcd leadership off one (internal/etcdmaint).
type Members interface {
	Observe(ctx context.Context) (etcdmaint.Observation, error)
	MoveLeader(ctx context.Context, o etcdmaint.Observation, leader uint64) (uint64, error)
}

// Maintenance starts, ends and expires the maintenance of nodes.
type Maintenance struct {
	Etcd    *clientv3.Client
	Nodes   nodestore.Store
	Lead    Leadership
	Members Members
	// Audit is the audit log's write of one change's event.
	Audit interface {
		Op(ctx context.Context, action auditv1.AuditAction, nodeID, reason string) clientv3.Op
	}
	Log *slog.Logger
	// UpdateRoles is the curator's role write (etcd membership first), as
	// UpdateNodeRoles: a decommission takes every role with it.
	UpdateRoles func(ctx context.Context, req *curatorv1.UpdateNodeRolesRequest) (*curatorv1.Node, error)
}

// errMaintenance refuses a maintenance; cause is the "cause" metadata.
func errMaintenance(cause, format string, args ...any) error {
	return rpcerr.With(fmt.Errorf("%w: "+format, append([]any{rpcerr.MaintenanceRefused}, args...)...), "cause", cause)
}

// In reports whether n is in maintenance at now.
func In(n *curatorv1.Node, now time.Time) bool {
	m := n.GetMaintenance()
	return m != nil && now.Before(m.GetUntil().AsTime())
}

// Start puts node req.NodeId in maintenance, or refuses
// (MAINTENANCE_REFUSED, with a cause) and changes nothing.
func (m *Maintenance) Start(ctx context.Context, req *curatorv1.StartNodeMaintenanceRequest) (*curatorv1.Node, error) {
	id := req.GetNodeId()
	n, err := m.Nodes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if n.GetState() != curatorv1.NodeState_NODE_STATE_UP {
		return nil, errMaintenance("not_up", "node %s is %s; only an UP node goes into maintenance", id, n.GetState())
	}
	if In(n, now) {
		return nil, errMaintenance("in_maintenance", "node %s is in maintenance already, until %s (%s); EndNodeMaintenance first to start another",
			id, n.GetMaintenance().GetUntil().AsTime().Format(time.RFC3339), n.GetMaintenance().GetReason())
	}
	// The marker's revision before the scan: a start for another node
	// that lands between the scan and this write moves it, and this write
	// fails (CONFLICT) instead of a second node going into maintenance.
	marker, err := m.Etcd.Get(ctx, keys.MaintenanceMarker)
	if err != nil {
		return nil, fmt.Errorf("read the maintenance marker: %w", err)
	}
	var markerRev int64
	if len(marker.Kvs) > 0 {
		markerRev = marker.Kvs[0].ModRevision
	}
	var other *curatorv1.Node
	if err := m.Nodes.Each(ctx, func(o *curatorv1.Node) error {
		if o.GetId() != id && In(o, now) {
			other = o
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if other != nil {
		return nil, errMaintenance("in_maintenance", "node %s is in maintenance until %s (%s): one node at a time; end it (EndNodeMaintenance) or wait",
			other.GetId(), other.GetMaintenance().GetUntil().AsTime().Format(time.RFC3339), other.GetMaintenance().GetReason())
	}

	moved, why, err := m.clear(ctx, id)
	if err != nil {
		return nil, err
	}
	d := defaultDuration
	if req.GetDuration() != nil {
		d = req.GetDuration().AsDuration()
	}
	n.Maintenance = &curatorv1.NodeMaintenance{
		Reason:            req.GetReason(),
		By:                rpc.Caller(ctx).String(),
		Since:             timestamppb.New(now),
		Until:             timestamppb.New(now.Add(d)),
		LeadershipMovedTo: moved,
	}
	reason := fmt.Sprintf("in maintenance for %v, until %s: %s; %s", d, now.Add(d).UTC().Format(time.RFC3339), req.GetReason(), why)
	failpoint.Hold("before-maintenance-write")
	if _, err := m.Lead.Txn(ctx,
		[]clientv3.Cmp{nodestore.Unchanged(n), clientv3.Compare(clientv3.ModRevision(keys.MaintenanceMarker), "=", markerRev)},
		nodestore.Put(n), clientv3.OpPut(keys.MaintenanceMarker, id),
		m.Audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_MAINTENANCE_START, id, reason)); err != nil {
		return nil, err
	}
	m.Log.Info("node in maintenance", "node", id, "until", now.Add(d), "reason", req.GetReason(), "by", rpc.Caller(ctx).String(), "etcd", why)
	return m.Nodes.Get(ctx, id)
}

// clear checks that the cluster can lose node id's voter now,
// if it has one, and moves etcd leadership away from it; it returns the
// member leadership moved to (0: none) and what it found, in words.
func (m *Maintenance) clear(ctx context.Context, id string) (uint64, string, error) {
	o, err := m.Members.Observe(ctx)
	if err != nil {
		return 0, "", err
	}
	var self *etcdmaint.Member
	voters, answered := 0, 0
	for i, mem := range o.Members {
		if mem.Name == id {
			self = &o.Members[i]
		}
		if !mem.Learner {
			voters++
			if mem.Answered {
				answered++
			}
		}
	}
	if self == nil || self.Learner {
		return 0, "its node has no etcd voter", nil
	}
	for _, mem := range o.Members {
		if mem.Learner {
			return 0, "", errMaintenance("learner", "learner %x (node %s) is catching up: node %s's voter may go once it is promoted or gone", mem.ID, mem.Name, id)
		}
	}
	if o.Pending {
		return 0, "", rpcerr.RetryAfter(errMaintenance("change_pending", "an etcd membership change is pending: node %s's voter may go once it finished", id), time.Second)
	}
	// Losing this voter leaves answered−1 of voters: the quorum needs
	// voters/2+1 of them.
	if t := answered - (voters/2 + 1); t < 1 {
		return 0, "", errMaintenance("failure_tolerance", "%d of %d voters answer, so the failure tolerance is %d: taking node %s's voter down would lose the quorum; bring the others back first", answered, voters, t, id)
	}
	leader, why := o.Leader()
	if leader == 0 {
		return 0, "", errMaintenance("no_leader", "etcd has no leader the members agree on (%s)", why)
	}
	if leader != self.ID {
		return 0, fmt.Sprintf("its voter %x does not lead etcd (%x does); failure tolerance %d of %d voters", self.ID, leader, answered-(voters/2+1), voters), nil
	}
	to, err := m.Members.MoveLeader(ctx, o, leader)
	if err != nil {
		return 0, "", fmt.Errorf("move etcd leadership away from node %s's voter %x: %w", id, leader, err)
	}
	return to, fmt.Sprintf("etcd leadership moved from its voter %x to %x", leader, to), nil
}

// End clears node id's maintenance, audited with why; it reports
// whether there was one.
func (m *Maintenance) End(ctx context.Context, id, why string) (*curatorv1.Node, bool, error) {
	n, err := m.Nodes.Get(ctx, id)
	if err != nil {
		return nil, false, err
	}
	if n.GetMaintenance() == nil {
		return n, false, nil
	}
	was := n.GetMaintenance()
	n.Maintenance = nil
	reason := fmt.Sprintf("maintenance (%s, since %s) %s", was.GetReason(), was.GetSince().AsTime().UTC().Format(time.RFC3339), why)
	if _, err := m.Lead.Txn(ctx, []clientv3.Cmp{nodestore.Unchanged(n)}, nodestore.Put(n), m.Audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_MAINTENANCE_END, id, reason)); err != nil {
		return nil, false, err
	}
	m.Log.Info("node maintenance ended", "node", id, "why", why)
	n, err = m.Nodes.Get(ctx, id)
	return n, true, err
}

// RunExpiry clears, while this replica leads, every maintenance
// whose end passed, until ctx ends.
func (m *Maintenance) RunExpiry(ctx context.Context) error {
	for run.Sleep(ctx, sweepEvery) {
		if _, _, ok := m.Lead.Ours(); !ok {
			continue
		}
		now := time.Now()
		var expired []string
		if err := m.Nodes.Each(ctx, func(n *curatorv1.Node) error {
			if n.GetMaintenance() != nil && !In(n, now) {
				expired = append(expired, n.GetId())
			}
			return nil
		}); err != nil {
			m.Log.Warn("look for expired maintenance", "err", err)
			continue
		}
		for _, id := range expired {
			if _, _, err := m.End(ctx, id, "expired (its end passed)"); err != nil {
				m.Log.Warn("end an expired maintenance", "node", id, "err", err)
			}
		}
	}
	return nil
}

// Decommission takes node req.NodeId out of service for good: maintenance
// first (so autopilot never picks it as a new voter while it goes, and a
// voter's node goes only while the cluster can lose that voter), then its
// roles (UpdateRoles: etcd membership first), then the state, in the
// write that ends the maintenance.
func (m *Maintenance) Decommission(ctx context.Context, req *curatorv1.DecommissionNodeRequest) (*curatorv1.Node, error) {
	id := req.GetNodeId()
	n, err := m.Nodes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if n.GetState() == curatorv1.NodeState_NODE_STATE_DECOMMISSIONED {
		return n, nil
	}
	if n.GetState() != curatorv1.NodeState_NODE_STATE_UP {
		return nil, fmt.Errorf("%w: node %s is %s: only an UP node is decommissioned; delete a node that never committed (DeleteNode)", rpcerr.Refused, id, n.GetState())
	}
	if !In(n, time.Now()) {
		if _, err := m.Start(ctx, &curatorv1.StartNodeMaintenanceRequest{NodeId: id, Reason: "decommissioning: " + req.GetReason()}); err != nil {
			return nil, err
		}
	}
	if roles.Of(n.GetRoles()).Any() {
		off := false
		if _, err := m.UpdateRoles(ctx, &curatorv1.UpdateNodeRolesRequest{
			NodeId: id, ConsensusMember: &off, KubernetesController: &off, KubernetesWorker: &off,
			Reason: "decommissioning: " + req.GetReason(),
		}); err != nil {
			return nil, fmt.Errorf("take node %s's roles (it stays in maintenance; DecommissionNode again goes on): %w", id, err)
		}
	}
	for range rpcerr.ConflictAttempts {
		if n, err = m.Nodes.Get(ctx, id); err != nil {
			return nil, err
		}
		if roles.Of(n.GetRoles()).Any() {
			return nil, fmt.Errorf("%w: node %s got a role back while it was decommissioned (%v); DecommissionNode again", rpcerr.Conflict, id, n.GetRoles())
		}
		n.State, n.Maintenance = curatorv1.NodeState_NODE_STATE_DECOMMISSIONED, nil
		_, err = m.Lead.Txn(ctx, []clientv3.Cmp{nodestore.Unchanged(n)}, nodestore.Put(n), m.Audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_DECOMMISSION, id, "decommissioned: "+req.GetReason()))
		if !errors.Is(err, rpcerr.Conflict) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	m.Log.Info("node decommissioned", "node", id, "by", rpc.Caller(ctx).String(), "reason", req.GetReason())
	return m.Nodes.Get(ctx, id)
}
