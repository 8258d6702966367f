package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
	"curia.dev/platform/run"
	"curia.dev/services/curator/internal/auditlog"
	"curia.dev/services/curator/internal/certs"
	"curia.dev/services/curator/internal/nodestore"
	"curia.dev/services/curator/internal/roles"
)

// roleWriteAttempts bounds how often UpdateNodeRoles decides its role write
// again when the node's record changed under it (a status update), and how
// often it sends one write again when etcd did not answer it.
const roleWriteAttempts = 5

// UpdateRoles changes roles in DESIGN §5's fixed order: etcd membership
// first, the role second. Membership is the truth: whether the node needs
// an etcd change is decided from a fresh member list, not from its role, so
// consensus_member=false removes the member of a node that lost its role
// and consensus_member=true adds one for a role without a member. A crash
// in between leaves "membership ahead of roles", which the reconciler
// completes; it never leaves a role without membership.
func (r *Registry) UpdateRoles(ctx context.Context, req *curatorv1.UpdateNodeRolesRequest) (*curatorv1.Node, error) {
	n, err := r.Nodes.Get(ctx, req.GetNodeId())
	if err != nil {
		return nil, err
	}
	want, touches, err := roles.Plan(n, req)
	if err != nil {
		return nil, err
	}
	hadCM, wantCM := n.GetRoles().GetConsensusMember() != nil, want.ConsensusMember
	if !touches {
		return r.writeRoles(ctx, req, n, hadCM, nil, nil)
	}

	f, err := r.Lead.Fence()
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
		join, epoch, err = r.membershipStep(ctx, req, n, f, hadCM, wantCM)
		stale := rpcerr.Is(err, rpcerr.FenceStale) && rpcerr.Meta(err, "part") == fence.PartEpoch
		delay, later := rpcerr.RetryDelay(err)
		later = later && !stale && rpcerr.Is(err, rpcerr.Unavailable)
		if stale && attempt == membershipStepAttempts {
			// Still moving: the caller's request was never wrong, so it
			// gets a conflict to retry, not a fence it never held.
			return nil, fmt.Errorf("%w: etcd membership changed under each of %d attempts to plan this call's step (another change landed in between each time); retry: %v", rpcerr.Conflict, attempt, err)
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
	return r.writeRoles(ctx, req, nil, hadCM, join, membershipGuard(epoch))
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
func (r *Registry) membershipStep(ctx context.Context, req *curatorv1.UpdateNodeRolesRequest, n *curatorv1.Node, f fence.Fence, hadCM, wantCM bool) (*consensusv1.JoinParameters, int64, error) {
	members, err := r.Consensus.ListMembers(ctx)
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
			return nil, 0, fmt.Errorf("%w: node %s has not reported a consensus peer URL (status.consensus_peer_url); its agent reports one when the node can run consensus", rpcerr.Refused, n.Id)
		}
		// The role carries a member certificate of this key: checked
		// before etcd membership changes.
		if _, err := certs.ConsensusKey(n); err != nil {
			return nil, 0, err
		}
		err = r.Consensus.Do(ctx, "add "+n.Id+" to etcd", func(c consensusv1.ConsensusClient) error {
			resp, err := c.AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: n.Id, PeerUrl: peerURL, Fence: fenced})
			join, epoch = resp.GetJoin(), resp.GetMembershipEpoch()
			return err
		})
		if err != nil {
			return nil, 0, err
		}
		failpoint.Crash("after-add-node")
	case !wantCM && isMember:
		err = r.Consensus.Do(ctx, "remove "+n.Id+" from etcd", func(c consensusv1.ConsensusClient) error {
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
func (r *Registry) writeRoles(ctx context.Context, req *curatorv1.UpdateNodeRolesRequest, read *curatorv1.Node, hadCM bool, join *consensusv1.JoinParameters, guard []clientv3.Cmp) (*curatorv1.Node, error) {
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
			if n, err = r.Nodes.Get(ctx, req.GetNodeId()); err != nil {
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
		crlOps, crlCmps, err := r.Certs.WithMemberCertificate(ctx, n, want)
		if err != nil {
			return nil, err
		}
		n.Roles = want
		ev := r.Audit.Event(ctx, auditv1.AuditAction_AUDIT_ACTION_ROLES_UPDATE, n.Id, reason)
		ev.Roles = auditlog.Roles(want)
		cmps := append(append([]clientv3.Cmp{nodestore.Unchanged(n)}, guard...), crlCmps...)
		ops := append(crlOps, nodestore.Put(n), audit.Put(ev))
		resp, err := r.Lead.Txn(ctx, cmps, ops...)
		for attempt := 1; errors.Is(err, rpcerr.Unavailable) && attempt < roleWriteAttempts && ctx.Err() == nil; attempt++ {
			// The endpoint may be the member this call's own step just
			// removed ("raft: stopped"): the same write on another. It
			// is guarded, so it lands once at most: if the first did
			// land, this one conflicts and the node is read again.
			run.Sleep(ctx, time.Duration(attempt)*100*time.Millisecond)
			resp, err = r.Lead.Txn(ctx, cmps, ops...)
		}
		if err == nil {
			r.Log.Info("roles updated", "node", n.Id, "roles", roles.Names(want), "by", rpc.Caller(ctx).String())
			n.Revision = resp.Header.Revision // the record as just written
			return n, nil
		}
		if !errors.Is(err, rpcerr.Conflict) {
			return nil, err
		}
		if guard == nil {
			continue
		}
		if moved, err := r.membershipMoved(ctx, guard); err != nil || moved {
			if err == nil {
				err = fmt.Errorf("%w: etcd membership changed while the roles of node %s were written; the roles were not written (the reconciler aligns them with membership): read the node and retry", rpcerr.Conflict, n.Id)
			}
			return nil, err
		}
	}
	return nil, fmt.Errorf("%w: node %s changed under every one of %d attempts to write its roles; retry", rpcerr.Conflict, req.GetNodeId(), roleWriteAttempts)
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
func (r *Registry) membershipMoved(ctx context.Context, guard []clientv3.Cmp) (bool, error) {
	resp, err := r.Etcd.Txn(ctx).If(guard...).Commit()
	if err != nil {
		return false, fmt.Errorf("%w: read the membership epoch: %v", rpcerr.Unavailable, err)
	}
	return !resp.Succeeded, nil
}
