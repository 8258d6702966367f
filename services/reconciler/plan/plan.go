// Package plan decides the reconciler's next step: a pure function from what
// it observed (etcd membership, the node registry, when learners were first
// seen) to at most one action. etcd membership is the source of truth; the
// rules are Metropolis' background etcd sync (DESIGN §6), in its order, plus
// learner promotion, stale learner removal and a voter floor.
//
//	observe: epoch → members → nodes     plan(observed) → action     act: one fenced call, then observe again
package plan

import (
	"cmp"
	"fmt"
	"slices"
	"time"
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
	Revision             int64
	ConsensusMember      bool
	KubernetesController bool
}

// Observed is one snapshot, read in this order: the membership epoch, the
// member list, the nodes (members before nodes, so a node created in
// between cannot look missing).
type Observed struct {
	Epoch int64
	// AnsweredBy is the member that answered the member list.
	AnsweredBy uint64
	Members    []Member
	Nodes      []Node
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
}

// Kind is what an action does.
type Kind int

// The actions, one per pass.
const (
	// None: converged, or waiting (Reason says for what).
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
)

func (k Kind) String() string {
	return [...]string{"none", "refuse", "remove-member", "add-role", "remove-role", "promote"}[k]
}

// Action is the planned step.
type Action struct {
	Kind         Kind
	MemberID     uint64
	NodeID       string
	NodeRevision int64
	// Epoch is the snapshot's membership epoch: every action is fenced on
	// it, so a plan made from a stale snapshot changes nothing.
	Epoch  int64
	Reason string
}

func (a Action) String() string {
	if a.Kind == None || a.Kind == Refuse {
		return fmt.Sprintf("%s: %s", a.Kind, a.Reason)
	}
	return fmt.Sprintf("%s member=%x node=%s: %s", a.Kind, a.MemberID, a.NodeID, a.Reason)
}

// Plan returns the one action to take next.
func Plan(o Observed, c Config) Action {
	floor := max(c.VoterFloor, 1)
	act := func(k Kind, m uint64, node string, rev int64, why string, args ...any) Action {
		return Action{Kind: k, MemberID: m, NodeID: node, NodeRevision: rev, Epoch: o.Epoch, Reason: fmt.Sprintf(why, args...)}
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
	// remove both memberships and roles.
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
	for _, m := range members {
		if _, ok := nodes[m.NodeID]; ok {
			continue
		}
		if !m.Learner && voters-1 < floor {
			return act(Refuse, m.ID, m.NodeID, 0, "member %x has no node, but removing it would leave %d voters, below the floor of %d", m.ID, voters-1, floor)
		}
		return act(RemoveMember, m.ID, m.NodeID, 0, "etcd member %x belongs to node %q, which does not exist", m.ID, m.NodeID)
	}

	ids := make([]string, 0, len(nodes))
	for id := range nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	// 2. A node that is an etcd member gets ConsensusMember.
	for _, id := range ids {
		n := nodes[id]
		if m, ok := memberOf[id]; ok && !n.ConsensusMember {
			return act(AddRole, m.ID, id, n.Revision, "node %s is etcd member %x but lacks ConsensusMember", id, m.ID)
		}
	}
	// 3. A node with ConsensusMember that is not an etcd member loses it,
	// and KubernetesController with it (it requires ConsensusMember).
	for _, id := range ids {
		n := nodes[id]
		if _, ok := memberOf[id]; !ok && n.ConsensusMember {
			return act(RemoveRole, 0, id, n.Revision, "node %s has ConsensusMember but is not an etcd member", id)
		}
	}

	// 4. Learners: remove one that never started in time; promote one that
	// stayed caught up for the stabilisation window.
	var waiting []string
	for _, m := range members {
		if !m.Learner {
			continue
		}
		since, seen := o.LearnerSince[m.ID]
		if !m.Started {
			if seen && o.Now.Sub(since) >= c.LearnerStartTimeout {
				return act(RemoveMember, m.ID, m.NodeID, 0, "learner %x (node %s) has not started within %v: it blocks every later join", m.ID, m.NodeID, c.LearnerStartTimeout)
			}
			waiting = append(waiting, fmt.Sprintf("learner %x (node %s) to start", m.ID, m.NodeID))
			continue
		}
		ready, isReady := o.ReadySince[m.ID]
		if m.CaughtUp && isReady && o.Now.Sub(ready) >= c.Stabilization {
			return act(Promote, m.ID, m.NodeID, 0, "learner %x (node %s) has been caught up for %v", m.ID, m.NodeID, o.Now.Sub(ready).Round(time.Millisecond))
		}
		waiting = append(waiting, fmt.Sprintf("learner %x (node %s) to catch up and stay caught up for %v", m.ID, m.NodeID, c.Stabilization))
	}
	if len(waiting) > 0 {
		return act(None, 0, "", 0, "waiting for %s", waiting[0])
	}
	return act(None, 0, "", 0, "converged: %d members (%d voters), every member's node has ConsensusMember and every ConsensusMember node is a member", len(members), voters)
}

func findMember(ms []Member, id uint64) (Member, bool) {
	for _, m := range ms {
		if m.ID == id {
			return m, true
		}
	}
	return Member{}, false
}
