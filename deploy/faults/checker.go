package faults

// The checker: what must hold, sampled while the run goes on (membership,
// quorum, the active reconcilers) and checked on the recorded history at
// the end (the audit log, read straight from etcd with its revisions).

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	auditv1 "curia.dev/gen/curia/audit/v1"
	"curia.dev/platform/keys"
)

// Violation is one broken invariant, named, with what shows it.
type Violation struct {
	Invariant string    `json:"invariant"`
	At        time.Time `json:"at"`
	Detail    string    `json:"detail"`
}

func (v Violation) String() string {
	return fmt.Sprintf("%s at %s: %s", v.Invariant, v.At.Format("15:04:05.000"), v.Detail)
}

// The invariants, by name (the report and a failing run name them).
const (
	InvQuorum          = "quorum-kept"
	InvVoterFloor      = "voter-floor"
	InvOneInFlight     = "one-change-in-flight"
	InvExplained       = "membership-changes-explained"
	InvFencedWrites    = "no-superseded-fence-accepted"
	InvLiveMember      = "no-live-member-removed"
	InvFreshPlans      = "plans-from-fresh-snapshots"
	InvOneHolder       = "one-lease-holder"
	InvLinearizable    = "registry-linearizable"
	InvAckLost         = "no-acknowledged-write-lost"
	InvConverged       = "converged-after-heal"
	InvNoInternalError = "no-internal-errors"
)

// sample is one look at the cluster.
type sample struct {
	at      time.Time
	quorum  bool
	members map[uint64]memberView // nil when the member list could not be read
	// active are the reconciler processes that said they hold the lease,
	// with its fence (rendered) and expiry.
	active map[string]activeLease
}

type memberView struct {
	node    string
	learner bool
}

type activeLease struct {
	fence   string
	expires time.Time
}

// checker keeps the samples and the violations.
type checker struct {
	mu         sync.Mutex
	samples    []sample
	violations []Violation
	// quorumLostSince is when the quorum probe first failed in a row.
	quorumLostSince time.Time
}

func (c *checker) violate(inv string, at time.Time, format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.violations = append(c.violations, Violation{Invariant: inv, At: at, Detail: fmt.Sprintf(format, args...)})
}

// Violations returns what broke, in order.
func (c *checker) Violations() []Violation {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Clone(c.violations)
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// observe adds one sample and checks what a sample can show at once: a
// quorum lost for longer than maxQuorumLoss while no fault explains it, a
// lease held by two processes with the same fence.
func (c *checker) observe(s sample, faultExplainsQuorumLoss bool, floor int, maxQuorumLoss time.Duration) {
	c.mu.Lock()
	c.samples = append(c.samples, s)
	switch {
	case s.quorum || faultExplainsQuorumLoss:
		c.quorumLostSince = time.Time{}
	case c.quorumLostSince.IsZero():
		c.quorumLostSince = s.at
	}
	lost := c.quorumLostSince
	c.mu.Unlock()
	if !lost.IsZero() && s.at.Sub(lost) > maxQuorumLoss {
		c.violate(InvQuorum, s.at, "etcd has answered no linearizable read for %v, and no fault in force cuts off or stops a majority of the voters", s.at.Sub(lost).Round(time.Millisecond))
		c.mu.Lock()
		c.quorumLostSince = time.Time{} // report once per episode
		c.mu.Unlock()
	}
	byFence := map[string][]string{}
	for proc, l := range s.active {
		if l.expires.After(s.at) {
			byFence[l.fence] = append(byFence[l.fence], proc)
		}
	}
	for f, procs := range byFence {
		if len(procs) > 1 {
			slices.Sort(procs)
			c.violate(InvOneHolder, s.at, "reconciler processes %s all act under one live lease (fence %s): a paused process and its twin share a fence", strings.Join(procs, ", "), f)
		}
	}
}

// auditEvent is an audit event with the etcd revision it was written at.
type auditEvent struct {
	*auditv1.Event
	rev int64
}

// readAudit reads the whole audit log with revisions.
func readAudit(ctx context.Context, cli *clientv3.Client) ([]auditEvent, error) {
	resp, err := cli.Get(ctx, keys.AuditPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read the audit log: %w", err)
	}
	var out []auditEvent
	for _, kv := range resp.Kvs {
		ev := &auditv1.Event{}
		if err := proto.Unmarshal(kv.Value, ev); err != nil {
			return nil, fmt.Errorf("audit event %s: %w", kv.Key, err)
		}
		out = append(out, auditEvent{Event: ev, rev: kv.ModRevision})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].rev < out[j].rev })
	return out, nil
}

// checkAudit checks the recorded history of membership changes:
//   - at most one change is in flight at a time (by revision: no intent
//     while another change has no outcome yet);
//   - every outcome has exactly one intent, and every intent an outcome;
//   - every accepted change's fence was current at its revision: each
//     condition's key existed with that create revision, the leader key was
//     the leader's (no older key under the election prefix);
//   - the reconciler removed a member "for want of a node" only when the
//     node did not exist at the change's start;
//   - no refused proof of absence shows a plan from a stale view (the node
//     existed before the epoch the caller planned at).
func (c *checker) checkAudit(ctx context.Context, cli *clientv3.Client, events []auditEvent) {
	open := map[string]auditEvent{}
	intents := map[string]int{}
	outcomes := map[string]int{}
	for _, ev := range events {
		at := ev.GetTime().AsTime()
		if ev.GetChangeId() != "" {
			if ev.GetOutcome() == auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED {
				intents[ev.GetChangeId()]++
				for id, o := range open {
					c.violate(InvOneInFlight, at, "change %s (%s of %s by %s) started at revision %d while change %s (%s of %s, revision %d) was still in flight", ev.GetChangeId(), ev.GetAction(), ev.GetNodeId(), ev.GetActor(), ev.rev, id, o.GetAction(), o.GetNodeId(), o.rev)
				}
				open[ev.GetChangeId()] = ev
			} else {
				outcomes[ev.GetChangeId()]++
				delete(open, ev.GetChangeId())
			}
		}
		if ev.GetOutcome() == auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED && len(ev.GetFence()) > 0 {
			c.checkFence(ctx, cli, ev)
		}
		switch {
		case ev.GetAction() == auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE && ev.GetOutcome() == auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED && strings.HasPrefix(ev.GetActor(), "reconciler") && strings.Contains(ev.GetReason(), "which does not exist"):
			// (The plan's rule 1, "a member whose node does not exist", in
			// the reason the reconciler sends with the removal.)
			if created, ok := nodeAt(ctx, cli, ev.GetNodeId(), ev.rev); ok {
				c.violate(InvLiveMember, at, "the reconciler removed the member of node %s for want of a node, but the node existed at the removal's start (revision %d, created at %d)", ev.GetNodeId(), ev.rev, created)
			}
		case ev.GetAction() == auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE_REFUSED:
			created, ok := nodeAt(ctx, cli, ev.GetNodeId(), ev.rev)
			if epoch := fenceEpoch(ev.GetFence()); ok && epoch > 0 && created < epoch {
				c.violate(InvFreshPlans, at, "%s planned to remove the member of node %s for want of a node, but the node existed (created at revision %d) before the epoch %d it planned at: a stale node view", ev.GetActor(), ev.GetNodeId(), created, epoch)
			}
		}
	}
	for id, n := range outcomes {
		if n != 1 || intents[id] != 1 {
			c.violate(InvExplained, time.Now(), "change %s has %d intents and %d outcomes in the audit log, want one of each", id, intents[id], n)
		}
	}
}

// checkFence verifies, at the event's revision, that the fence the event
// records was current: the resource's check, done again from outside.
func (c *checker) checkFence(ctx context.Context, cli *clientv3.Client, ev auditEvent) {
	var leader string
	var leaderRev int64
	for _, s := range ev.GetFence() {
		key, rev, ok := parseCondition(s)
		if !ok {
			continue // the epoch, rendered "…@mod<n>"
		}
		resp, err := cli.Get(ctx, key, clientv3.WithRev(ev.rev), clientv3.WithKeysOnly())
		if err != nil {
			continue // compacted: cannot tell
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != rev {
			c.violate(InvFencedWrites, ev.GetTime().AsTime(), "%s by %s was accepted at revision %d with fence condition %s, which did not hold then", ev.GetAction(), ev.GetActor(), ev.rev, s)
		}
		if strings.HasPrefix(key, keys.LeaderElection) {
			leader, leaderRev = key, rev
		}
	}
	if leader == "" {
		return
	}
	resp, err := cli.Get(ctx, keys.LeaderElection, append(clientv3.WithFirstCreate(), clientv3.WithRev(ev.rev), clientv3.WithKeysOnly())...)
	if err == nil && len(resp.Kvs) > 0 && string(resp.Kvs[0].Key) != leader {
		c.violate(InvFencedWrites, ev.GetTime().AsTime(), "%s by %s was accepted at revision %d under leader key %s@%d, but the leader then was %s", ev.GetAction(), ev.GetActor(), ev.rev, leader, leaderRev, resp.Kvs[0].Key)
	}
}

// nodeAt says whether nodes/<id> existed at rev, and since when.
func nodeAt(ctx context.Context, cli *clientv3.Client, id string, rev int64) (int64, bool) {
	resp, err := cli.Get(ctx, keys.Node(id), clientv3.WithRev(rev), clientv3.WithKeysOnly())
	if err != nil || len(resp.Kvs) == 0 {
		return 0, false
	}
	return resp.Kvs[0].CreateRevision, true
}

// parseCondition reads a fence condition as fence.Fence.Strings renders
// it: "key@revision" (the epoch, "key@mod<n>", is not a condition).
func parseCondition(s string) (string, int64, bool) {
	i := strings.LastIndex(s, "@")
	if i < 0 {
		return "", 0, false
	}
	var rev int64
	if _, err := fmt.Sscanf(s[i+1:], "%d", &rev); err != nil || strings.HasPrefix(s[i+1:], "mod") {
		return "", 0, false
	}
	return s[:i], rev, true
}

// fenceEpoch is the membership epoch in a rendered fence, 0 if none.
func fenceEpoch(fence []string) int64 {
	for _, s := range fence {
		if strings.HasPrefix(s, keys.MembershipEpoch+"@mod") {
			e, err := strconv.ParseInt(strings.TrimPrefix(s, keys.MembershipEpoch+"@mod"), 10, 64)
			if err != nil {
				return 0 // not a fence curia renders (fence.Fence.Strings)
			}
			return e
		}
	}
	return 0
}

// checkExplained checks that every membership transition the samples saw
// (a member appearing, disappearing, or a learner becoming a voter) is
// explained by an applied change in the audit log, or by a nemesis that
// changed etcd membership behind curia's back; and that no voter the
// reconciler removed took the voters below floor.
func (c *checker) checkExplained(events []auditEvent, injected map[uint64]string, floor int) {
	applied := map[auditv1.AuditAction]map[uint64]string{} // action → member → actor
	for _, ev := range events {
		if ev.GetOutcome() != auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED {
			continue
		}
		if applied[ev.GetAction()] == nil {
			applied[ev.GetAction()] = map[uint64]string{}
		}
		applied[ev.GetAction()][ev.GetMemberId()] = ev.GetActor()
	}
	c.mu.Lock()
	samples := slices.Clone(c.samples)
	c.mu.Unlock()
	sort.SliceStable(samples, func(i, j int) bool { return samples[i].at.Before(samples[j].at) })
	var prev map[uint64]memberView
	for _, s := range samples {
		if s.members == nil {
			continue
		}
		if prev != nil {
			voters := 0
			for _, m := range s.members {
				if !m.learner {
					voters++
				}
			}
			for id, m := range s.members {
				old, was := prev[id]
				_, added := applied[auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD][id]
				_, promoted := applied[auditv1.AuditAction_AUDIT_ACTION_MEMBER_PROMOTE][id]
				switch {
				case !was && !added && injected[id] == "":
					c.violate(InvExplained, s.at, "member %x (node %s) appeared with no applied add in the audit log", id, m.node)
				case was && old.learner && !m.learner && !promoted && injected[id] == "":
					c.violate(InvExplained, s.at, "member %x (node %s) became a voter with no applied promotion in the audit log", id, m.node)
				}
			}
			for id, m := range prev {
				if _, still := s.members[id]; still {
					continue
				}
				actor, removed := applied[auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE][id]
				switch {
				case !removed && injected[id] == "":
					c.violate(InvExplained, s.at, "member %x (node %s) disappeared with no applied removal in the audit log", id, m.node)
				case removed && strings.HasPrefix(actor, "reconciler") && !m.learner && voters < floor:
					c.violate(InvVoterFloor, s.at, "the reconciler removed voter %x (node %s), leaving %d voters, below the floor of %d", id, m.node, voters, floor)
				}
			}
		}
		prev = s.members
	}
}

// sampleStats are how many samples the run took and the largest gap
// between two of them.
func (c *checker) sampleStats() (int, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at := make([]time.Time, len(c.samples))
	for i, s := range c.samples {
		at[i] = s.at
	}
	slices.SortFunc(at, time.Time.Compare)
	var gap time.Duration
	for i := 1; i < len(at); i++ {
		gap = max(gap, at[i].Sub(at[i-1]))
	}
	return len(at), gap.Round(time.Millisecond).String()
}
