package registry

// The reconciler's fenced role writes (curia.curator.v1.Reconciliation,
// DESIGN §4). Each is one etcd txn that checks the reconciler's lease fence
// (internal/leases grants it), the membership epoch it planned from, the
// node's revision it read and this leader's term, and writes the node, the
// member certificate's revocation if the role goes, and the audit event:
//
//	reconciler ── ReconcileNodeRoles(fence, node@rev, change) ──▶ leader
//	                                       fence.Apply(fence + node@rev + no pending change)
//	                                       ├─ holds:  put node, audit event
//	                                       └─ stale:  Aborted, why (whyStale)

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
	"curia.dev/services/curator/internal/auditlog"
	"curia.dev/services/curator/internal/leases"
	"curia.dev/services/curator/internal/nodestore"
	"curia.dev/services/curator/internal/roles"
)

// ReconcileNodeRoles is the reconciler's fenced role write: one etcd txn
// that checks the fence (leader key and lease), the membership epoch, the
// node's revision and this leader's term, and writes the node and the
// audit event. Any stale part is Aborted with the reason; nothing is
// written then. The fence is checked even when the write would change
// nothing, so that a stale caller always learns it is stale.
func (r *Registry) ReconcileNodeRoles(ctx context.Context, req *curatorv1.ReconcileNodeRolesRequest) (*curatorv1.Node, error) {
	f := fence.FromProto(req.GetFence())
	leaderCond, _, err := leases.FenceShape(f, leases.Reconciler)
	if err != nil {
		return nil, err
	}
	if f.Epoch <= 0 {
		return nil, fmt.Errorf("%w: fence.membership_epoch is required: the epoch read before listing members (ListMembersResponse.membership_epoch)", rpcerr.Invalid)
	}
	// The node id, a positive node revision, one change (join parameters
	// that can be joined with, or remove_consensus_member=true) and a
	// reason of at most 1024 bytes are the request's contract.
	id, rev := req.GetNodeId(), req.GetNodeRevision()
	join := req.GetAddConsensusMember()
	action := auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_REMOVE_CONSENSUS_MEMBER
	if join != nil {
		action = auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_ADD_CONSENSUS_MEMBER
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "ReconcileNodeRoles"
	}

	// The fence's leader key is the term that granted the lease; this
	// leader accepts only its own term.
	leaderKey, term, ok := r.Lead.Ours()
	if !ok {
		return nil, rpcerr.NotLeader
	}
	if leaderCond.Key != leaderKey || leaderCond.CreateRevision != term {
		return nil, leases.StaleLeader("fence from term %d; the leader is at term %d: re-acquire the lease", leaderCond.CreateRevision, term)
	}
	// The fence (leader key and term, the lease granted by that term,
	// the epoch) is checked by fence.Apply; besides it, the node must be as
	// the caller read it, and no membership change may be in flight (its
	// epoch bump would fail the fence anyway; this says so at once).
	extra := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(keys.Node(id)), "=", rev),
		clientv3.Compare(clientv3.CreateRevision(keys.MembershipPending), "=", 0),
	}

	// Decide on the node as the caller read it. If it is gone or at another
	// revision, the txn fails on the node's revision (after the fence).
	var ops []clientv3.Op
	var refused error
	n, err := r.Nodes.Get(ctx, id)
	switch {
	case errors.Is(err, rpcerr.NotFound):
	case err != nil:
		return nil, err
	case n.Revision == rev:
		memberID := join.GetMemberId()
		if join == nil {
			memberID = n.GetRoles().GetConsensusMember().GetJoin().GetMemberId()
		}
		// The decision (roles.Reconcile); a refusal is returned after the
		// fence check, like every refusal.
		var want *curatorv1.Roles
		var changed bool
		want, changed, refused = roles.Reconcile(n, join)
		var crlOps []clientv3.Op
		var crlCmps []clientv3.Cmp
		if refused == nil && changed {
			crlOps, crlCmps, refused = r.Certs.WithMemberCertificate(ctx, n, want)
		}
		if refused == nil && changed {
			n.Roles = want
			extra = append(extra, crlCmps...)
			ops = append(crlOps, nodestore.Put(n), audit.Put(&auditv1.Event{
				Actor:      rpc.Caller(ctx).String(),
				RecordedBy: "curator/" + r.Name,
				Action:     action,
				NodeId:     id,
				MemberId:   memberID,
				Fence:      f.Strings(),
				Reason:     reason,
				Roles:      auditlog.Roles(want),
			}))
		}
	}

	if _, err := fence.Apply(ctx, r.Etcd, f, extra, ops...); err != nil {
		var se *fence.StaleError
		if errors.As(err, &se) {
			return nil, r.whyStale(ctx, se, f, leaderKey, term, id, rev)
		}
		return nil, err
	}
	if refused != nil {
		return nil, refused
	}
	if len(ops) == 0 {
		return n, nil // nothing to change; the fence holds
	}
	r.Log.Info("node roles reconciled", "node", id, "action", action.String(), "fence", f.String(), "term", term, "by", rpc.Caller(ctx).String(), "reason", reason)
	return r.Nodes.Get(ctx, id)
}

// whyStale names the condition of a failed reconcile txn: this leader's
// term, then the caller's fence and epoch (in fence.Apply's words), then a
// pending change, then the node. It reads after the txn; every condition
// only ever goes from true to false (keys are not re-created at an old
// revision, revisions only grow), so what failed then is still false now —
// except a pending change, which may have finished meanwhile; then the
// epoch it bumped failed the fence.
func (r *Registry) whyStale(ctx context.Context, se *fence.StaleError, f fence.Fence, leaderKey string, term int64, id string, rev int64) error {
	if !strings.HasPrefix(se.Reason, "a condition of the write") {
		return fmt.Errorf("reconcile roles of %s: %w", id, se)
	}
	resp, err := r.Etcd.Txn(ctx).Then(
		clientv3.OpGet(leaderKey, clientv3.WithKeysOnly()),
		clientv3.OpGet(keys.MembershipPending, clientv3.WithKeysOnly()),
		clientv3.OpGet(keys.Node(id), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return fmt.Errorf("reconcile roles of %s: %w", id, se)
	}
	get := func(i int) (create, mod int64, ok bool) {
		kvs := resp.Responses[i].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			return 0, 0, false
		}
		return kvs[0].CreateRevision, kvs[0].ModRevision, true
	}
	if create, _, ok := get(0); !ok || create != term {
		r.Log.Warn("term lost during a write", "term", term)
		r.Lead.Lost()
		return fmt.Errorf("%w: this curator's term %d ended during the write; retry, and re-acquire the lease at the new leader", rpcerr.NotLeader, term)
	}
	if _, _, ok := get(1); ok {
		return fmt.Errorf("%w: a membership change is in flight: read members again once it finished", rpcerr.ChangePending)
	}
	if _, mod, ok := get(2); !ok {
		return fmt.Errorf("%w: node %s no longer exists (it was at revision %d): read nodes again", errStale, id, rev)
	} else if mod != rev {
		return fmt.Errorf("%w: node %s changed since revision %d (it is at revision %d now): read it again", errStale, id, rev, mod)
	}
	return fmt.Errorf("reconcile roles of %s: %w", id, se)
}
