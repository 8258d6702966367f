package consensus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	fencev1 "curia.dev/gen/curia/fence/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/crl"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/records"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
)

// change is one fenced membership change in progress: who asks, under which
// fence, against which snapshot. It holds this process's change lock until
// end.
type change struct {
	x      *server
	cli    *clientv3.Client
	actor  pki.Principal
	fence  fence.Fence
	op     consensusv1.MembershipOperation
	action string
	snap   *membership
	unlock func()
}

// begin checks the caller's fence, takes the change lock and reads
// membership at the caller's epoch. It refuses while another change is
// pending anywhere in the cluster. The caller must call end.
func (x *server) begin(ctx context.Context, pf *fencev1.Fence, op consensusv1.MembershipOperation, action string) (*change, error) {
	actor, _ := rpc.PrincipalFromContext(ctx)
	f := fence.FromProto(pf)
	if err := checkFence(actor, f); err != nil {
		return nil, err
	}
	_, cli, err := x.s.member.running()
	if err != nil {
		return nil, err
	}
	// A stale caller learns that first, before any other answer, and even
	// when the call would change nothing (an idempotent repeat).
	if _, err := fence.Apply(ctx, cli, f, nil); err != nil {
		return nil, fmt.Errorf("%s: %w", action, err)
	}
	unlock, err := x.s.member.lockChanges(ctx)
	if err != nil {
		return nil, err
	}
	c := &change{x: x, cli: cli, actor: actor, fence: f, op: op, action: action, unlock: unlock}
	if err := c.read(ctx); err != nil {
		unlock()
		return nil, err
	}
	return c, nil
}

// read takes the snapshot the change is decided on: membership at exactly
// the caller's epoch (the commit compares that epoch again), with no change
// pending.
func (c *change) read(ctx context.Context) error {
	snap, err := readMembership(ctx, c.cli)
	if err != nil {
		return err
	}
	c.x.s.member.rememberEndpoints(snap.members)
	if snap.pending != nil && !failpoint.Mutated(failpoint.NoPending) {
		return fmt.Errorf("%s: %w", c.action, c.x.s.blockedBy(ctx, c.cli, snap.pending))
	}
	if snap.epoch != c.fence.Epoch {
		return fmt.Errorf("%s: %w", c.action, &fence.StaleError{Part: fence.PartEpoch, Reason: fmt.Sprintf("membership epoch is %d, the caller planned at %d: membership changed since; read members again", snap.epoch, c.fence.Epoch)})
	}
	c.snap = snap
	return nil
}

func (c *change) end() { c.unlock() }

// checkFence enforces the shape of a fence per caller (DESIGN §4): the
// curator fences on its leader key; the reconciler on the leader key that
// granted its lease and on its lease; both on the membership epoch of the
// member list they planned from. Keys elsewhere are refused: a fence on a
// key that never goes away would fence nothing.
func checkFence(actor pki.Principal, f fence.Fence) error {
	if err := f.Validate(keys.LeaderElection, keys.LeasesPrefix); err != nil {
		return fmt.Errorf("%w: %v", errBadRequest, err)
	}
	if err := f.RequireEpoch(); err != nil {
		return fmt.Errorf("%w: %v", errBadRequest, err)
	}
	switch actor.Kind {
	case pki.KindCurator:
		if !f.HasKeyUnder(keys.LeaderElection) {
			return fmt.Errorf("%w: the curator's fence must include its leader key (under %s)", errBadRequest, keys.LeaderElection)
		}
	case pki.KindReconciler:
		if !f.HasKeyUnder(keys.LeaderElection) || !f.HasKey(keys.Lease(keys.ReconcilerLease)) {
			return fmt.Errorf("%w: the reconciler's fence must include the leader key that granted its lease (under %s) and the lease %s", errBadRequest, keys.LeaderElection, keys.Lease(keys.ReconcilerLease))
		}
	}
	return nil
}

// commit is the fenced transaction that starts a real change: it checks
// the fence and the caller's epoch (and extra, e.g. a proof of absence),
// and only if no change is pending creates the pending change record,
// bumps the epoch, records the intent in the audit log and applies ops, all
// or nothing.
func (c *change) commit(ctx context.Context, nodeID string, memberID uint64, peerURL, reason string, extra []clientv3.Cmp, ops ...clientv3.Op) (*pendingChange, error) {
	failpoint.Hold("before-commit")
	s := c.x.s
	recorder := s.recorder()
	p := &consensusv1.PendingChange{
		Id:         newChangeID(),
		Operation:  c.op,
		MemberId:   memberID,
		NodeId:     nodeID,
		PeerUrl:    peerURL,
		Actor:      c.actor.String(),
		Fence:      c.fence.Strings(),
		RecordedBy: recorder,
		Started:    timestamppb.Now(),
		Deadline:   durationpb.New(s.cfg.MemberCallTimeout),
	}
	val, err := records.EncodePendingChange(p)
	if err != nil {
		return nil, err
	}
	noPending := failpoint.Mutated(failpoint.NoPending)
	if !noPending {
		ops = append(ops, clientv3.OpPut(keys.MembershipPending, string(val)))
	}
	ops = append(ops, fence.BumpEpoch(recorder), audit.Put(&auditv1.Event{
		Actor:      c.actor.String(),
		RecordedBy: recorder,
		Action:     auditAction(c.op),
		NodeId:     nodeID,
		MemberId:   memberID,
		Fence:      c.fence.Strings(),
		Reason:     reason,
		ChangeId:   p.Id,
	}))
	if !noPending {
		extra = append(extra, clientv3.Compare(clientv3.CreateRevision(keys.MembershipPending), "=", 0))
	}
	// The call's deadline counts from before the commit is sent: the
	// record may be applied (and watched by a resolver) long before this
	// process hears so.
	sent := time.Now()
	resp, err := fence.Apply(ctx, c.cli, c.fence, extra, ops...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.action, c.whyNotCommitted(ctx, err))
	}
	failpoint.Hold("committed")
	if failpoint.Mutated(failpoint.NoRecorderDeadline) {
		sent = time.Now()
	}
	s.log.Info("membership change started", "change", p.Id, "action", c.action, "node", nodeID, "member", types.ID(memberID).String(), "actor", c.actor.String(), "fence", c.fence.String(), "reason", reason)
	if noPending {
		// No record: the finish's guard expects none.
		return &pendingChange{PendingChange: p, sent: sent}, nil
	}
	return &pendingChange{PendingChange: p, createRev: resp.Header.Revision, sent: sent}, nil
}

// whyNotCommitted explains a failed commit whose fence still held: another
// change started meanwhile, or a proof in extra failed (the node exists).
func (c *change) whyNotCommitted(ctx context.Context, err error) error {
	var se *fence.StaleError
	if !errors.As(err, &se) || !strings.HasPrefix(se.Reason, "a condition of the write") {
		return err
	}
	resp, rerr := c.cli.Get(ctx, keys.MembershipPending)
	if rerr == nil && len(resp.Kvs) > 0 {
		p := decodePending(resp.Kvs[0].Value, resp.Kvs[0].CreateRevision, resp.Kvs[0].ModRevision)
		return fmt.Errorf("%w: %s", errChangePending, p)
	}
	return err
}

// carryOut makes the etcd member call of a started change under its
// deadline, then finishes the change: APPLIED when the call succeeded or
// the live member list shows it done, NOT_APPLIED when etcd refused it (or
// the call was never made). When the outcome cannot be known, the record
// stays: whoever comes next resolves it from the member list. It returns
// the epoch after the finish and the call's error.
//
// The call is made only before the deadline, counted from before the
// commit was sent, and only while the record is still there (read from
// etcd, not from this process's memory or clock, which a pause stops): a
// resolver finishes a record only after watching it for twice the
// deadline, so a recorder that was paused anywhere past its commit never
// calls after a resolver decided.
func (c *change) carryOut(p *pendingChange, call func(context.Context) error) (int64, error) {
	failpoint.Hold("after-commit")
	deadline := p.sent.Add(p.deadline())
	if failpoint.Mutated(failpoint.NoRecorderDeadline) {
		deadline = time.Now().Add(p.deadline())
	}
	var callErr error
	if time.Now().Before(deadline) {
		// Not the caller's context: a client that hangs up must not leave
		// the change half done.
		mctx, cancel := context.WithDeadline(context.Background(), deadline)
		callErr = c.stillPending(mctx, p)
		if callErr == nil {
			callErr = call(mctx)
		}
		cancel()
	} else {
		callErr = fmt.Errorf("%w: its deadline (%v from the commit) passed before it could be made", errNeverCalled, p.deadline())
	}
	if errors.Is(callErr, errFinishedElsewhere) {
		c.x.s.log.Warn("membership change resolved by another process before its call; not made", "change", p.Id, "action", c.action)
		return 0, fmt.Errorf("%s: %w: %s was resolved by another process before this one could make its etcd call (the call was not made); read members again", c.action, errFinishedElsewhere, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
	defer cancel()
	cli, done, err := c.finishClient(p)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %v; it stays pending and is resolved from the member list within %v", errOutcomeUnknown, p, err, c.x.s.resolveAfter(p))
	}
	defer done()
	outcome := auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED
	reason := "the etcd member call succeeded"
	if callErr != nil {
		var list *clientv3.MemberListResponse
		err := untilFinished(ctx, func() (err error) {
			list, err = cli.MemberList(ctx)
			return err
		})
		switch {
		case err == nil && p.applied(list.Members):
			reason = fmt.Sprintf("the member call failed (%v), but the member list shows the change done", callErr)
		case err == nil && definitelyNotApplied(callErr):
			outcome = auditv1.ChangeOutcome_CHANGE_OUTCOME_NOT_APPLIED
			reason = fmt.Sprintf("etcd refused the change: %v", callErr)
		default:
			c.x.s.log.Warn("membership change outcome unknown; it stays pending", "change", p.Id, "action", c.action, "err", callErr)
			return 0, fmt.Errorf("%w: %s: %v; it stays pending and is resolved from the member list within %v", errOutcomeUnknown, p, callErr, c.x.s.resolveAfter(p))
		}
	}
	var epoch int64
	err = untilFinished(ctx, func() (err error) {
		epoch, err = finish(ctx, cli, p, outcome, c.x.s.recorder(), reason)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", c.action, err)
	}
	c.x.s.log.Info("membership change finished", "change", p.Id, "action", c.action, "outcome", outcome.String(), "epoch", epoch)
	if outcome == auditv1.ChangeOutcome_CHANGE_OUTCOME_NOT_APPLIED {
		return epoch, callErr
	}
	return epoch, nil
}

func (x *server) AddNode(ctx context.Context, req *consensusv1.AddNodeRequest) (*consensusv1.AddNodeResponse, error) {
	resp, err := x.addNode(ctx, req)
	return resp, err
}

// addNode: the node id, the https://host:port peer URL and a fence are the
// request's contract; the fence's shape and freshness are checked here.
func (x *server) addNode(ctx context.Context, req *consensusv1.AddNodeRequest) (*consensusv1.AddNodeResponse, error) {
	c, err := x.begin(ctx, req.GetFence(), consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_ADD, "member.add")
	if err != nil {
		return nil, err
	}
	defer c.end()

	if resp, err := c.existing(ctx, req.GetNodeId()); resp != nil || err != nil {
		return resp, err
	}
	for _, m := range c.snap.members {
		if slices.Contains(m.PeerURLs, req.GetPeerUrl()) {
			return nil, fmt.Errorf("%w: peer URL %s is already used by member %s (node %q); pick another address or remove that member", errPeerURLTaken, req.GetPeerUrl(), types.ID(m.ID), c.snap.nodeID(m))
		}
	}
	if learners := learners(c.snap.members); len(learners) > 0 {
		return nil, fmt.Errorf("%w: add %s: member %s (node %q) is still a learner and etcd allows one learner at a time: wait until it is promoted, or remove it", errLearnerPending, req.GetNodeId(), types.ID(learners[0].ID), c.snap.nodeID(learners[0]))
	}

	// The pending record, the joining record that names the learner and
	// the intent land together, fenced; the member call follows.
	p, err := c.commit(ctx, req.GetNodeId(), 0, req.GetPeerUrl(), "add node as learner with peer URL "+req.GetPeerUrl(), nil,
		clientv3.OpPut(keys.Joining(req.GetPeerUrl()), req.GetNodeId()))
	if err != nil {
		return nil, err
	}
	var added *clientv3.MemberAddResponse
	epoch, err := c.carryOut(p, func(ctx context.Context) (err error) {
		added, err = c.cli.MemberAddAsLearner(ctx, []string{req.GetPeerUrl()})
		if err == nil {
			p.MemberId = added.Member.ID // the outcome names the new member
		}
		return err
	})
	if errors.Is(err, rpctypes.ErrMemberNotFound) {
		// etcd derives a new member's id from its peer URLs and the
		// current second: re-adding the peer URL of a member removed in the
		// same second yields that removed id, which etcd refuses.
		return nil, rpcerr.RetryAfter(fmt.Errorf("%w: add learner %s: etcd gave the new member the id of a member removed a moment ago with the same peer URL (ids depend on the URL and the second); retry in a second: %v", errTryAgain, req.GetNodeId(), err), time.Second)
	}
	if err != nil {
		return nil, explain(err, "add learner "+req.GetNodeId())
	}
	if added == nil {
		// The call failed, but the member list showed the learner added:
		// answer as for an existing member.
		if err := c.reread(ctx); err != nil {
			return nil, err
		}
		resp, err := c.existing(ctx, req.GetNodeId())
		if resp == nil && err == nil {
			err = fmt.Errorf("%w: the learner for %s was added but is not in the member list now", errCannotConfirm, req.GetNodeId())
		}
		return resp, err
	}
	snap := &membership{members: added.Members, joining: map[string]string{req.GetPeerUrl(): req.GetNodeId()}}
	crl, err := x.crl(ctx, c.cli)
	if err != nil {
		return nil, err
	}
	return &consensusv1.AddNodeResponse{
		Join:            snap.joinParameters(added.Member.ID, req.GetPeerUrl(), x.s.creds.CAPEM, crl),
		MembershipEpoch: epoch,
	}, nil
}

// existing answers AddNode for a node that is a member already: the same
// join parameters, no second member, no epoch bump.
func (c *change) existing(ctx context.Context, nodeID string) (*consensusv1.AddNodeResponse, error) {
	m := c.snap.byNode(nodeID)
	if m == nil {
		return nil, nil
	}
	crl, err := c.x.crl(ctx, c.cli)
	if err != nil {
		return nil, err
	}
	peerURL := ""
	if len(m.PeerURLs) > 0 {
		peerURL = m.PeerURLs[0]
	}
	return &consensusv1.AddNodeResponse{
		Join:            c.snap.joinParameters(m.ID, peerURL, c.x.s.creds.CAPEM, crl),
		AlreadyMember:   true,
		MembershipEpoch: c.snap.epoch,
	}, nil
}

// reread reads membership again after this change finished.
func (c *change) reread(ctx context.Context) error {
	snap, err := readMembership(ctx, c.cli)
	if err != nil {
		return err
	}
	c.snap = snap
	return nil
}

// crl is the cluster's current revocation list, handed to joining members:
// the one in etcd or, newer, the one this process knows (a cluster that has
// revoked nothing yet has only the deployment's).
func (x *server) crl(ctx context.Context, cli *clientv3.Client) ([]byte, error) {
	resp, err := cli.Get(ctx, keys.CRL)
	if err != nil {
		return nil, fmt.Errorf("read CRL: %w", err)
	}
	if len(resp.Kvs) > 0 {
		if _, err := x.s.crl.Set(resp.Kvs[0].Value); err != nil && !errors.Is(err, crl.ErrOlder) {
			return nil, fmt.Errorf("the CRL in etcd: %w", err)
		}
	}
	pem, _, _, _ := x.s.crl.Current()
	return pem, nil
}

func learners(ms []*etcdMember) []*etcdMember {
	var out []*etcdMember
	for _, m := range ms {
		if m.IsLearner {
			out = append(out, m)
		}
	}
	return out
}

func (x *server) PromoteMember(ctx context.Context, req *consensusv1.PromoteMemberRequest) (*consensusv1.PromoteMemberResponse, error) {
	resp, err := x.promote(ctx, req)
	return resp, err
}

func (x *server) promote(ctx context.Context, req *consensusv1.PromoteMemberRequest) (*consensusv1.PromoteMemberResponse, error) {
	c, err := x.begin(ctx, req.GetFence(), consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_PROMOTE, "member.promote")
	if err != nil {
		return nil, err
	}
	defer c.end()

	m := c.snap.byID(req.GetMemberId())
	if m == nil {
		return nil, fmt.Errorf("%w: promote: member %s is not in the cluster", errNotFound, types.ID(req.GetMemberId()))
	}
	node := c.snap.nodeID(m)
	if !m.IsLearner {
		return &consensusv1.PromoteMemberResponse{AlreadyVoter: true, MembershipEpoch: c.snap.epoch}, nil
	}
	// Ask before starting the change, so that polling a learner that is
	// not ready yet does not move the epoch and invalidate everyone's
	// snapshot. etcd checks again.
	if err := c.learnerReady(ctx, m); err != nil {
		return nil, err
	}
	p, err := c.commit(ctx, node, m.ID, firstURL(m.PeerURLs), "promote learner to voter", nil)
	if err != nil {
		return nil, err
	}
	epoch, err := c.carryOut(p, func(ctx context.Context) error {
		_, err := c.cli.MemberPromote(ctx, m.ID)
		return err
	})
	if err != nil {
		return nil, explain(err, fmt.Sprintf("promote member %s (node %q)", types.ID(m.ID), node))
	}
	return &consensusv1.PromoteMemberResponse{MembershipEpoch: epoch}, nil
}

func firstURL(urls []string) string {
	if len(urls) == 0 {
		return ""
	}
	return urls[0]
}

// learnerReady approximates etcd's own readiness rule (the learner's log is
// within 10% of the leader's) from the members' status.
func (c *change) learnerReady(ctx context.Context, m *etcdMember) error {
	return learnerCaughtUp(ctx, c.cli, c.snap, m, c.x.s.cfg.HealthTimeout)
}

func learnerCaughtUp(ctx context.Context, cli *clientv3.Client, snap *membership, m *etcdMember, timeout time.Duration) error {
	node := snap.nodeID(m)
	if m.Name == "" || len(m.ClientURLs) == 0 {
		return fmt.Errorf("%w: learner %s (node %q) has not started yet: start its consensus service with the join parameters, then promote", errLearnerPending, types.ID(m.ID), node)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ls, err := statusAt(pctx, cli, m.ClientURLs[0])
	if err != nil {
		return rpcerr.RetryAfter(fmt.Errorf("%w: learner %s (node %q) does not answer (%v): it cannot be promoted until it runs", errLearnerPending, types.ID(m.ID), node, err), time.Second)
	}
	leader := snap.byID(ls.Leader)
	if leader == nil || len(leader.ClientURLs) == 0 {
		return rpcerr.RetryAfter(fmt.Errorf("%w: learner %s (node %q) knows no leader yet", errLearnerPending, types.ID(m.ID), node), time.Second)
	}
	lead, err := statusAt(pctx, cli, leader.ClientURLs[0])
	if err != nil {
		return fmt.Errorf("ask leader %s for its raft index: %w", types.ID(leader.ID), err)
	}
	if float64(ls.RaftIndex) < 0.9*float64(lead.RaftIndex) {
		return rpcerr.RetryAfter(fmt.Errorf("%w: learner %s (node %q) is at raft index %d of the leader's %d: not caught up yet, retry later", errLearnerPending, types.ID(m.ID), node, ls.RaftIndex, lead.RaftIndex), 500*time.Millisecond)
	}
	return nil
}

func (x *server) RemoveMember(ctx context.Context, req *consensusv1.RemoveMemberRequest) (*consensusv1.RemoveMemberResponse, error) {
	resp, err := x.remove(ctx, req)
	return resp, err
}

// remove: the target (a member id or a node id), a fence, a reason of at
// most 1024 bytes and an absent_node_id without '/' are the request's
// contract; that absent_node_id names the member's node is checked here.
func (x *server) remove(ctx context.Context, req *consensusv1.RemoveMemberRequest) (*consensusv1.RemoveMemberResponse, error) {
	absent := req.GetAbsentNodeId()
	c, err := x.begin(ctx, req.GetFence(), consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_REMOVE, "member.remove")
	if err != nil {
		return nil, err
	}
	defer c.end()

	var m *etcdMember
	if id := req.GetMemberId(); id != 0 {
		m = c.snap.byID(id)
	} else {
		m = c.snap.byNode(req.GetNodeId())
	}
	if m == nil {
		// Already gone: a retry after a crash must finish, not fail.
		return &consensusv1.RemoveMemberResponse{AlreadyAbsent: true, MembershipEpoch: c.snap.epoch}, nil
	}
	node := c.snap.nodeID(m)
	var extra []clientv3.Cmp
	reason := "remove member"
	if why := req.GetReason(); why != "" {
		reason += ": " + why
	}
	if absent != "" {
		if node != absent {
			return nil, fmt.Errorf("%w: absent_node_id %s: member %s is node %q's, not that node's", errBadRequest, absent, types.ID(m.ID), node)
		}
		// The proof of absence, checked in the fenced transaction: a stale
		// view of the registry never removes a live member.
		extra = append(extra, clientv3.Compare(clientv3.CreateRevision(keys.Node(absent)), "=", 0))
		reason += " (proven: node " + absent + " does not exist)"
	}
	unstartedOnly := req.GetUnstartedOnly() && !failpoint.Mutated(failpoint.NoUnstartedCheck)
	if unstartedOnly && m.Name != "" {
		return nil, startedMeanwhile(m)
	}
	var transferee *etcdMember
	isLeader := false
	if !m.IsLearner {
		if transferee, isLeader, err = c.quorumGuard(ctx, m); err != nil {
			return nil, err
		}
	}
	p, err := c.commit(ctx, node, m.ID, firstURL(m.PeerURLs), reason, extra)
	if err != nil {
		if absent != "" {
			err = c.whyNotAbsent(ctx, absent, err)
		}
		return nil, err
	}
	// Leadership moves only now, after the fenced start: a stale or
	// refused caller never moves it.
	moved := false
	epoch, err := c.carryOut(p, func(ctx context.Context) error {
		if isLeader {
			if err := c.moveLeader(ctx, m, transferee); err != nil {
				return fmt.Errorf("%w: %v", errNeverCalled, err)
			}
			moved = true
		}
		if unstartedOnly {
			// Starting moves no epoch: look again, as late as possible.
			list, err := c.cli.MemberList(ctx)
			if err != nil {
				return fmt.Errorf("%w: read the member list to see %s has not started: %v", errNeverCalled, types.ID(m.ID), err)
			}
			for _, now := range list.Members {
				if now.ID == m.ID && now.Name != "" {
					return fmt.Errorf("%w: %w", errNeverCalled, startedMeanwhile(now))
				}
			}
		}
		_, err := c.cli.MemberRemove(ctx, m.ID)
		return err
	})
	if err != nil {
		return nil, explain(err, fmt.Sprintf("remove member %s (node %q)", types.ID(m.ID), node))
	}
	return &consensusv1.RemoveMemberResponse{MemberId: m.ID, MovedLeadership: moved, MembershipEpoch: epoch}, nil
}

// startedMeanwhile refuses a removal asked for a member that had not
// started (unstarted_only) of a member that has.
func startedMeanwhile(m *etcdMember) error {
	return &fence.StaleError{Part: fence.PartCondition, Reason: fmt.Sprintf("member %s started as %q since the caller saw it unstarted: it stays; read members again", types.ID(m.ID), m.Name)}
}

// stillPending checks, in etcd, that p's record is still the pending one
// right before its member call: a resolver that finished it decided the
// change's outcome from a member list without it.
func (c *change) stillPending(ctx context.Context, p *pendingChange) error {
	if p.createRev == 0 || failpoint.Mutated(failpoint.NoRecorderDeadline) {
		return nil // no record (the no-pending mutation)
	}
	resp, err := c.cli.Get(ctx, keys.MembershipPending)
	if err != nil {
		return fmt.Errorf("%w: read the pending record before the call: %v", errNeverCalled, err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != p.createRev {
		return errFinishedElsewhere
	}
	return nil
}

// untilFinished retries f until it succeeds, the change turns out finished
// elsewhere, or ctx ends: right after a membership change the client may
// still talk to a member that is stopping (a removed one answers "raft:
// stopped").
func untilFinished(ctx context.Context, f func() error) error {
	wait := 50 * time.Millisecond
	for {
		err := f()
		if err == nil || errors.Is(err, errFinishedElsewhere) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// auditRefusal records a refused proof of absence (MEMBER_REMOVE_REFUSED).
// It is not a change; the event's revision and the fence's epoch tell a
// reader whether the node existed when the caller planned.
func (c *change) auditRefusal(ctx context.Context, nodeID, reason string) {
	recorder := c.x.s.recorder()
	op := audit.Put(&auditv1.Event{
		Actor:      c.actor.String(),
		RecordedBy: recorder,
		Action:     auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE_REFUSED,
		NodeId:     nodeID,
		Fence:      c.fence.Strings(),
		Reason:     "proof of absence failed: " + reason,
	})
	if _, err := c.cli.Do(ctx, op); err != nil {
		c.x.s.log.Warn("record a refused proof of absence", "node", nodeID, "err", err)
	}
	c.x.s.log.Warn("refused a removal for want of a node: the node exists", "node", nodeID, "actor", c.actor.String(), "fence", c.fence.String())
}

// finishClient is the etcd client that finishes p: the cluster client,
// except when p removes this process's own member, whose etcd stops (and
// closes that client) as soon as it learns it was removed; then a client of
// the other voters.
func (c *change) finishClient(p *pendingChange) (*clientv3.Client, func(), error) {
	own := c.x.s.member.status().GetMemberId()
	if p.GetOperation() != consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_REMOVE || p.GetMemberId() != own {
		return c.cli, func() {}, nil
	}
	var eps []string
	for _, v := range c.snap.voters() {
		if v.ID != own {
			eps = append(eps, v.ClientURLs...)
		}
	}
	if len(eps) == 0 {
		return nil, nil, errors.New("no other voter to finish the change through")
	}
	cli, err := c.x.s.member.dial(eps)
	if err != nil {
		return nil, nil, err
	}
	return cli, func() { cli.Close() }, nil
}

// whyNotAbsent names a failed proof of absence: the node exists. It also
// records the refusal in the audit log: a caller that planned the removal
// from a view in which a node that existed looked deleted is a defect an
// operator (and the fault suite) must see, even though nothing changed.
func (c *change) whyNotAbsent(ctx context.Context, nodeID string, err error) error {
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Part != fence.PartCondition {
		return err
	}
	resp, rerr := c.cli.Get(ctx, keys.Node(nodeID), clientv3.WithKeysOnly())
	if rerr != nil || len(resp.Kvs) == 0 {
		return err
	}
	created := resp.Kvs[0].CreateRevision
	reason := fmt.Sprintf("node %s exists (created at revision %d): the member of a live node is not removed for want of a node; read nodes again", nodeID, created)
	c.auditRefusal(ctx, nodeID, reason)
	return fmt.Errorf("member.remove: %w", &fence.StaleError{Part: fence.PartCondition, Reason: reason})
}

// quorumGuard refuses to remove the last voter, or a voter whose removal
// leaves fewer healthy voters than a quorum of the smaller cluster. It
// returns the healthiest other voter (to hand leadership to) and whether the
// target leads.
func (c *change) quorumGuard(ctx context.Context, target *etcdMember) (*etcdMember, bool, error) {
	voters := c.snap.voters()
	if len(voters) <= 1 {
		return nil, false, fmt.Errorf("%w: member %s (node %q) is the last voter: removing it would destroy the cluster", errQuorumAtRisk, types.ID(target.ID), c.snap.nodeID(target))
	}
	j := judgeVoters(target.ID, c.probeAll(ctx, voters))
	remaining := len(voters) - 1
	quorum := remaining/2 + 1
	if len(j.healthy) < quorum && !failpoint.Mutated(failpoint.NoQuorumGuard) {
		return nil, false, fmt.Errorf("%w: removing member %s (node %q) would leave %d healthy voters of %d, below the quorum of %d; bring these voters back first: %s",
			errQuorumAtRisk, types.ID(target.ID), c.snap.nodeID(target), len(j.healthy), remaining, quorum, strings.Join(j.unhealthy, "; "))
	}
	return j.best, j.leader == target.ID, nil
}

// probeResult is one voter's answer to the quorum guard's probe.
type probeResult struct {
	member *etcdMember
	node   string // the member's node, for messages
	status *clientv3.StatusResponse
	err    error
}

// probeAll asks every voter for its status at once, all within one health
// timeout: a guard in front of five hung voters waits one timeout, not five,
// and every answer describes the same moment.
func (c *change) probeAll(ctx context.Context, voters []*etcdMember) []probeResult {
	pctx, cancel := context.WithTimeout(ctx, c.x.s.cfg.HealthTimeout)
	defer cancel()
	results := make([]probeResult, len(voters))
	var wg sync.WaitGroup
	for i, v := range voters {
		results[i] = probeResult{member: v, node: c.snap.nodeID(v)}
		if len(v.ClientURLs) == 0 {
			results[i].err = errors.New("never started")
			continue
		}
		wg.Go(func() {
			results[i].status, results[i].err = statusAt(pctx, c.cli, v.ClientURLs[0])
		})
	}
	wg.Wait()
	return results
}

// judgement is what the quorum guard concludes from one round of probes.
type judgement struct {
	healthy   []string    // the other voters that count towards the quorum
	unhealthy []string    // the others, each with why
	best      *etcdMember // the healthy voter furthest ahead: the transferee
	leader    uint64      // the current term's leader, 0 when none is known
}

// judgeVoters decides, from one round of probes, which voters other than the
// target count as healthy. The current term is the highest any voter
// reports; a voter counts only when it answers at that term, names that
// term's leader (a member of the probed voters) and raises no alarm. A voter
// cut off from the others still names the leader of the term it last saw:
// counting it would let a removal through that leaves a partitioned
// minority behind.
func judgeVoters(target uint64, probes []probeResult) judgement {
	var (
		j       judgement
		term    uint64
		isVoter = map[uint64]bool{}
		bestIdx uint64
	)
	for _, p := range probes {
		isVoter[p.member.ID] = true
		if p.err == nil && p.status.RaftTerm > term {
			term = p.status.RaftTerm
		}
	}
	for _, p := range probes {
		if p.err == nil && p.status.RaftTerm == term && p.status.Leader != 0 && isVoter[p.status.Leader] {
			j.leader = p.status.Leader
			break
		}
	}
	anyLeader := failpoint.Mutated(failpoint.AnyLeaderHealthy)
	for _, p := range probes {
		var why string
		switch st := p.status; {
		case p.err != nil:
			why = p.err.Error()
		case st.Leader == 0:
			why = "knows no leader"
		case len(st.Errors) > 0:
			why = "reports " + strings.Join(st.Errors, ", ")
		case anyLeader:
		case st.RaftTerm != term:
			why = fmt.Sprintf("is at term %d, behind the current term %d", st.RaftTerm, term)
		case st.Leader != j.leader:
			why = fmt.Sprintf("names %s as leader, not the current term's leader %s", types.ID(st.Leader), types.ID(j.leader))
		}
		if p.member.ID == target {
			continue
		}
		if why != "" {
			j.unhealthy = append(j.unhealthy, fmt.Sprintf("%s (node %q: %s)", types.ID(p.member.ID), p.node, why))
			continue
		}
		j.healthy = append(j.healthy, types.ID(p.member.ID).String())
		if j.best == nil || p.status.RaftIndex > bestIdx {
			j.best, bestIdx = p.member, p.status.RaftIndex
		}
	}
	return j
}

// moveLeader hands etcd leadership from the target to the transferee before
// the target is removed, so the cluster does not sit through an election.
// MoveLeader must be sent to the leader itself.
func (c *change) moveLeader(ctx context.Context, leader, transferee *etcdMember) error {
	cli, err := c.x.s.member.dial(leader.ClientURLs)
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.MoveLeader(ctx, transferee.ID); err != nil {
		return explain(err, fmt.Sprintf("move leadership from %s to %s before removing it", types.ID(leader.ID), types.ID(transferee.ID)))
	}
	c.x.s.log.Info("moved etcd leadership", "from", types.ID(leader.ID).String(), "to", types.ID(transferee.ID).String())
	return nil
}
