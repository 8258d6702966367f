package plan

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Autopilot (rule 6) keeps Config.TargetSize voters and replaces dead ones.
// It runs only when rules 1–5 found nothing to do: roles and membership
// agree, no learner is in flight, no change is pending, every record reads.
// It takes one step per pass, like every rule, and the next pass sees what
// the step did.
//
// A voter is dead when its node has been unhealthy, without a heartbeat,
// for Config.DeadAfter while the reconciler watched (Node.WatchedSince:
// the time no curator leader took heartbeats, during a quorum loss or a
// recovery, does not count). Unhealthy for less, it counts as alive: a
// node that restarts is not replaced. A node in maintenance (Node.maintenance,
// until its end) is neither dead nor suspect, however long it is silent,
// and no candidate for a new voter.
//
// Failure tolerance. With n voters of which h are healthy, etcd needs a
// quorum of q(n) = ⌊n/2⌋+1 and survives t(n, h) = h − q(n) more voter
// failures. Since q(n+1) − q(n) is 1 for odd n and 0 for even n:
//
//	adding a healthy voter     t(n+1, h+1) = t + 1 − [n odd]   never lowers t
//	removing a dead voter      t(n−1, h)   = t + [n even]      never lowers t
//	removing a healthy voter   t(n−1, h−1) = t − [n odd]
//
// So a dead voter is replaced add-before-remove: the replacement joins as a
// learner (which no quorum counts), is promoted once caught up, and then
// the dead voter goes (n+1 is even: its removal raises t). The exception
// is an even n: there the dead voter makes the quorum worse than its
// removal would, so it goes first, at once, without waiting for a
// replacement to catch up. Neither order lowers t at any step; no removal
// goes below the floor (Config.VoterFloor, the cluster's min_quorum), and
// a healthy voter is never removed while a dead one is left.
//
// The replacement need not wait for the death: a voter unhealthy for
// less than DeadAfter is suspect, and a learner joins for it at once, a
// standby (seats.wantLearner counts suspects as gone). Rule 4 holds the
// standby as a learner while its voter is only suspect (seats.wantVoter
// counts them as alive), promotes it the moment the voter is dead, and
// removes it once caught up if the voter recovered. A learner changes no
// quorum, so t is as above at every step; what the standby saves is
// etcd's join, which it does while the threshold runs.
//
// Choices are deterministic: a new voter from the zone (node label "zone")
// with the fewest voters, then the lowest node id; a voter to remove the
// dead one silent longest, then an unhealthy one, then one from the zone
// with the most voters, not the etcd leader when another will do, then
// the highest node id.
func autopilot(o Observed, c Config, members []Member, nodes map[string]Node, memberOf map[string]Member, floor int) (Action, bool) {
	s := countSeats(members, nodes, o.Now, c.DeadAfter)
	var voters []Member
	for _, m := range members {
		if !m.Learner { // rule 4 waits for every learner before autopilot runs
			voters = append(voters, m)
		}
	}
	dead := s.dead
	n, target := s.voters, c.TargetSize
	healthy := 0
	zones := map[string]int{}
	for _, m := range voters {
		if nodes[m.NodeID].Healthy {
			healthy++
		}
		zones[nodes[m.NodeID].Zone]++
	}
	t := failureTolerance(n, healthy)
	act := func(k Kind, m uint64, node string, why string, args ...any) (Action, bool) {
		return Action{Kind: k, MemberID: m, NodeID: node, Reason: fmt.Sprintf(why, args...)}, true
	}

	// An even number of voters with a dead one: its removal raises the
	// failure tolerance now.
	if len(dead) > 0 && n%2 == 0 && n-1 >= floor {
		d := dead[0]
		return act(RemoveMember, d.ID, d.NodeID, "voter %x (node %s) is dead (no heartbeat for %v); with %d voters, an even number, its removal raises the failure tolerance from %d to %d",
			d.ID, d.NodeID, silence(nodes[d.NodeID], o.Now), n, t, failureTolerance(n-1, healthy))
	}

	// Fewer voters in good health than the target: add one (grow, a
	// replacement that joins before the dead voter goes, or a standby for
	// an unhealthy one).
	if s.wantLearner(target) {
		if cand, ok := candidate(o.Nodes, memberOf, zones, o.Now); ok {
			a, _ := act(AddMember, 0, cand.ID, "%s: node %s joins as a learner (zone %q)", s.why(target, nodes, o.Now, c.DeadAfter), cand.ID, cand.Zone)
			a.NodeRevision, a.PeerURL = cand.Revision, cand.PeerURL
			return a, true
		}
	}

	// More voters than the target: remove one.
	if n > target {
		r := removal(voters, dead, nodes, zones, o.Leader)
		why := fmt.Sprintf("%d voters, the target is %d", n, target)
		if len(dead) > 0 {
			why = fmt.Sprintf("voter %x (node %s) is dead (no heartbeat for %v) and %d live voters make the target of %d", r.ID, r.NodeID, silence(nodes[r.NodeID], o.Now), n-len(dead), target)
		}
		if n-1 < floor {
			a, _ := act(Refuse, r.ID, r.NodeID, "%s, but removing voter %x would leave %d voters, below the floor of %d", why, r.ID, n-1, floor)
			a.Refused = RemoveMember
			return a, true
		}
		return act(RemoveMember, r.ID, r.NodeID, "%s: removing voter %x (node %s)", why, r.ID, r.NodeID)
	}

	if len(dead) > 0 {
		d := dead[0]
		return act(None, 0, "", "%s a node to replace dead voter %x (node %s, no heartbeat for %v): no node is UP, healthy, not in maintenance, no member and reports a consensus peer URL; with %d voters removing it first would not raise the failure tolerance (%d)",
			reasonWaiting, d.ID, d.NodeID, silence(nodes[d.NodeID], o.Now), n, t)
	}
	if n < target {
		return act(None, 0, "", "%s nodes to grow to %d voters (%d now): no node is UP, healthy, not in maintenance, no member and reports a consensus peer URL", reasonWaiting, target, n)
	}
	return Action{}, false
}

// failureTolerance is how many more voter failures n voters of which
// healthy are healthy survive: healthy − quorum (negative: no quorum).
func failureTolerance(n, healthy int) int { return healthy - (n/2 + 1) }

// isDead reports whether n has been unhealthy, without a heartbeat, for
// at least after, counted from when the reconciler began to watch at the
// earliest (Node.WatchedSince). A node that never sent one is not dead:
// nothing says since when it is silent.
func isDead(n Node, now time.Time, after time.Duration) bool {
	return !n.Healthy && !n.LastHeartbeat.IsZero() && now.Sub(n.silentSince()) >= after
}

func silence(n Node, now time.Time) time.Duration { return now.Sub(n.LastHeartbeat).Round(time.Second) }

// seats is what autopilot counts of the voters: how many there are, which
// are dead, and which are suspect: unhealthy after a heartbeat, but silent
// for less than DeadAfter. Each list has the voter silent longest first.
type seats struct {
	voters        int
	dead, suspect []Member
}

func countSeats(members []Member, nodes map[string]Node, now time.Time, deadAfter time.Duration) seats {
	var s seats
	for _, m := range members {
		if m.Learner {
			continue
		}
		s.voters++
		switch n := nodes[m.NodeID]; {
		case n.inMaintenance(now):
			// Down on purpose, for a bounded time: not replaced.
		case isDead(n, now, deadAfter):
			s.dead = append(s.dead, m)
		case !n.Healthy && !n.LastHeartbeat.IsZero():
			s.suspect = append(s.suspect, m)
		}
	}
	bySilence := func(a, b Member) int {
		return nodes[a.NodeID].LastHeartbeat.Compare(nodes[b.NodeID].LastHeartbeat)
	}
	slices.SortStableFunc(s.dead, bySilence)
	slices.SortStableFunc(s.suspect, bySilence)
	return s
}

// wantLearner reports whether a learner has a seat to take: fewer voters
// than the target are neither dead nor suspect. The seat is free now (a
// dead voter's, or one below the target: wantVoter) or may be soon (a
// suspect voter's: the learner stands by).
func (s seats) wantLearner(target int) bool {
	return s.voters-len(s.dead)-len(s.suspect) < target
}

// wantVoter reports whether a promotion takes a free seat: fewer voters
// than the target are alive.
func (s seats) wantVoter(target int) bool { return s.voters-len(s.dead) < target }

// met says why no learner is wanted.
func (s seats) met(target int) string {
	return fmt.Sprintf("the target of %d voters is met without it (%d voters, %d of them dead or unhealthy)", target, s.voters, len(s.dead)+len(s.suspect))
}

// standby says what learner m, caught up but not promoted, waits for:
// the suspect voter it stands by for (wantLearner and not wantVoter, so
// there is one) to recover, or to be dead.
func (s seats) standby(m Member, nodes map[string]Node, now time.Time, deadAfter time.Duration) string {
	v := s.suspect[0]
	return fmt.Sprintf("voter %x (node %s) to recover or to be dead (no heartbeat for %v of %v): learner %x (node %s) stands by to replace it",
		v.ID, v.NodeID, silence(nodes[v.NodeID], now), deadAfter, m.ID, m.NodeID)
}

// why says why a learner joins.
func (s seats) why(target int, nodes map[string]Node, now time.Time, deadAfter time.Duration) string {
	switch {
	case len(s.dead) > 0:
		d := s.dead[0]
		return fmt.Sprintf("voter %x (node %s) is dead (no heartbeat for %v): its replacement joins before it is removed", d.ID, d.NodeID, silence(nodes[d.NodeID], now))
	case s.voters < target:
		return fmt.Sprintf("%d voters, the target is %d", s.voters, target)
	default:
		v := s.suspect[0]
		return fmt.Sprintf("voter %x (node %s) is unhealthy (no heartbeat for %v): a standby joins now, to replace it if it stays silent for %v, or to go if it recovers", v.ID, v.NodeID, silence(nodes[v.NodeID], now), deadAfter)
	}
}

// candidate is the node to add: UP, healthy, not a member, with a
// consensus peer URL; from the zone with the fewest voters, then the
// lowest id.
func candidate(nodes []Node, memberOf map[string]Member, zones map[string]int, now time.Time) (Node, bool) {
	var cs []Node
	for _, n := range nodes {
		if _, member := memberOf[n.ID]; member || !n.Up || !n.Healthy || n.Unreadable || n.PeerURL == "" || n.inMaintenance(now) {
			continue
		}
		cs = append(cs, n)
	}
	if len(cs) == 0 {
		return Node{}, false
	}
	return slices.MinFunc(cs, func(a, b Node) int {
		return cmp.Or(cmp.Compare(zones[a.Zone], zones[b.Zone]), cmp.Compare(a.ID, b.ID))
	}), true
}

// removal is the voter to remove: the dead one silent longest; else an
// unhealthy one; else one from the zone with the most voters, not the
// leader when another will do, then the highest node id.
func removal(voters, dead []Member, nodes map[string]Node, zones map[string]int, leader uint64) Member {
	if len(dead) > 0 {
		return dead[0]
	}
	rank := func(m Member) (unhealthy, notLeader, zone int) {
		n := nodes[m.NodeID]
		if !n.Healthy {
			unhealthy = 1
		}
		if m.ID != leader {
			notLeader = 1
		}
		return unhealthy, notLeader, zones[n.Zone]
	}
	return slices.MaxFunc(voters, func(a, b Member) int {
		ua, la, za := rank(a)
		ub, lb, zb := rank(b)
		return cmp.Or(cmp.Compare(ua, ub), cmp.Compare(la, lb), cmp.Compare(za, zb), cmp.Compare(a.NodeID, b.NodeID))
	})
}
