package plan

import (
	"maps"
	"slices"
	"time"
)

// Step is one action of a sequence, with the cluster as it is once the
// action is done: its voters, how many of them are healthy, and the
// failure tolerance, how many more voter failures it survives (healthy −
// quorum; negative: no quorum).
type Step struct {
	Action           Action
	Voters, Healthy  int
	FailureTolerance int
}

// maxSteps bounds a sequence: more than any cluster of 7 voters needs to
// reach its target from anywhere.
const maxSteps = 32

// Sequence is the whole plan from o: the action the next pass would take,
// then the one after it, and so on, as if every step went as planned — a
// learner added starts and catches up, a promotion and a removal apply, a
// role write lands, the stabilisation window passes — until the plan is to
// do nothing (converged, or waiting for what no step brings: a change in
// flight, unreadable records, a node to replace a dead voter with) or
// refuses, which is the last step. A wait for a learner is a step too,
// after which the learner is caught up; a standby learner's wait for its
// unhealthy voter ends at the voter's dead node threshold, as if the voter
// stays silent. Members the sequence adds have placeholder ids (above
// every real one). The real passes plan anew from
// what they observe, so a step that goes otherwise changes the rest: the
// sequence says what the reconciler intends now, and why.
func Sequence(o Observed, c Config) []Step {
	o = o.clone()
	var steps []Step
	for range maxSteps {
		a := Plan(o, c)
		switch {
		case a.Kind == None && o.Pending == "" && waitingForLearner(o):
			steps = append(steps, o.step(a))
			if o.catchUp(c) {
				continue
			}
			// Every learner is caught up already: a standby waits for
			// its voter's dead node threshold, as if the voter stays
			// silent.
			next := Recheck(o, c)
			if next.IsZero() {
				return steps
			}
			o.Now = next
		case a.Kind == None || a.Kind == Refuse:
			return append(steps, o.step(a))
		default:
			o.apply(a)
			steps = append(steps, o.step(a))
		}
	}
	return steps
}

func (o *Observed) clone() Observed {
	c := *o
	c.Members = slices.Clone(o.Members)
	c.Nodes = slices.Clone(o.Nodes)
	c.LearnerSince = map[uint64]time.Time{}
	maps.Copy(c.LearnerSince, o.LearnerSince)
	c.ReadySince = map[uint64]time.Time{}
	maps.Copy(c.ReadySince, o.ReadySince)
	return c
}

func waitingForLearner(o Observed) bool {
	return slices.ContainsFunc(o.Members, func(m Member) bool { return m.Learner })
}

// catchUp lets every learner start and stay caught up past the window,
// and reports whether one had not yet.
func (o *Observed) catchUp(c Config) bool {
	moved := false
	for i := range o.Members {
		m := &o.Members[i]
		if !m.Learner {
			continue
		}
		if ready, ok := o.ReadySince[m.ID]; !m.Started || !m.CaughtUp || !ok || o.Now.Sub(ready) < c.Stabilization {
			m.Started, m.CaughtUp = true, true
			o.ReadySince[m.ID] = o.Now.Add(-c.Stabilization)
			moved = true
		}
	}
	return moved
}

// apply carries a out on the snapshot as its resources would.
func (o *Observed) apply(a Action) {
	node := func(id string) *Node {
		for i := range o.Nodes {
			if o.Nodes[i].ID == id {
				return &o.Nodes[i]
			}
		}
		return nil
	}
	switch a.Kind {
	case RemoveMember:
		o.Members = slices.DeleteFunc(o.Members, func(m Member) bool { return m.ID == a.MemberID })
		o.Epoch++
	case Promote:
		for i := range o.Members {
			if o.Members[i].ID == a.MemberID {
				o.Members[i].Learner = false
			}
		}
		o.Epoch++
	case AddMember:
		id := uint64(1)
		for _, m := range o.Members {
			id = max(id, m.ID+1)
		}
		o.Members = append(o.Members, Member{ID: id, NodeID: a.NodeID, Learner: true})
		o.LearnerSince[id] = o.Now
		if n := node(a.NodeID); n != nil {
			n.ConsensusMember = true
			n.Revision++
		}
		o.Epoch++
	case AddRole:
		if n := node(a.NodeID); n != nil {
			n.ConsensusMember = true
			n.Revision++
		}
	case RemoveRole:
		if n := node(a.NodeID); n != nil {
			n.ConsensusMember, n.KubernetesController = false, false
			n.Revision++
		}
	}
}

// step is a with the voters and failure tolerance of o (after a).
func (o *Observed) step(a Action) Step {
	healthy := map[string]bool{}
	for _, n := range o.Nodes {
		healthy[n.ID] = n.Healthy
	}
	s := Step{Action: a}
	for _, m := range o.Members {
		if m.Learner {
			continue
		}
		s.Voters++
		if healthy[m.NodeID] {
			s.Healthy++
		}
	}
	s.FailureTolerance = failureTolerance(s.Voters, s.Healthy)
	return s
}
