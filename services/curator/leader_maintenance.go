package curator

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpcerr"
	"curia.dev/platform/run"
	"curia.dev/services/curator/internal/etcdmaint"
	"curia.dev/services/curator/internal/nodestore"
	"curia.dev/services/curator/internal/roles"
)

// Maintenance takes one node out of service for a bounded time: a restart,
// an upgrade. The record is the node's (Node.maintenance); the reconciler
// reads it with the node and neither replaces the node's voter nor adds a
// standby for it while it lasts (services/reconciler/internal/plan).
//
// One node at a time, and a voter's node only while the cluster can lose
// that voter: no membership change pending, no learner catching up, and a
// failure tolerance of at least 1 among the voters that answer. If the
// node's member leads etcd, leadership moves to a caught-up voter first
// (as defragmentation does), so the restart costs no election.
//
// It ends by EndNodeMaintenance, or by itself at Node.maintenance.until:
// the leader clears expired records every maintenanceSweep, audited.
const (
	defaultMaintenance = 10 * time.Minute
	maintenanceSweep   = 5 * time.Second
)

// errMaintenance refuses a maintenance; cause is the "cause" metadata.
func errMaintenance(cause, format string, args ...any) error {
	return rpcerr.With(fmt.Errorf("%w: "+format, append([]any{rpcerr.MaintenanceRefused}, args...)...), "cause", cause)
}

// inMaintenance reports whether n is in maintenance at now.
func inMaintenance(n *curatorv1.Node, now time.Time) bool {
	m := n.GetMaintenance()
	return m != nil && now.Before(m.GetUntil().AsTime())
}

func (x *managementServer) StartNodeMaintenance(ctx context.Context, req *curatorv1.StartNodeMaintenanceRequest) (*curatorv1.StartNodeMaintenanceResponse, error) {
	n, err := x.s.startMaintenance(ctx, req)
	if err != nil {
		return nil, err
	}
	return &curatorv1.StartNodeMaintenanceResponse{Node: n}, nil
}

func (x *managementServer) EndNodeMaintenance(ctx context.Context, req *curatorv1.EndNodeMaintenanceRequest) (*curatorv1.EndNodeMaintenanceResponse, error) {
	n, ended, err := x.s.endMaintenance(ctx, req.GetNodeId(), "ended by "+caller(ctx).String())
	if err != nil {
		return nil, err
	}
	return &curatorv1.EndNodeMaintenanceResponse{Node: n, Ended: ended}, nil
}

func (s *Service) startMaintenance(ctx context.Context, req *curatorv1.StartNodeMaintenanceRequest) (*curatorv1.Node, error) {
	id := req.GetNodeId()
	n, err := s.nodes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if n.GetState() != curatorv1.NodeState_NODE_STATE_UP {
		return nil, errMaintenance("not_up", "node %s is %s; only an UP node goes into maintenance", id, n.GetState())
	}
	if inMaintenance(n, now) {
		return nil, errMaintenance("in_maintenance", "node %s is in maintenance already, until %s (%s); EndNodeMaintenance first to start another",
			id, n.GetMaintenance().GetUntil().AsTime().Format(time.RFC3339), n.GetMaintenance().GetReason())
	}
	// The marker's revision before the scan: a start for another node
	// that lands between the scan and this write moves it, and this write
	// fails (CONFLICT) instead of a second node going into maintenance.
	marker, err := s.etcd.Get(ctx, keys.MaintenanceMarker)
	if err != nil {
		return nil, fmt.Errorf("read the maintenance marker: %w", err)
	}
	var markerRev int64
	if len(marker.Kvs) > 0 {
		markerRev = marker.Kvs[0].ModRevision
	}
	var other *curatorv1.Node
	if err := s.nodes.Each(ctx, func(o *curatorv1.Node) error {
		if o.GetId() != id && inMaintenance(o, now) {
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

	moved, why, err := s.clearForMaintenance(ctx, id)
	if err != nil {
		return nil, err
	}
	d := defaultMaintenance
	if req.GetDuration() != nil {
		d = req.GetDuration().AsDuration()
	}
	n.Maintenance = &curatorv1.NodeMaintenance{
		Reason:            req.GetReason(),
		By:                caller(ctx).String(),
		Since:             timestamppb.New(now),
		Until:             timestamppb.New(now.Add(d)),
		LeadershipMovedTo: moved,
	}
	reason := fmt.Sprintf("in maintenance for %v, until %s: %s; %s", d, now.Add(d).UTC().Format(time.RFC3339), req.GetReason(), why)
	if _, err := s.lead.Txn(ctx,
		[]clientv3.Cmp{nodestore.Unchanged(n), clientv3.Compare(clientv3.ModRevision(keys.MaintenanceMarker), "=", markerRev)},
		nodestore.Put(n), clientv3.OpPut(keys.MaintenanceMarker, id),
		s.audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_MAINTENANCE_START, id, reason)); err != nil {
		return nil, err
	}
	s.log.Info("node in maintenance", "node", id, "until", now.Add(d), "reason", req.GetReason(), "by", caller(ctx).String(), "etcd", why)
	return s.nodes.Get(ctx, id)
}

// clearForMaintenance checks that the cluster can lose node id's voter now,
// if it has one, and moves etcd leadership away from it; it returns the
// member leadership moved to (0: none) and what it found, in words.
func (s *Service) clearForMaintenance(ctx context.Context, id string) (uint64, string, error) {
	o, err := s.defrag.Observe(ctx)
	if err != nil {
		return 0, "", err
	}
	var self *etcdmaint.Member
	voters, answered := 0, 0
	for i, m := range o.Members {
		if m.Name == id {
			self = &o.Members[i]
		}
		if !m.Learner {
			voters++
			if m.Answered {
				answered++
			}
		}
	}
	if self == nil || self.Learner {
		return 0, "its node has no etcd voter", nil
	}
	for _, m := range o.Members {
		if m.Learner {
			return 0, "", errMaintenance("learner", "learner %x (node %s) is catching up: node %s's voter may go once it is promoted or gone", m.ID, m.Name, id)
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
	to, err := s.defrag.MoveLeader(ctx, o, leader)
	if err != nil {
		return 0, "", fmt.Errorf("move etcd leadership away from node %s's voter %x: %w", id, leader, err)
	}
	return to, fmt.Sprintf("etcd leadership moved from its voter %x to %x", leader, to), nil
}

// endMaintenance clears node id's maintenance, audited with why; it reports
// whether there was one.
func (s *Service) endMaintenance(ctx context.Context, id, why string) (*curatorv1.Node, bool, error) {
	n, err := s.nodes.Get(ctx, id)
	if err != nil {
		return nil, false, err
	}
	if n.GetMaintenance() == nil {
		return n, false, nil
	}
	m := n.GetMaintenance()
	n.Maintenance = nil
	reason := fmt.Sprintf("maintenance (%s, since %s) %s", m.GetReason(), m.GetSince().AsTime().UTC().Format(time.RFC3339), why)
	if _, err := s.lead.Txn(ctx, []clientv3.Cmp{nodestore.Unchanged(n)}, nodestore.Put(n), s.audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_MAINTENANCE_END, id, reason)); err != nil {
		return nil, false, err
	}
	s.log.Info("node maintenance ended", "node", id, "why", why)
	n, err = s.nodes.Get(ctx, id)
	return n, true, err
}

// expireMaintenance clears, while this replica leads, every maintenance
// whose end passed, until ctx ends.
func (s *Service) expireMaintenance(ctx context.Context) error {
	for run.Sleep(ctx, maintenanceSweep) {
		if _, _, ok := s.lead.Ours(); !ok {
			continue
		}
		now := time.Now()
		var expired []string
		if err := s.nodes.Each(ctx, func(n *curatorv1.Node) error {
			if n.GetMaintenance() != nil && !inMaintenance(n, now) {
				expired = append(expired, n.GetId())
			}
			return nil
		}); err != nil {
			s.log.Warn("look for expired maintenance", "err", err)
			continue
		}
		for _, id := range expired {
			if _, _, err := s.endMaintenance(ctx, id, "expired (its end passed)"); err != nil {
				s.log.Warn("end an expired maintenance", "node", id, "err", err)
			}
		}
	}
	return nil
}

func (x *managementServer) DecommissionNode(ctx context.Context, req *curatorv1.DecommissionNodeRequest) (*curatorv1.DecommissionNodeResponse, error) {
	n, err := x.s.decommission(ctx, req)
	if err != nil {
		return nil, err
	}
	return &curatorv1.DecommissionNodeResponse{Node: n}, nil
}

// decommission takes node req.NodeId out of service for good: maintenance
// first (so autopilot never picks it as a new voter while it goes, and a
// voter's node goes only while the cluster can lose that voter), then its
// roles (updateRoles: etcd membership first), then the state, in the
// write that ends the maintenance.
func (s *Service) decommission(ctx context.Context, req *curatorv1.DecommissionNodeRequest) (*curatorv1.Node, error) {
	id := req.GetNodeId()
	n, err := s.nodes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if n.GetState() == curatorv1.NodeState_NODE_STATE_DECOMMISSIONED {
		return n, nil
	}
	if n.GetState() != curatorv1.NodeState_NODE_STATE_UP {
		return nil, fmt.Errorf("%w: node %s is %s: only an UP node is decommissioned; delete a node that never committed (DeleteNode)", errRefused, id, n.GetState())
	}
	if !inMaintenance(n, time.Now()) {
		if _, err := s.startMaintenance(ctx, &curatorv1.StartNodeMaintenanceRequest{NodeId: id, Reason: "decommissioning: " + req.GetReason()}); err != nil {
			return nil, err
		}
	}
	if roles.Of(n.GetRoles()).Any() {
		off := false
		if _, err := s.updateRoles(ctx, &curatorv1.UpdateNodeRolesRequest{
			NodeId: id, ConsensusMember: &off, KubernetesController: &off, KubernetesWorker: &off,
			Reason: "decommissioning: " + req.GetReason(),
		}); err != nil {
			return nil, fmt.Errorf("take node %s's roles (it stays in maintenance; DecommissionNode again goes on): %w", id, err)
		}
	}
	for range rpcerr.ConflictAttempts {
		if n, err = s.nodes.Get(ctx, id); err != nil {
			return nil, err
		}
		if roles.Of(n.GetRoles()).Any() {
			return nil, fmt.Errorf("%w: node %s got a role back while it was decommissioned (%v); DecommissionNode again", errConflict, id, n.GetRoles())
		}
		n.State, n.Maintenance = curatorv1.NodeState_NODE_STATE_DECOMMISSIONED, nil
		_, err = s.lead.Txn(ctx, []clientv3.Cmp{nodestore.Unchanged(n)}, nodestore.Put(n), s.audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_DECOMMISSION, id, "decommissioned: "+req.GetReason()))
		if !errors.Is(err, errConflict) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	s.log.Info("node decommissioned", "node", id, "by", caller(ctx).String(), "reason", req.GetReason())
	return s.nodes.Get(ctx, id)
}
