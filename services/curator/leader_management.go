package curator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpcerr"
	"curia.dev/platform/run"
	"curia.dev/services/curator/internal/auditlog"
	"curia.dev/services/curator/internal/certs"
	"curia.dev/services/curator/internal/nodestore"
	"curia.dev/services/curator/internal/roles"
)

// managementServer implements curia.curator.v1.Management.
type managementServer struct {
	curatorv1.UnimplementedManagementServer
	s *Service
}

func (x *managementServer) ApproveNode(ctx context.Context, req *curatorv1.ApproveNodeRequest) (*curatorv1.ApproveNodeResponse, error) {
	n, err := x.s.approve(ctx, req.GetNodeId())
	if err != nil {
		return nil, err
	}
	return &curatorv1.ApproveNodeResponse{Node: n}, nil
}

// approve moves NEW to STANDBY; STANDBY and UP are left alone.
func (s *Service) approve(ctx context.Context, id string) (*curatorv1.Node, error) {
	n, err := s.nodes.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	switch n.State {
	case curatorv1.NodeState_NODE_STATE_STANDBY, curatorv1.NodeState_NODE_STATE_UP:
		return n, nil
	case curatorv1.NodeState_NODE_STATE_NEW:
	default:
		return nil, fmt.Errorf("%w: node %s is %s; only NEW nodes are approved", errRefused, id, n.State)
	}
	n.State = curatorv1.NodeState_NODE_STATE_STANDBY
	if _, err := s.lead.Txn(ctx, []clientv3.Cmp{nodestore.Unchanged(n)}, nodestore.Put(n), s.audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_APPROVE, id, "approved")); err != nil {
		return nil, err
	}
	s.log.Info("node approved", "node", id, "by", caller(ctx).String())
	return s.nodes.Get(ctx, id)
}

func (x *managementServer) UpdateNodeRoles(ctx context.Context, req *curatorv1.UpdateNodeRolesRequest) (*curatorv1.UpdateNodeRolesResponse, error) {
	n, err := x.s.updateRoles(ctx, req)
	if err != nil {
		return nil, err
	}
	return &curatorv1.UpdateNodeRolesResponse{Node: n}, nil
}

// roleWriteAttempts bounds how often UpdateNodeRoles decides its role write
// again when the node's record changed under it (a status update), and how
// often it sends one write again when etcd did not answer it.
const roleWriteAttempts = 5

// updateRoles changes roles in DESIGN §5's fixed order: etcd membership
// first, the role second. Membership is the truth: whether the node needs
// an etcd change is decided from a fresh member list, not from its role, so
// consensus_member=false removes the member of a node that lost its role
// and consensus_member=true adds one for a role without a member. A crash
// in between leaves "membership ahead of roles", which the reconciler
// completes; it never leaves a role without membership.
func (s *Service) updateRoles(ctx context.Context, req *curatorv1.UpdateNodeRolesRequest) (*curatorv1.Node, error) {
	n, err := s.nodes.Get(ctx, req.GetNodeId())
	if err != nil {
		return nil, err
	}
	want, touches, err := roles.Plan(n, req)
	if err != nil {
		return nil, err
	}
	hadCM, wantCM := n.GetRoles().GetConsensusMember() != nil, want.ConsensusMember
	if !touches {
		return s.writeRoles(ctx, req, n, hadCM, nil, nil)
	}

	f, err := s.lead.Fence()
	if err != nil {
		return nil, err
	}
	// The membership step is planned from this call's own read of the
	// member list and fenced on its epoch: when another change lands in
	// between (the reconciler's), etcd is not touched and the step is
	// planned again from a fresh read, a few times, instead of handing
	// the caller a stale fence it never held. When etcd refused the step
	// for a moment (its reconfiguration window after a membership change
	// or a new leader: UNAVAILABLE with a retry delay; the change was not
	// applied), it is planned again after that delay, so that a call made
	// just after the cluster formed waits the window out.
	var join *consensusv1.JoinParameters
	var epoch int64
	for attempt := 1; ; attempt++ {
		join, epoch, err = s.membershipStep(ctx, req, n, f, hadCM, wantCM)
		stale := rpcerr.Is(err, rpcerr.FenceStale) && rpcerr.Meta(err, "part") == fence.PartEpoch
		delay, later := rpcerr.RetryDelay(err)
		later = later && !stale && rpcerr.Is(err, rpcerr.Unavailable)
		if stale && attempt == membershipStepAttempts {
			// Still moving: the caller's request was never wrong, so it
			// gets a conflict to retry, not a fence it never held.
			return nil, fmt.Errorf("%w: etcd membership changed under each of %d attempts to plan this call's step (another change landed in between each time); retry: %v", errConflict, attempt, err)
		}
		if (!stale && !later) || attempt == membershipStepAttempts {
			break
		}
		wait := time.Duration(attempt) * 100 * time.Millisecond
		if later {
			wait = delay
		}
		if !run.Sleep(ctx, wait) {
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	return s.writeRoles(ctx, req, nil, hadCM, join, membershipGuard(epoch))
}

// membershipStepAttempts bounds how often UpdateNodeRoles plans its etcd
// step again when membership changed between its read and its call (with
// 100 ms more between each; then the caller gets CONFLICT, Aborted), or
// after etcd refused it for a moment (after the delay etcd's refusal
// names; then the caller gets that UNAVAILABLE).
const membershipStepAttempts = 5

// membershipStep makes etcd membership what req asks for node n, from a
// fresh member list, fenced on f at that list's epoch: the join parameters
// of the node's member (when it has or gets one) and the epoch after.
func (s *Service) membershipStep(ctx context.Context, req *curatorv1.UpdateNodeRolesRequest, n *curatorv1.Node, f fence.Fence, hadCM, wantCM bool) (*consensusv1.JoinParameters, int64, error) {
	members, err := s.consensus.listMembers(ctx)
	if err != nil {
		return nil, 0, err
	}
	if p := members.GetPending(); p != nil {
		return nil, 0, fmt.Errorf("%w: membership change %s of node %s by %s is in flight; retry once it finished", rpcerr.ChangePending, p.GetOperation(), p.GetNodeId(), p.GetActor())
	}
	epoch := members.GetMembershipEpoch()
	fenced := f.WithEpoch(epoch).Proto()
	failpoint.Hold("before-membership-call")
	isMember := false
	for _, m := range members.GetMembers() {
		if m.GetNodeId() == n.Id {
			isMember = true
		}
	}

	var join *consensusv1.JoinParameters
	switch {
	case wantCM && (!isMember || !hadCM):
		// A new member, or the join parameters of the member a role-less
		// node has (AddNode is idempotent per node).
		peerURL := n.GetStatus().GetConsensusPeerUrl()
		if peerURL == "" {
			return nil, 0, fmt.Errorf("%w: node %s has not reported a consensus peer URL (status.consensus_peer_url); its agent reports one when the node can run consensus", errRefused, n.Id)
		}
		// The role carries a member certificate of this key: checked
		// before etcd membership changes.
		if _, err := certs.ConsensusKey(n); err != nil {
			return nil, 0, err
		}
		err = s.consensus.do(ctx, "add "+n.Id+" to etcd", func(c consensusv1.ConsensusClient) error {
			resp, err := c.AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: n.Id, PeerUrl: peerURL, Fence: fenced})
			join, epoch = resp.GetJoin(), resp.GetMembershipEpoch()
			return err
		})
		if err != nil {
			return nil, 0, err
		}
		failpoint.Crash("after-add-node")
	case !wantCM && isMember:
		err = s.consensus.do(ctx, "remove "+n.Id+" from etcd", func(c consensusv1.ConsensusClient) error {
			resp, err := c.RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: n.Id}, Fence: fenced, Reason: audit.Truncate("UpdateNodeRoles consensus_member=false: "+req.GetReason(), 1024)})
			epoch = resp.GetMembershipEpoch()
			return err
		})
		if err != nil {
			return nil, 0, err
		}
		failpoint.Crash("after-remove-member")
	}
	return join, epoch, nil
}

// writeRoles writes the roles req asks for, deciding again from the node's
// record on every attempt (a status update may race with us): first from
// read, the record the caller just read (nil: read it), then re-read. The
// write is conditional on that record, and on guard: after an etcd step,
// the membership epoch it left and no change pending (membershipGuard), so
// that if membership moved on meanwhile, the role is not written (Aborted)
// and the reconciler aligns roles with membership; nil for a change that
// does not touch membership (roles.TouchesMembership).
func (s *Service) writeRoles(ctx context.Context, req *curatorv1.UpdateNodeRolesRequest, read *curatorv1.Node, hadCM bool, join *consensusv1.JoinParameters, guard []clientv3.Cmp) (*curatorv1.Node, error) {
	reason := req.GetReason()
	if reason == "" {
		reason = "UpdateNodeRoles"
	}
	for range roleWriteAttempts {
		failpoint.Hold("before-role-write")
		n := read
		read = nil
		if n == nil {
			var err error
			if n, err = s.nodes.Get(ctx, req.GetNodeId()); err != nil {
				return nil, err
			}
		}
		// The decision again, on this record (roles.Update).
		want, changed, err := roles.Update(n, req, hadCM, guard != nil, join)
		if err != nil {
			return nil, err
		}
		if !changed {
			return n, nil
		}
		crlOps, crlCmps, err := s.certs.WithMemberCertificate(ctx, n, want)
		if err != nil {
			return nil, err
		}
		n.Roles = want
		ev := s.audit.Event(ctx, auditv1.AuditAction_AUDIT_ACTION_ROLES_UPDATE, n.Id, reason)
		ev.Roles = auditlog.Roles(want)
		cmps := append(append([]clientv3.Cmp{nodestore.Unchanged(n)}, guard...), crlCmps...)
		ops := append(crlOps, nodestore.Put(n), audit.Put(ev))
		resp, err := s.lead.Txn(ctx, cmps, ops...)
		for attempt := 1; errors.Is(err, errUnavailable) && attempt < roleWriteAttempts && ctx.Err() == nil; attempt++ {
			// The endpoint may be the member this call's own step just
			// removed ("raft: stopped"): the same write on another. It
			// is guarded, so it lands once at most: if the first did
			// land, this one conflicts and the node is read again.
			run.Sleep(ctx, time.Duration(attempt)*100*time.Millisecond)
			resp, err = s.lead.Txn(ctx, cmps, ops...)
		}
		if err == nil {
			s.log.Info("roles updated", "node", n.Id, "roles", roles.Names(want), "by", caller(ctx).String())
			n.Revision = resp.Header.Revision // the record as just written
			return n, nil
		}
		if !errors.Is(err, errConflict) {
			return nil, err
		}
		if guard == nil {
			continue
		}
		if moved, err := s.membershipMoved(ctx, guard); err != nil || moved {
			if err == nil {
				err = fmt.Errorf("%w: etcd membership changed while the roles of node %s were written; the roles were not written (the reconciler aligns them with membership): read the node and retry", errConflict, n.Id)
			}
			return nil, err
		}
	}
	return nil, fmt.Errorf("%w: node %s changed under every one of %d attempts to write its roles; retry", errConflict, req.GetNodeId(), roleWriteAttempts)
}

// membershipGuard is the condition of a role write after an etcd step:
// membership is still at the epoch the step left, and no change is
// pending.
func membershipGuard(epoch int64) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(keys.MembershipEpoch), "=", epoch),
		clientv3.Compare(clientv3.CreateRevision(keys.MembershipPending), "=", 0),
	}
}

// membershipMoved says whether guard (membershipGuard's) no longer holds.
func (s *Service) membershipMoved(ctx context.Context, guard []clientv3.Cmp) (bool, error) {
	resp, err := s.etcd.Txn(ctx).If(guard...).Commit()
	if err != nil {
		return false, fmt.Errorf("%w: read the membership epoch: %v", errUnavailable, err)
	}
	return !resp.Succeeded, nil
}

func (x *managementServer) DeleteNode(ctx context.Context, req *curatorv1.DeleteNodeRequest) (*curatorv1.DeleteNodeResponse, error) {
	resp, err := x.s.deleteNode(ctx, req)
	return resp, err
}

// deleteNode deletes a node, revokes every certificate issued to it that is
// still valid and tombstones its id, in one write. A node that is still an
// etcd member loses that membership to the reconciler afterwards.
func (s *Service) deleteNode(ctx context.Context, req *curatorv1.DeleteNodeRequest) (*curatorv1.DeleteNodeResponse, error) {
	return rpcerr.RetryConflicts(ctx, "delete node "+req.GetNodeId(), func() (*curatorv1.DeleteNodeResponse, error) {
		n, err := s.nodes.Get(ctx, req.GetNodeId())
		if err != nil {
			return nil, err
		}
		if roles.Of(n.GetRoles()).Any() && !req.GetSafetyBypassHasRoles() {
			return nil, fmt.Errorf("%w: node %s has roles (%s): take them away with UpdateNodeRoles first, or set safety_bypass_has_roles (the reconciler then removes its etcd member)", errRefused, n.Id, roles.Names(n.GetRoles()))
		}
		if n.State == curatorv1.NodeState_NODE_STATE_UP && !req.GetSafetyBypassNotDecommissioned() {
			return nil, fmt.Errorf("%w: node %s is UP, not decommissioned: set safety_bypass_not_decommissioned to delete it anyway", errRefused, n.Id)
		}
		serials := certs.Unrevoked(n)
		why := "deleted, id tombstoned; certificates revoked: " + strings.Join(serials, ", ")
		if len(serials) == 0 {
			why = "deleted, id tombstoned; it had no valid certificate to revoke"
		}
		_, tomb := certs.Tombstone(n.Id)
		ops := []clientv3.Op{clientv3.OpDelete(keys.Node(n.Id)), clientv3.OpDelete(keys.Heartbeat(n.Id)), clientv3.OpDelete(keys.HeartbeatSeen(n.Id)), tomb, s.audit.Op(ctx, auditv1.AuditAction_AUDIT_ACTION_NODE_DELETE, n.Id, why)}
		cmps := []clientv3.Cmp{nodestore.Unchanged(n)}
		if len(serials) > 0 {
			put, cmp, err := s.certs.Revoke(ctx, serials...)
			if err != nil {
				return nil, err
			}
			ops, cmps = append(ops, put), append(cmps, cmp)
		}
		// A conflict (the node or the CRL changed): decide again.
		if _, err := s.lead.Txn(ctx, cmps, ops...); err != nil {
			return nil, err
		}
		s.log.Info("node deleted", "node", n.Id, "revoked", serials, "by", caller(ctx).String())
		return &curatorv1.DeleteNodeResponse{RevokedSerial: n.CertificateSerial, RevokedSerials: serials}, nil
	})
}

func (x *managementServer) GetRegisterTicket(ctx context.Context, _ *curatorv1.GetRegisterTicketRequest) (*curatorv1.GetRegisterTicketResponse, error) {
	resp, err := x.s.etcd.Get(ctx, keys.RegisterTicket)
	if err != nil {
		return nil, fmt.Errorf("read register ticket: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: no register ticket yet (the leader creates it); retry shortly", errUnavailable)
	}
	return &curatorv1.GetRegisterTicketResponse{Ticket: resp.Kvs[0].Value}, nil
}

func (x *managementServer) GetClusterInfo(ctx context.Context, _ *curatorv1.GetClusterInfoRequest) (*curatorv1.GetClusterInfoResponse, error) {
	s := x.s
	cur, _ := s.lead.leader()
	info := &curatorv1.GetClusterInfoResponse{
		ClusterName:     s.cfg.Cluster,
		CaCertificate:   s.creds.CAPEM,
		LeaderName:      cur.Name,
		Term:            cur.Term,
		NodesByState:    map[string]int64{},
		Snapshots:       s.snaps.Status(),
		EtcdMaintenance: s.defrag.Status(),
	}
	err := s.nodes.Each(ctx, func(n *curatorv1.Node) error {
		info.NodesByState[n.State.String()]++
		return nil
	})
	if err != nil {
		return nil, err
	}
	return info, nil
}
