// Package plan decides the reconciler's next step: a pure function from what
// it observed (etcd membership, the node registry, when learners were first
// seen, whether a membership change is in flight) to at most one action.
// etcd membership is the source of truth; the rules are Metropolis'
// background etcd sync (DESIGN §6), in its order, plus learner promotion,
// stale learner removal and a voter floor. The first rule that applies
// decides the pass:
//
//	observe: epoch → members → nodes     plan(observed) → action     act: one fenced call, then observe again
//
//	a membership change is in flight                     → None   "waiting for the membership change in flight: …"
//	guard: the answering member is not a member and a
//	       node, or most members match no node           → Refuse
//	1. a member whose node does not exist                 → RemoveMember, NodeAbsent (Refuse if a voter below the floor)
//	2. a member's node lacks ConsensusMember              → AddRole
//	3. a node that is not a member has ConsensusMember
//	   or KubernetesController                            → RemoveRole (both go)
//	4. a learner unstarted past LearnerStartTimeout, or
//	   behind on a node dead for DeadAfter                → RemoveMember
//	   a learner caught up for Stabilization              → Promote (autopilot: into a free seat;
//	                                                        else None while its voter is unhealthy,
//	                                                        RemoveMember when no seat wants it)
//	   otherwise a learner to wait for                    → None   "waiting for learner …"
//	5. some node records do not decode                    → None   "unreadable node records: …"
//	6. autopilot (Config.TargetSize > 0; autopilot.go):
//	   fewer healthy voters than the target, a candidate  → AddMember (grow, replace a dead voter first,
//	                                                        or a standby for an unhealthy one)
//	   more voters than the target                        → RemoveMember (a dead one first), never below the floor
//	   a dead voter and no candidate                      → RemoveMember only if that raises the failure
//	                                                        tolerance (an even number of voters), else None
//	   nothing to do                                      → None   "converged: …"
//
// Time alone changes three of these conditions, with no event to say so.
// Recheck returns the next instant, after Observed.Now, at which one of
// them turns true, so that the reconciler's loop wakes then rather than at
// its next tick (a learner is promoted when its window ends, not up to a
// tick later):
//
//	a learner not started, first seen at since     → since + LearnerStartTimeout   rule 4 removes it
//	a learner caught up since ready                → ready + Stabilization         rule 4 promotes it
//	a member's node unhealthy, last heartbeat hb   → hb + DeadAfter                the node is dead: rule 4 removes a
//	                                                                               learner behind on it, rule 6 replaces a voter
//
// A node whose record does not decode (Node.Unreadable) exists: its member
// is never removed by rule 1 and it counts as a node for the guards. Its
// roles are unknown, so rules 2 and 3 leave it alone, and the planner never
// reports convergence while one is left.
package plan

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The prefixes of a None action's Reason: what kind of "nothing to do" it is.
const (
	// reasonConverged: roles and membership agree, nothing is pending.
	reasonConverged = "converged"
	// reasonWaiting: a membership change in flight, or a learner that
	// has yet to start or to stay caught up; time will end it.
	reasonWaiting = "waiting for"
	// reasonUnreadable: nothing can be done, but some node records do not
	// decode, so agreement cannot be checked for them; an operator has to
	// look.
	reasonUnreadable = "unreadable node records"
)

// Member is an etcd member as the consensus service lists it.
type Member struct {
	ID     uint64
	NodeID string
	// Learner is true until the member is promoted.
	Learner bool
	// Started is true once the member ran and published its name.
	Started bool
	// CaughtUp is true for a learner whose log is close enough to the
	// leader's for etcd to promote it.
	CaughtUp bool
}

// Node is a node record as the curator has it.
type Node struct {
	ID string
	// Revision is the record's etcd ModRevision, sent back with a role
	// write so that it applies only to the record the plan was made from.
	Revision int64
	// Unreadable is true when the stored record does not decode. The node
	// exists — its member is never removed as node-less, and it counts as
	// a node for the guards — but its roles are unknown: ConsensusMember
	// and KubernetesController are ignored, no role write targets it, and
	// the plan is never "converged" while it stays unreadable.
	Unreadable           bool
	ConsensusMember      bool
	KubernetesController bool

	// For autopilot (rule 6). Up: the node is enrolled and in service
	// (NODE_STATE_UP). Healthy: its heartbeats arrive; LastHeartbeat is
	// the last one (zero: never). PeerURL is the etcd peer URL its
	// consensus process reported ("" until it can run one). Zone is its
	// "zone" label, which autopilot spreads voters across.
	Up            bool
	Healthy       bool
	LastHeartbeat time.Time
	PeerURL       string
	Zone          string
	// MaintenanceUntil: an admin took the node out of service until then
	// (Node.maintenance). Its voter is neither dead nor suspect before
	// it, and it is no candidate for a new voter.
	MaintenanceUntil time.Time
	// WatchedSince is when the reconciler began to watch the heartbeats
	// without a break: it took its lease, which a curator leader's term
	// grants. A silence counts towards DeadAfter from then at the
	// earliest: before it no curator leader took heartbeats (a quorum
	// loss, a recovery, a failover), so a node's last heartbeat can be
	// old without the node having been silent. Zero: from the last
	// heartbeat.
	WatchedSince time.Time
}

// silentSince is when n's silence began, as far as the reconciler saw.
func (n Node) silentSince() time.Time {
	if n.WatchedSince.After(n.LastHeartbeat) {
		return n.WatchedSince
	}
	return n.LastHeartbeat
}

// inMaintenance reports whether n is in maintenance at now.
func (n Node) inMaintenance(now time.Time) bool { return now.Before(n.MaintenanceUntil) }

// Observed is one snapshot, read in this order: the membership epoch, the
// member list, the nodes (members before nodes, so a node created in
// between cannot look missing).
type Observed struct {
	Epoch int64
	// Pending describes the membership change in flight cluster-wide
	// (DESIGN §4, membership/pending), "" when there is none. While one is
	// pending every other change is refused and the snapshot may be taken
	// mid-change, so the plan is to wait: nothing else is looked at.
	Pending string
	// AnsweredBy is the member that answered the member list.
	AnsweredBy uint64
	// Leader is the etcd leader as the answering member knows it (0:
	// none known).
	Leader  uint64
	Members []Member
	Nodes   []Node
	// LearnerSince is when the reconciler first saw each learner;
	// ReadySince when it first saw each learner caught up, continuously.
	// The reconciler keeps both across passes.
	LearnerSince map[uint64]time.Time
	ReadySince   map[uint64]time.Time
	Now          time.Time
}

// Config bounds what the planner may do.
type Config struct {
	// VoterFloor is the number of voters no automated removal goes below
	// (at least 1: the last voter is never removed).
	VoterFloor int
	// Stabilization is how long a learner must stay caught up before it is
	// promoted.
	Stabilization time.Duration
	// LearnerStartTimeout is how long a learner may stay unstarted before
	// it is removed: it would block every later join (one learner at a time).
	LearnerStartTimeout time.Duration
	// TargetSize is the number of voters autopilot keeps (0: manual, no
	// autopilot; rule 6).
	TargetSize int
	// DeadAfter is how long a voter's node may go without a heartbeat, and
	// be unhealthy, before autopilot replaces it.
	DeadAfter time.Duration
}

// Kind is what an action does.
type Kind int

// The actions, one per pass.
const (
	// None: nothing to do now. The Reason says which kind of nothing by
	// its prefix: "converged" (roles and membership agree), "waiting for"
	// (a membership change in flight, or a learner to start or to stay
	// caught up: time ends it), or "unreadable node records" (nothing the
	// planner can do, but some node records do not decode, so agreement
	// is unknown for them: not converged).
	None Kind = iota
	// Refuse: the snapshot looks wrong; do nothing and say why.
	Refuse
	// RemoveMember removes an etcd member.
	RemoveMember
	// AddRole gives a node that is an etcd member ConsensusMember.
	AddRole
	// RemoveRole takes KubernetesController and ConsensusMember from a node
	// that is not an etcd member.
	RemoveRole
	// Promote promotes a caught-up learner.
	Promote
	// AddMember adds a node that is no member as a learner and gives it
	// ConsensusMember (autopilot: grow, or a replacement); PeerURL is the
	// node's.
	AddMember
)

func (k Kind) String() string {
	return [...]string{"none", "refuse", "remove-member", "add-role", "remove-role", "promote", "add-member"}[k]
}

// Action is the planned step.
type Action struct {
	Kind         Kind
	MemberID     uint64
	NodeID       string
	NodeRevision int64
	// NodeAbsent is true exactly for a RemoveMember whose reason is that
	// the member's node does not exist (rule 1). The act step sends the
	// node id as the proof of absence, which the resource checks in its
	// fenced txn (CreateRevision(nodes/<id>) == 0). It is false for every
	// other action, a learner removed for not starting included.
	NodeAbsent bool
	// Unstarted is true exactly for a RemoveMember of a learner that has
	// not started (rule 4): the act step asks consensus to remove it only
	// while it still has not, since starting moves no membership epoch.
	Unstarted bool
	// PeerURL is, for an AddMember, the peer URL the learner is added with.
	PeerURL string
	// Refused is, for a Refuse, the action the snapshot called for but
	// the planner would not take (a removal below the voter floor); None
	// when the snapshot looked wrong before any action was chosen.
	Refused Kind
	// Epoch is the snapshot's membership epoch: every action is fenced on
	// it, so a plan made from a stale snapshot changes nothing.
	Epoch  int64
	Reason string
}

func (a Action) String() string {
	if a.Kind == None || a.Kind == Refuse {
		return fmt.Sprintf("%s: %s", a.Kind, a.Reason)
	}
	absent := ""
	if a.NodeAbsent {
		absent = " (node absent)"
	}
	return fmt.Sprintf("%s member=%x node=%s%s: %s", a.Kind, a.MemberID, a.NodeID, absent, a.Reason)
}

// Converged reports whether the action says roles and membership agree
// (not merely "nothing to do now").
func (a Action) Converged() bool {
	return a.Kind == None && strings.HasPrefix(a.Reason, reasonConverged)
}

// Plan returns the one action to take next.
func Plan(o Observed, c Config) Action {
	floor := max(c.VoterFloor, 1)
	act := func(k Kind, m uint64, node string, rev int64, why string, args ...any) Action {
		return Action{Kind: k, MemberID: m, NodeID: node, NodeRevision: rev, Epoch: o.Epoch, Reason: fmt.Sprintf(why, args...)}
	}

	// A change in flight: every other change is refused until it ends,
	// and the snapshot may show it half done.
	if o.Pending != "" {
		return act(None, 0, "", 0, "%s the membership change in flight: %s", reasonWaiting, o.Pending)
	}

	members := slices.Clone(o.Members)
	slices.SortFunc(members, func(a, b Member) int { return cmp.Compare(a.ID, b.ID) })
	nodes := make(map[string]Node, len(o.Nodes))
	for _, n := range o.Nodes {
		nodes[n.ID] = n
	}
	memberOf := make(map[string]Member, len(members))
	voters := 0
	unmatched := 0
	for _, m := range members {
		memberOf[m.NodeID] = m
		if !m.Learner {
			voters++
		}
		if _, ok := nodes[m.NodeID]; !ok {
			unmatched++
		}
	}

	// Guards (Metropolis' "local node" check, widened): if the member that
	// answered is not both a member and a node, or most members match no
	// node, the mapping between the two is broken, and acting on it could
	// remove both memberships and roles. An unreadable node is a node.
	answered, ok := findMember(members, o.AnsweredBy)
	if !ok {
		return act(Refuse, 0, "", 0, "the member that answered the member list (%x) is not in it", o.AnsweredBy)
	}
	if _, ok := nodes[answered.NodeID]; !ok {
		return act(Refuse, answered.ID, answered.NodeID, 0, "the member that answered the member list (%x, node %q) is not a cluster node: member-to-node mapping looks broken", answered.ID, answered.NodeID)
	}
	if unmatched*2 > len(members) {
		return act(Refuse, 0, "", 0, "%d of %d etcd members match no node: member-to-node mapping looks broken", unmatched, len(members))
	}

	// 1. An etcd member whose node does not exist loses its membership.
	// The resource checks the absence again, in its fenced txn.
	for _, m := range members {
		if _, ok := nodes[m.NodeID]; ok {
			continue
		}
		if !m.Learner && voters-1 < floor {
			a := act(Refuse, m.ID, m.NodeID, 0, "member %x has no node, but removing it would leave %d voters, below the floor of %d", m.ID, voters-1, floor)
			a.Refused = RemoveMember
			return a
		}
		a := act(RemoveMember, m.ID, m.NodeID, 0, "etcd member %x belongs to node %q, which does not exist", m.ID, m.NodeID)
		a.NodeAbsent = true
		return a
	}

	ids := make([]string, 0, len(nodes))
	var unreadable []string
	for id, n := range nodes {
		ids = append(ids, id)
		if n.Unreadable {
			unreadable = append(unreadable, id)
		}
	}
	slices.Sort(ids)
	slices.Sort(unreadable)
	// 2. A node that is an etcd member gets ConsensusMember (which also
	// makes a KubernetesController it has valid again).
	for _, id := range ids {
		n := nodes[id]
		if m, ok := memberOf[id]; ok && !n.Unreadable && !n.ConsensusMember {
			kc := ""
			if n.KubernetesController {
				kc = " (it has KubernetesController, which requires it)"
			}
			return act(AddRole, m.ID, id, n.Revision, "node %s is etcd member %x but lacks ConsensusMember%s", id, m.ID, kc)
		}
	}
	// 3. A node that is not an etcd member loses ConsensusMember and
	// KubernetesController (which requires ConsensusMember): one write
	// clears both, so a KubernetesController left without
	// ConsensusMember is repaired too.
	for _, id := range ids {
		n := nodes[id]
		if _, ok := memberOf[id]; ok || n.Unreadable {
			continue
		}
		switch {
		case n.ConsensusMember:
			return act(RemoveRole, 0, id, n.Revision, "node %s has ConsensusMember but is not an etcd member", id)
		case n.KubernetesController:
			return act(RemoveRole, 0, id, n.Revision, "node %s has KubernetesController without ConsensusMember and is not an etcd member", id)
		}
	}

	// 4. Learners: remove one that never started in time; promote one that
	// stayed caught up for the stabilisation window. Under autopilot a
	// caught-up learner is promoted only into a free seat (autopilot.go):
	// a standby for a voter that is unhealthy but not dead yet is held,
	// and one that no seat wants (its voter recovered, or an operator
	// added it) is removed.
	var ap *seats
	if c.TargetSize > 0 {
		s := countSeats(members, nodes, o.Now, c.DeadAfter)
		ap = &s
	}
	var waiting []string
	for _, m := range members {
		if !m.Learner {
			continue
		}
		since, seen := o.LearnerSince[m.ID]
		if !m.Started {
			if seen && o.Now.Sub(since) >= c.LearnerStartTimeout {
				a := act(RemoveMember, m.ID, m.NodeID, 0, "learner %x (node %s) has not started within %v: it blocks every later join", m.ID, m.NodeID, c.LearnerStartTimeout)
				a.Unstarted = true
				return a
			}
			waiting = append(waiting, fmt.Sprintf("learner %x (node %s) to start", m.ID, m.NodeID))
			continue
		}
		if n := nodes[m.NodeID]; !m.CaughtUp && c.DeadAfter > 0 && isDead(n, o.Now, c.DeadAfter) {
			return act(RemoveMember, m.ID, m.NodeID, 0, "learner %x (node %s) is not caught up and its node is dead (no heartbeat for %v): it blocks every later join", m.ID, m.NodeID, silence(n, o.Now))
		}
		ready, isReady := o.ReadySince[m.ID]
		if m.CaughtUp && isReady && o.Now.Sub(ready) >= c.Stabilization {
			if ap != nil && !ap.wantLearner(c.TargetSize) {
				return act(RemoveMember, m.ID, m.NodeID, 0, "learner %x (node %s) is caught up but not needed: %s", m.ID, m.NodeID, ap.met(c.TargetSize))
			}
			if ap != nil && !ap.wantVoter(c.TargetSize) {
				waiting = append(waiting, ap.standby(m, nodes, o.Now, c.DeadAfter))
				continue
			}
			return act(Promote, m.ID, m.NodeID, 0, "learner %x (node %s) has been caught up for %v", m.ID, m.NodeID, o.Now.Sub(ready).Round(time.Millisecond))
		}
		waiting = append(waiting, fmt.Sprintf("learner %x (node %s) to catch up and stay caught up for %v", m.ID, m.NodeID, c.Stabilization))
	}
	also := ""
	if len(unreadable) > 0 {
		also = fmt.Sprintf("; %s: %s", reasonUnreadable, strings.Join(unreadable, ", "))
	}
	if len(waiting) > 0 {
		return act(None, 0, "", 0, "%s %s%s", reasonWaiting, waiting[0], also)
	}
	// 5. Unreadable records hide roles: say so instead of claiming
	// convergence, and change nothing more.
	if len(unreadable) > 0 {
		return act(None, 0, "", 0, "%s: %s: their roles are unknown, so agreement with membership cannot be checked for them; everything else agrees (%d members, %d voters)", reasonUnreadable, strings.Join(unreadable, ", "), len(members), voters)
	}
	// 6. Autopilot: the size, and dead voters.
	if c.TargetSize > 0 {
		if a, ok := autopilot(o, c, members, nodes, memberOf, floor); ok {
			a.Epoch = o.Epoch
			return a
		}
	}
	return act(None, 0, "", 0, "%s: %d members (%d voters), every member's node has ConsensusMember and every node with ConsensusMember or KubernetesController is a member", reasonConverged, len(members), voters)
}

// Recheck returns the earliest instant after o.Now at which Plan could
// choose another action for the same observation, only o.Now moved on: the
// nearest of the deadlines in the package doc's table still ahead. It is
// zero when none is ahead: then no wait changes the plan, only an event (a
// watch, the next observation) does. Until the instant the plan's Kind and
// target stay those at o.Now, so a pass before it would plan what this one
// did; at it they may change, or not: a deadline that an earlier rule
// overrides (a learner's, while a change is in flight) costs one pass that
// plans the same, which is cheaper than a rule-by-rule copy of Plan here
// that would have to change with every rule. The reconciler's loop sleeps
// until it rather than until its next tick.
//
// A node's deadline counts even with DeadAfter 0: autopilot then counts the
// node dead from its last heartbeat on, which is ahead of o.Now when the
// curator's clock is ahead of the reconciler's.
func Recheck(o Observed, c Config) time.Time {
	var next time.Time
	at := func(t time.Time) {
		if t.After(o.Now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	// As Plan looks nodes up: by id, the last record of an id winning.
	nodes := make(map[string]Node, len(o.Nodes))
	for _, n := range o.Nodes {
		nodes[n.ID] = n
	}
	for _, m := range o.Members {
		if m.Learner {
			if since, seen := o.LearnerSince[m.ID]; seen && !m.Started {
				at(since.Add(c.LearnerStartTimeout))
			}
			if ready, isReady := o.ReadySince[m.ID]; isReady && m.CaughtUp {
				at(ready.Add(c.Stabilization))
			}
		}
		if n, ok := nodes[m.NodeID]; ok && !n.Healthy && !n.LastHeartbeat.IsZero() {
			at(n.silentSince().Add(c.DeadAfter))
		}
	}
	return next
}

func findMember(ms []Member, id uint64) (Member, bool) {
	for _, m := range ms {
		if m.ID == id {
			return m, true
		}
	}
	return Member{}, false
}
