package reconciler

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	fencev1 "curia.dev/gen/curia/fence/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/fence"
	"curia.dev/platform/rpcerr"
	"curia.dev/services/reconciler/internal/plan"
)

// pass observes, plans and, when this replica holds the lease and is not
// paused, takes the one planned action. It reports whether it acted, and
// when the plan for what it observed changes by time alone (plan.Recheck).
// That instant is zero when no deadline is ahead, on a standby (which does
// not plan), and after an action (the next pass runs at once and plans
// anew).
func (r *Reconciler) pass(ctx context.Context) (acted bool, recheck time.Time) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseTTL)
	defer cancel()
	if r.lease.current() == nil {
		r.finish(reconcilerv1.PassResult_PASS_RESULT_STANDBY, "", nil, nil)
		return false, time.Time{}
	}
	begun := time.Now()
	snap, err := r.observe(ctx)
	if err != nil {
		r.log.Warn("pass failed: cannot observe", "err", err)
		r.finish(reconcilerv1.PassResult_PASS_RESULT_ERROR, err.Error(), nil, nil)
		return false, time.Time{}
	}
	pc := r.cfg.planConfig(snap.config)
	a := plan.Plan(snap.observed, pc)
	recheck = plan.Recheck(snap.observed, pc)
	r.metrics.pass.Observe(time.Since(begun).Seconds())
	r.metrics.observed.Set(float64(len(snap.observed.Nodes)))
	r.noteDrift(a)
	switch a.Kind {
	case plan.None:
		result := reconcilerv1.PassResult_PASS_RESULT_WAITING
		if a.Converged() {
			result = reconcilerv1.PassResult_PASS_RESULT_CONVERGED
		}
		r.finish(result, a.Reason, &a, nil)
		return false, recheck
	case plan.Refuse:
		r.refused(a)
		// The member that answered may be the one in question (a deleted
		// node's): ask another consensus service next time.
		r.nextConsensus()
		return false, recheck
	}
	if paused, why := r.paused(); paused {
		r.finish(reconcilerv1.PassResult_PASS_RESULT_PAUSED, "paused ("+why+"): would "+a.String(), &a, nil)
		return false, recheck
	}
	if cc := snap.config; cc.GetPaused() {
		r.finish(reconcilerv1.PassResult_PASS_RESULT_PAUSED, "paused cluster-wide ("+cc.GetPauseReason()+"): would "+a.String(), &a, nil)
		return false, recheck
	}
	failpoint.Hold("before-act")
	r.snapshotBefore(ctx, a)
	// The lease may have ended while we observed (or the snapshot was
	// taken): stop within this pass.
	lease := r.lease.current()
	if lease == nil {
		r.finish(reconcilerv1.PassResult_PASS_RESULT_STANDBY, "lost the lease before acting", &a, nil)
		return false, time.Time{} // a standby waits for the lease, not for the plan
	}
	failpoint.Hold("before-call")
	if err := r.act(ctx, snap, a, r.lease.fence(lease, a.Epoch)); err != nil {
		r.log.Warn("action failed", "action", a.String(), "err", err)
		r.metrics.actions.WithLabelValues(a.Kind.String(), "failed").Inc()
		r.finish(reconcilerv1.PassResult_PASS_RESULT_ERROR, err.Error(), &a, nil)
		r.afterFailure(err)
		return false, recheck
	}
	r.log.Info("acted", "action", a.Kind.String(), "member", fmt.Sprintf("%x", a.MemberID), "node", a.NodeID, "epoch", a.Epoch, "reason", a.Reason)
	r.metrics.actions.WithLabelValues(a.Kind.String(), "ok").Inc()
	r.finish(reconcilerv1.PassResult_PASS_RESULT_ACTED, a.String(), &a, &a)
	return true, time.Time{}
}

// snapshotBefore asks the curators for an etcd snapshot before an action
// that changes etcd membership (add a learner, promote, remove a member),
// so that the state before every change made by automation can be
// restored. It is best effort: it waits at most SnapshotTimeout, and at
// most half of what is left of the pass, and whatever the answer, the
// change goes on — a snapshot never blocks a repair; a failure is logged
// and counted (curia_reconciler_snapshots_before_change_total{result=
// "failed"}). Whether a recent snapshot will do is the curator's decision
// (TakeSnapshot's rule): a promotion right after its learner's addition
// reuses the addition's.
func (r *Reconciler) snapshotBefore(ctx context.Context, a plan.Action) {
	change := membershipChange(a)
	if change == "" || r.cfg.SnapshotTimeout <= 0 {
		return
	}
	wait := r.cfg.SnapshotTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)/2)
	}
	sctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	begun := time.Now()
	resp, err := curatorv1.NewManagementClient(r.curator).TakeSnapshot(sctx, &curatorv1.TakeSnapshotRequest{
		BeforeMembershipChange: change, Reason: audit.Truncate("reconciler: "+a.Reason, 1024),
	})
	switch {
	case rpcerr.Is(err, rpcerr.SnapshotsOff):
		r.metrics.snapshots.WithLabelValues("off").Inc()
		r.log.Debug("no snapshot before a membership change: the curators take none", "change", change)
	case err != nil:
		r.metrics.snapshots.WithLabelValues("failed").Inc()
		r.log.Warn("no snapshot before a membership change; changing membership anyway", "change", change, "waited", time.Since(begun).Round(time.Millisecond), "err", err)
	case resp.GetReused():
		r.metrics.snapshots.WithLabelValues("reused").Inc()
		r.log.Info("snapshot before a membership change: a recent one", "change", change, "snapshot", resp.GetSnapshot().GetName())
	default:
		r.metrics.snapshots.WithLabelValues("taken").Inc()
		r.log.Info("snapshot before a membership change", "change", change, "snapshot", resp.GetSnapshot().GetName(), "took", time.Since(begun).Round(time.Millisecond))
	}
}

// membershipChange is the etcd membership change a makes, in words; ""
// for an action that changes none (a role write, AddNode of a member that
// is one already).
func membershipChange(a plan.Action) string {
	node := a.NodeID
	if node == "" {
		node = "none"
	}
	switch a.Kind {
	case plan.RemoveMember:
		return fmt.Sprintf("remove member %x (node %s)", a.MemberID, node)
	case plan.Promote:
		return fmt.Sprintf("promote learner %x (node %s)", a.MemberID, node)
	case plan.AddMember:
		return fmt.Sprintf("add node %s as a learner (peer %s)", node, a.PeerURL)
	}
	return ""
}

// afterFailure reacts to why an action was refused, by its reason rather
// than its text: a stale lease or leader term ends this replica's turn at
// once (the keeper acquires anew); a stale epoch, revision or record means
// the snapshot is outdated, so the next pass runs now; a retry delay (etcd's
// reconfiguration window, a learner catching up, a change in flight) is
// when the next pass runs, and no pass runs before it (runPasses).
func (r *Reconciler) afterFailure(err error) {
	switch {
	case rpcerr.Is(err, rpcerr.FenceStale):
		switch rpcerr.Meta(err, "part") {
		case fence.PartLease, fence.PartLeader:
			r.lease.drop("the lease's fence went stale: " + err.Error())
			return
		}
		r.kick()
	case rpcerr.Is(err, rpcerr.Conflict):
		r.kick()
	}
	if d, ok := rpcerr.RetryDelay(err); ok && d < r.cfg.Tick {
		r.mu.Lock()
		r.quietUntil = time.Now().Add(d)
		r.mu.Unlock()
		time.AfterFunc(d, r.kick)
	}
}

// act takes one action under fence (the lease's fence at the plan's epoch).
// Every call is refused by its resource if the fence or the snapshot went
// stale; the next pass then plans anew.
func (r *Reconciler) act(ctx context.Context, s *snapshot, a plan.Action, f *fencev1.Fence) error {
	reason := "reconciler: " + a.Reason
	switch a.Kind {
	case plan.RemoveMember:
		req := &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_MemberId{MemberId: a.MemberID}, Fence: f, Reason: reason}
		if a.NodeAbsent && !failpoint.Mutated(failpoint.NoAbsenceProof) {
			// The proof: consensus removes the member only if the node
			// does not exist, checked in its fenced transaction.
			req.AbsentNodeId = a.NodeID
		}
		req.UnstartedOnly = a.Unstarted
		_, err := r.members().RemoveMember(ctx, req)
		return err
	case plan.Promote:
		_, err := r.members().PromoteMember(ctx, &consensusv1.PromoteMemberRequest{MemberId: a.MemberID, Fence: f})
		return err
	case plan.AddRole, plan.AddMember:
		// AddRole: the node is a member already; AddNode changes nothing
		// and answers with its join parameters. AddMember: AddNode adds
		// the node as a learner, and the role write that follows is
		// fenced on the epoch that addition left (this replica made the
		// change; anything since fails the fence). A crash in between
		// leaves a member without the role, which rule 2 repairs.
		peerURL := s.peerURLs[a.MemberID]
		if a.Kind == plan.AddMember {
			peerURL = a.PeerURL
		}
		added, err := r.members().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: a.NodeID, PeerUrl: peerURL, Fence: f})
		if err != nil {
			return fmt.Errorf("add %s to etcd, or read its join parameters: %w", a.NodeID, err)
		}
		if a.Kind == plan.AddMember {
			failpoint.Crash("after-add-member")
		}
		roleFence := f
		if e := added.GetMembershipEpoch(); e != 0 && e != f.GetMembershipEpoch() {
			roleFence = proto.Clone(f).(*fencev1.Fence)
			roleFence.MembershipEpoch = e
		}
		_, err = r.reconciliation().ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{
			Fence: roleFence, NodeId: a.NodeID, NodeRevision: a.NodeRevision,
			Change: &curatorv1.ReconcileNodeRolesRequest_AddConsensusMember{AddConsensusMember: added.GetJoin()},
			Reason: reason,
		})
		return err
	case plan.RemoveRole:
		_, err := r.reconciliation().ReconcileNodeRoles(ctx, &curatorv1.ReconcileNodeRolesRequest{
			Fence: f, NodeId: a.NodeID, NodeRevision: a.NodeRevision,
			Change: &curatorv1.ReconcileNodeRolesRequest_RemoveConsensusMember{RemoveConsensusMember: true},
			Reason: reason,
		})
		return err
	}
	return fmt.Errorf("no way to act on %v", a)
}

// actionKinds are the planner's kinds as the API names them: the one
// place the two meet.
var actionKinds = map[plan.Kind]reconcilerv1.ActionKind{
	plan.None:         reconcilerv1.ActionKind_ACTION_KIND_NONE,
	plan.Refuse:       reconcilerv1.ActionKind_ACTION_KIND_REFUSE,
	plan.RemoveMember: reconcilerv1.ActionKind_ACTION_KIND_REMOVE_MEMBER,
	plan.AddRole:      reconcilerv1.ActionKind_ACTION_KIND_ADD_ROLE,
	plan.RemoveRole:   reconcilerv1.ActionKind_ACTION_KIND_REMOVE_ROLE,
	plan.Promote:      reconcilerv1.ActionKind_ACTION_KIND_PROMOTE,
	plan.AddMember:    reconcilerv1.ActionKind_ACTION_KIND_ADD_MEMBER,
}

func toProto(a *plan.Action) *reconcilerv1.Action {
	if a == nil {
		return nil
	}
	return &reconcilerv1.Action{Kind: actionKinds[a.Kind], MemberId: a.MemberID, NodeId: a.NodeID, NodeRevision: a.NodeRevision, MembershipEpoch: a.Epoch, Reason: a.Reason}
}

// finish records a pass: how it ended (and that in words), what was
// planned, what was done.
func (r *Reconciler) finish(result reconcilerv1.PassResult, detail string, planned, done *plan.Action) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status.Passes++
	r.status.LastPass = timestamppb.New(now)
	r.status.LastResult = result
	r.status.LastResultDetail = detail
	if planned != nil {
		r.status.Planned = toProto(planned)
	}
	if done != nil {
		r.status.Actions++
		r.status.LastAction = toProto(done)
		r.status.LastActionTime = timestamppb.New(now)
	}
	kind := "none"
	if planned != nil {
		kind = planned.Kind.String()
	}
	r.metrics.passes.WithLabelValues(kind).Inc()
	r.metrics.results.WithLabelValues(passResultLabel(result)).Inc()
}

// maxRefusals is how many refusals the status keeps.
const maxRefusals = 10

// refused records a refusal in the status (the last few), the log and the
// metrics.
func (r *Reconciler) refused(a plan.Action) {
	r.log.Warn("refusing to act", "reason", a.Reason)
	r.metrics.refusals.Inc()
	r.mu.Lock()
	ref := &reconcilerv1.Refusal{Time: timestamppb.Now(), Reason: a.Reason, MemberId: a.MemberID, NodeId: a.NodeID}
	if a.Refused != plan.None {
		ref.RefusedKind = actionKinds[a.Refused]
	}
	r.status.Refusals = append(r.status.Refusals, ref)
	if n := len(r.status.Refusals); n > maxRefusals {
		r.status.Refusals = r.status.Refusals[n-maxRefusals:]
	}
	r.mu.Unlock()
	r.finish(reconcilerv1.PassResult_PASS_RESULT_REFUSED, a.Reason, &a, nil)
}

// noteDrift measures convergence time: from the first pass that found
// something to do to the first that found roles and membership agreeing.
func (r *Reconciler) noteDrift(a plan.Action) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case a.Converged() && !r.driftSince.IsZero():
		r.metrics.convergence.Observe(time.Since(r.driftSince).Seconds())
		r.driftSince = time.Time{}
	case a.Kind != plan.None && r.driftSince.IsZero():
		r.driftSince = time.Now()
	}
}

func (r *Reconciler) setRole(role reconcilerv1.Role, holder string, l *curatorv1.Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status.Role = role
	r.status.LeaseHolder = holder
	r.status.Fence = l.GetFence()
	r.status.LeaseExpires = l.GetExpires()
	active := 0.0
	if role == reconcilerv1.Role_ROLE_ACTIVE {
		active = 1
	}
	r.metrics.active.Set(active)
}

func (r *Reconciler) paused() (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status.Paused, r.status.PauseReason
}
