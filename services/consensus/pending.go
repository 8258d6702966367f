package consensus

// One membership change at a time, cluster-wide (DESIGN §4).
//
// etcd cannot put MemberAdd/Remove/Promote inside a transaction, and every
// consensus process serves membership calls, so a lock inside one process
// is not enough: two removals through two processes could each pass their
// own quorum guard and together break quorum. A change therefore goes
// through a record in etcd, keys.MembershipPending:
//
//	          commit txn: fence ✓, epoch ✓, pending absent
//	          → create pending, bump epoch, audit intent
//	idle ───────────────────────────────────────────────▶ pending
//	  ▲                                                      │ the recorder makes the etcd
//	  │ finish txn: pending still this one                   │ member call (under a deadline)
//	  │ → delete it, bump epoch, audit outcome               ▼
//	  └──────────── APPLIED | NOT_APPLIED ◀──── the recorder decides from the call,
//	                                            or anyone resolves a record it has
//	                                            watched for 2 × its deadline, from
//	                                            the live member list
//
// Who may do what:
//   - idle: any fenced caller may start a change (the commit txn creates the
//     record only if there is none, CreateRevision == 0).
//   - pending: every other change, through any process, is refused
//     (Aborted: retry); only the recorder makes the member call, and only
//     before its deadline. The record's epoch bump makes every snapshot
//     taken before it stale; the finish's bump makes every snapshot taken
//     inside the window stale.
//   - the finish (by the recorder or a resolver) is guarded by the record's
//     create revision, so a change is finished once, and never someone
//     else's later change.
//
// A resolver never decides on a timeout alone: the wait only makes sure the
// recorder can no longer make its call (its deadline passed, with a margin
// for etcd applying a proposal it already accepted); the outcome comes from
// the live member list (did the change happen?).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/records"
	"curia.dev/platform/rpcerr"
)

// finishTimeout bounds the transaction (and member list) that finishes a
// change after its member call.
const finishTimeout = 10 * time.Second

// pendingChange is the record of the change in flight, as read or written.
type pendingChange struct {
	*consensusv1.PendingChange
	// createRev is the record's create revision: the finish is guarded by it.
	createRev int64
	// sent is when its recorder sent the commit, by the recorder's clock:
	// its deadline counts from then, not from the commit's answer, which a
	// partition or a pause can delay past any resolver's wait.
	sent time.Time
	// unreadable says why the record names no change: it blocks every
	// change like any pending record, and is cleared, audited, once no
	// recorder can still be making a call (Service.resolveAfter).
	unreadable error
}

// decodePending reads the record stored under keys.MembershipPending
// (curia.storage.v1.PendingChangeRecord) at createRev. A record that is not
// one, or names no change (id, operation, deadline), comes back unreadable,
// under an id of its revisions: still pending, never ignored.
func decodePending(value []byte, createRev, modRev int64) *pendingChange {
	p, err := records.DecodePendingChange(value)
	if err == nil {
		switch {
		case p.GetId() == "":
			err = errors.New("it names no change id")
		case p.GetOperation() == consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_UNSPECIFIED:
			err = errors.New("it names no operation")
		case p.GetDeadline().AsDuration() <= 0:
			err = errors.New("it names no deadline")
		}
	}
	if err != nil {
		return &pendingChange{
			PendingChange: &consensusv1.PendingChange{Id: fmt.Sprintf("unreadable-%d-%d", createRev, modRev)},
			createRev:     createRev,
			unreadable:    fmt.Errorf("%d bytes: %w", len(value), err),
		}
	}
	return &pendingChange{PendingChange: p, createRev: createRev}
}

func newChangeID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// auditAction is the audit log's action of a membership operation.
func auditAction(op consensusv1.MembershipOperation) auditv1.AuditAction {
	switch op {
	case consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_ADD:
		return auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD
	case consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_PROMOTE:
		return auditv1.AuditAction_AUDIT_ACTION_MEMBER_PROMOTE
	case consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_REMOVE:
		return auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE
	}
	return auditv1.AuditAction_AUDIT_ACTION_UNSPECIFIED
}

// action names the change's operation in logs and errors.
func (p *pendingChange) action() string {
	switch p.GetOperation() {
	case consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_ADD:
		return "member.add"
	case consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_PROMOTE:
		return "member.promote"
	case consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_REMOVE:
		return "member.remove"
	}
	return "member.unknown"
}

func (p *pendingChange) String() string {
	if p.unreadable != nil {
		return fmt.Sprintf("an unreadable pending membership record (%s, created at revision %d: %v)", keys.MembershipPending, p.createRev, p.unreadable)
	}
	return fmt.Sprintf("%s of node %q (member %s, change %s) by %s via %s since %s",
		p.action(), p.GetNodeId(), types.ID(p.GetMemberId()), p.GetId(), p.GetActor(), p.GetRecordedBy(), p.GetStarted().AsTime().UTC().Format(time.RFC3339))
}

// deadline is how long the recorder may make the member call.
func (p *pendingChange) deadline() time.Duration { return p.GetDeadline().AsDuration() }

// applied says whether etcd membership shows the change done. An add
// found done learns its member id (the outcome names it).
func (p *pendingChange) applied(members []*etcdMember) bool {
	var m *etcdMember
	for _, mem := range members {
		if (p.GetMemberId() != 0 && mem.ID == p.GetMemberId()) || (p.GetMemberId() == 0 && slices.Contains(mem.PeerURLs, p.GetPeerUrl())) {
			m = mem
		}
	}
	switch p.GetOperation() {
	case consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_ADD:
		if m != nil {
			p.MemberId = m.ID
		}
		return m != nil
	case consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_PROMOTE:
		return m != nil && !m.IsLearner
	case consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_REMOVE:
		return m == nil
	}
	return false
}

// finishOps are the writes that go with an outcome: the joining record of
// an add that did not happen, and of a member that is gone, is deleted.
func (p *pendingChange) finishOps(outcome auditv1.ChangeOutcome) []clientv3.Op {
	op := p.GetOperation()
	if p.GetPeerUrl() != "" && ((op == consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_ADD && outcome == auditv1.ChangeOutcome_CHANGE_OUTCOME_NOT_APPLIED) ||
		(op == consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_REMOVE && outcome == auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED)) {
		return []clientv3.Op{clientv3.OpDelete(keys.Joining(p.GetPeerUrl()))}
	}
	return nil
}

// errFinishedElsewhere: the record is gone or another one by now.
var errFinishedElsewhere = rpcerr.ChangePending.Sub("the membership change was finished by another process")

// finish ends the change p with outcome: one transaction, guarded by the
// record's create revision, deletes the record, bumps the epoch and writes
// the outcome to the audit log. It returns the epoch after it.
func finish(ctx context.Context, cli *clientv3.Client, p *pendingChange, outcome auditv1.ChangeOutcome, recorder, reason string) (int64, error) {
	action := auditAction(p.GetOperation())
	if p.unreadable != nil {
		action = auditv1.AuditAction_AUDIT_ACTION_MEMBER_CHANGE_UNREADABLE
	}
	ops := append(p.finishOps(outcome), clientv3.OpDelete(keys.MembershipPending))
	if !failpoint.Mutated(failpoint.NoFinishEpochBump) {
		ops = append(ops, fence.BumpEpoch(recorder))
	}
	ops = append(ops,
		audit.Put(&auditv1.Event{
			Actor:      p.GetActor(),
			RecordedBy: recorder,
			Action:     action,
			NodeId:     p.GetNodeId(),
			MemberId:   p.GetMemberId(),
			Fence:      p.GetFence(),
			Reason:     reason,
			ChangeId:   p.GetId(),
			Outcome:    outcome,
		}))
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(keys.MembershipPending), "=", p.createRev)).
		Then(ops...).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("finish %s: %w", p, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("finish %s: %w", p, errFinishedElsewhere)
	}
	return resp.Header.Revision, nil
}

// definitelyNotApplied says whether a member call's error means etcd
// refused the change before proposing it. Timeouts, lost connections and
// leader changes say nothing: the proposal may still be applied.
func definitelyNotApplied(err error) bool {
	switch {
	case errors.Is(err, errNeverCalled), errors.Is(err, rpctypes.ErrUnhealthy), errors.Is(err, rpctypes.ErrMemberNotEnoughStarted):
		return true
	}
	var ee rpctypes.EtcdError
	if !errors.As(err, &ee) {
		return false
	}
	switch ee.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Internal:
		return false
	}
	return true
}

// errNeverCalled: the change's member call was not made (its deadline had
// passed, or a step before it failed).
var errNeverCalled = errors.New("the etcd member call was not made")

// pendingClock remembers when this process first saw each pending change,
// by its own clock: a resolver waits from then, so that clock skew between
// machines cannot shorten the wait.
type pendingClock struct {
	mu   sync.Mutex
	seen map[string]time.Time
	// current is the change followPending last found pending ("" none),
	// for curia_consensus_pending_change_age_seconds.
	current string
}

func newPendingClock() *pendingClock { return &pendingClock{seen: map[string]time.Time{}} }

// age is how long this process has seen p pending; other changes are
// forgotten (at most one is pending at a time).
func (c *pendingClock) age(p *pendingChange, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	first, ok := c.seen[p.GetId()]
	if !ok {
		clear(c.seen)
		c.seen[p.GetId()] = now
		return 0
	}
	return now.Sub(first)
}

// follow records what followPending found: p pending, or none (nil).
func (c *pendingClock) follow(p *pendingChange, now time.Time) {
	if p != nil {
		c.age(p, now)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.current = ""
	if p != nil {
		c.current = p.GetId()
	}
}

// currentAge is how long this process has seen the change followPending
// last found pending; 0 when it found none.
func (c *pendingClock) currentAge(now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	first, ok := c.seen[c.current]
	if c.current == "" || !ok {
		return 0
	}
	return now.Sub(first)
}

// resolveAfter is how long a pending change must have been seen before a
// process other than its recorder resolves it: the recorder's deadline,
// and as much again for etcd to apply a proposal it accepted just before.
// An unreadable record names no deadline: the longest any process of the
// cluster may use stands in for it.
func (s *Service) resolveAfter(p *pendingChange) time.Duration {
	if p.unreadable != nil {
		return 2 * s.cfg.MaxMemberCallTimeout
	}
	return 2 * p.deadline()
}

// blockedBy answers a change that finds p pending: resolved, when this
// process has seen p for long enough, and refused either way (the caller's
// snapshot is stale once p ends: the finish bumps the epoch).
func (s *Service) blockedBy(ctx context.Context, cli *clientv3.Client, p *pendingChange) error {
	age := s.pending.age(p, time.Now())
	if wait := s.resolveAfter(p); age < wait {
		return rpcerr.RetryAfter(fmt.Errorf("%w: %s; this process resolves it if it is still pending in %v; retry with a fresh member list once it finished", errChangePending, p, (wait-age).Round(time.Second)), wait-age)
	}
	outcome, err := s.resolve(ctx, cli, p)
	if err != nil {
		return fmt.Errorf("%w: %s, left by its recorder: %v", errChangePending, p, err)
	}
	return fmt.Errorf("%w: %s was left by its recorder and is now resolved (%s); read members again and retry", errChangePending, p, outcome)
}

// resolve finishes a change whose recorder is gone, from the live member
// list. The caller waited resolveAfter(p) and holds the change lock.
func (s *Service) resolve(ctx context.Context, cli *clientv3.Client, p *pendingChange) (auditv1.ChangeOutcome, error) {
	list, err := cli.MemberList(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the member list to resolve it: %w", err)
	}
	if p.unreadable != nil {
		return s.clearUnreadable(ctx, cli, p, list.Members)
	}
	outcome := auditv1.ChangeOutcome_CHANGE_OUTCOME_NOT_APPLIED
	if p.applied(list.Members) {
		outcome = auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED
	}
	recorder := s.recorder()
	why := fmt.Sprintf("resolved by %s after %v pending: the live member list shows the change %s", recorder, s.resolveAfter(p), map[bool]string{true: "done", false: "not done"}[outcome == auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED])
	if _, err := finish(ctx, cli, p, outcome, recorder, why); err != nil {
		return 0, err
	}
	s.log.Warn("resolved a membership change left pending", "change", p.GetId(), "action", p.action(), "node", p.GetNodeId(), "member", types.ID(p.GetMemberId()).String(), "recorded_by", p.GetRecordedBy(), "outcome", outcome.String())
	return outcome, nil
}

// clearUnreadable finishes an unreadable record: what it recorded, and so
// whether it happened, is not known, so the outcome is UNKNOWN and etcd's
// live member list stands; the finish's epoch bump makes every caller
// plan from that list again. The audit event names the list.
func (s *Service) clearUnreadable(ctx context.Context, cli *clientv3.Client, p *pendingChange, members []*etcdMember) (auditv1.ChangeOutcome, error) {
	names := make([]string, 0, len(members))
	for _, m := range members {
		role := "voter"
		if m.IsLearner {
			role = "learner"
		}
		names = append(names, fmt.Sprintf("%s %s (%s)", role, types.ID(m.ID), m.Name))
	}
	recorder := s.recorder()
	why := fmt.Sprintf("cleared by %s after %v: %v; what it recorded is not known, so etcd's live member list stands: %s",
		recorder, s.resolveAfter(p), p.unreadable, strings.Join(names, ", "))
	outcome := auditv1.ChangeOutcome_CHANGE_OUTCOME_UNKNOWN
	if _, err := finish(ctx, cli, p, outcome, recorder, why); err != nil {
		return 0, err
	}
	s.log.Warn("cleared an unreadable pending membership record", "created_revision", p.createRev, "err", p.unreadable, "members", len(members))
	return outcome, nil
}

// followPending makes sure, while the local member runs, that the
// membership epoch exists (a cluster without it would refuse every change)
// and that a change left pending by a dead process is resolved even when
// nobody asks for a change.
func (s *Service) followPending(ctx context.Context) error {
	tick := time.NewTicker(min(time.Second, s.cfg.MemberCallTimeout/2))
	defer tick.Stop()
	var ensured *clientv3.Client
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		e, cli, err := s.member.running()
		if err != nil {
			s.pending.follow(nil, time.Now())
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, finishTimeout)
		if ensured != cli {
			err := ensureEpoch(cctx, cli, s.recorder())
			if err == nil {
				err = ensureClusterID(cctx, cli, uint64(e.Server.Cluster().ID()))
			}
			if err == nil {
				ensured = cli
			}
		}
		if err := s.resolveIfStale(cctx, cli); err != nil && cctx.Err() == nil {
			s.log.Debug("check for a pending membership change", "err", err)
		}
		cancel()
	}
}

// resolveIfStale resolves the pending change if this process has seen it
// for long enough.
func (s *Service) resolveIfStale(ctx context.Context, cli *clientv3.Client) error {
	return s.resolvePending(ctx, cli, false)
}

// resolvePending resolves the pending change, if any: when this process
// has seen it for long enough, or at once (now) when its recorder cannot
// be alive (it was of a cluster a recovery replaced).
func (s *Service) resolvePending(ctx context.Context, cli *clientv3.Client, now bool) error {
	resp, err := cli.Get(ctx, keys.MembershipPending)
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 {
		s.pending.follow(nil, time.Now())
		return nil
	}
	p := decodePending(resp.Kvs[0].Value, resp.Kvs[0].CreateRevision, resp.Kvs[0].ModRevision)
	s.pending.follow(p, time.Now())
	if !now && s.pending.age(p, time.Now()) < s.resolveAfter(p) {
		return nil
	}
	unlock, err := s.member.lockChanges(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	_, err = s.resolve(ctx, cli, p)
	if errors.Is(err, errFinishedElsewhere) {
		return nil
	}
	return err
}

func (s *Service) recorder() string { return "consensus/" + s.cfg.nodeID }
