package plan

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var cfg = Config{VoterFloor: 1, Stabilization: 10 * time.Second, LearnerStartTimeout: time.Minute}

// state is a model of etcd membership and the node registry that the
// property tests apply actions to, as the reconciler's act step would.
type state struct {
	members      []Member
	nodes        []Node
	answeredBy   uint64
	epoch        int64
	now          time.Time
	learnerSince map[uint64]time.Time
	readySince   map[uint64]time.Time
}

// observe is what the reconciler sees, keeping its learner clocks as the
// real one does.
func (s *state) observe() Observed {
	for _, m := range s.members {
		if !m.Learner {
			continue
		}
		if _, ok := s.learnerSince[m.ID]; !ok {
			s.learnerSince[m.ID] = s.now
		}
		if _, ok := s.readySince[m.ID]; !ok && m.CaughtUp {
			s.readySince[m.ID] = s.now
		}
	}
	return Observed{Epoch: s.epoch, AnsweredBy: s.answeredBy, Members: append([]Member(nil), s.members...), Nodes: append([]Node(nil), s.nodes...),
		LearnerSince: s.learnerSince, ReadySince: s.readySince, Now: s.now}
}

func (s *state) node(id string) *Node {
	for i := range s.nodes {
		if s.nodes[i].ID == id {
			return &s.nodes[i]
		}
	}
	return nil
}

func (s *state) voters() int {
	v := 0
	for _, m := range s.members {
		if !m.Learner {
			v++
		}
	}
	return v
}

// apply carries an action out on the model and moves time and the epoch on.
func (s *state) apply(t *rapid.T, a Action) {
	switch a.Kind {
	case RemoveMember:
		out := s.members[:0]
		for _, m := range s.members {
			if m.ID != a.MemberID {
				out = append(out, m)
			}
		}
		s.members = out
		s.epoch++
	case AddRole:
		s.node(a.NodeID).ConsensusMember = true
	case RemoveRole:
		n := s.node(a.NodeID)
		n.ConsensusMember, n.KubernetesController = false, false
	case Promote:
		for i := range s.members {
			if s.members[i].ID == a.MemberID {
				s.members[i].Learner = false
			}
		}
		s.epoch++
	}
	s.now = s.now.Add(2 * cfg.LearnerStartTimeout)
}

func genState(t *rapid.T) *state {
	s := &state{epoch: rapid.Int64Range(1, 1000).Draw(t, "epoch"), now: time.Unix(1_000_000, 0),
		learnerSince: map[uint64]time.Time{}, readySince: map[uint64]time.Time{}}
	nNodes := rapid.IntRange(1, 6).Draw(t, "nodes")
	for i := range nNodes {
		cm := rapid.Bool().Draw(t, fmt.Sprintf("cm%d", i))
		s.nodes = append(s.nodes, Node{ID: fmt.Sprintf("node-%d", i), Revision: int64(100 + i), ConsensusMember: cm,
			KubernetesController: cm && rapid.Bool().Draw(t, fmt.Sprintf("kc%d", i))})
	}
	id := uint64(1)
	learner := false
	addMember := func(node string, label string) {
		isLearner := !learner && rapid.IntRange(0, 3).Draw(t, "learner"+label) == 0
		learner = learner || isLearner
		started := !isLearner || rapid.Bool().Draw(t, "started"+label)
		s.members = append(s.members, Member{ID: id, NodeID: node, Learner: isLearner, Started: started,
			CaughtUp: isLearner && started && rapid.Bool().Draw(t, "caughtup"+label)})
		id++
	}
	for i, n := range s.nodes {
		if rapid.Bool().Draw(t, fmt.Sprintf("member%d", i)) {
			addMember(n.ID, n.ID)
		}
	}
	for i := range rapid.IntRange(0, 2).Draw(t, "ghosts") {
		addMember(fmt.Sprintf("ghost-%d", i), fmt.Sprintf("ghost%d", i))
	}
	if s.voters() == 0 {
		s.members = append(s.members, Member{ID: id, NodeID: s.nodes[0].ID, Started: true})
		// one member per node
		for i := 0; i < len(s.members)-1; i++ {
			if s.members[i].NodeID == s.nodes[0].ID {
				s.members = append(s.members[:i], s.members[i+1:]...)
				break
			}
		}
	}
	ids := make([]uint64, 0, len(s.members))
	for _, m := range s.members {
		ids = append(ids, m.ID)
	}
	s.answeredBy = rapid.SampledFrom(ids).Draw(t, "answeredBy")
	return s
}

// TestPlanProperties: from any state, repeated passes converge; no pass
// removes a member whose node exists (but for a learner that never
// started in time), the last voter, or a voter below the floor; no learner
// is promoted before it stayed caught up for the window; no state
// has KubernetesController without ConsensusMember; every action carries
// the snapshot's epoch; a broken mapping is refused.
func TestPlanProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := genState(t)
		limit := 2*(len(s.members)+len(s.nodes)) + 4
		for pass := 0; ; pass++ {
			o := s.observe()
			a := Plan(o, cfg)
			if a.Epoch != o.Epoch {
				t.Fatalf("action %v carries epoch %d, snapshot has %d", a, a.Epoch, o.Epoch)
			}
			answered, ok := findMember(o.Members, o.AnsweredBy)
			if !ok || s.node(answered.NodeID) == nil {
				if a.Kind != Refuse {
					t.Fatalf("answering member is not a node, yet the plan is %v", a)
				}
				return
			}
			if a.Kind == Refuse || a.Kind == None {
				if a.Kind == None && !strings.HasPrefix(a.Reason, "waiting") {
					checkConverged(t, s)
				}
				return
			}
			if a.Kind == RemoveMember {
				m, _ := findMember(o.Members, a.MemberID)
				if s.node(m.NodeID) != nil && !(m.Learner && !m.Started) {
					t.Fatalf("removes member %v whose node exists", m)
				}
				if !m.Learner && s.voters()-1 < max(cfg.VoterFloor, 1) {
					t.Fatalf("removes voter %v below the floor (%d voters)", m, s.voters())
				}
			}
			if a.Kind == Promote {
				m, _ := findMember(o.Members, a.MemberID)
				ready, ok := o.ReadySince[m.ID]
				if !m.Learner || !m.Started || !m.CaughtUp || !ok || o.Now.Sub(ready) < cfg.Stabilization {
					t.Fatalf("promotes %v before it stayed caught up for %v", m, cfg.Stabilization)
				}
			}
			s.apply(t, a)
			for _, n := range s.nodes {
				if n.KubernetesController && !n.ConsensusMember {
					t.Fatalf("after %v node %s has KubernetesController without ConsensusMember", a, n.ID)
				}
			}
			if pass > limit {
				t.Fatalf("no convergence after %d passes; last action %v", pass, a)
			}
		}
	})
}

// checkConverged: every member belongs to a node with ConsensusMember and
// every ConsensusMember node is a member.
func checkConverged(t *rapid.T, s *state) {
	members := map[string]bool{}
	for _, m := range s.members {
		n := s.node(m.NodeID)
		if n == nil || !n.ConsensusMember {
			t.Fatalf("converged, but member %v has no node with ConsensusMember", m)
		}
		members[m.NodeID] = true
	}
	for _, n := range s.nodes {
		if n.ConsensusMember && !members[n.ID] {
			t.Fatalf("converged, but node %s has ConsensusMember without membership", n.ID)
		}
	}
}

// TestBackgroundSyncEtcd follows Metropolis' test of the same name: a
// member without the role gets it; an extra member with no node is removed
// while roles stay; then the stale roles go; then nothing changes.
func TestBackgroundSyncEtcd(t *testing.T) {
	s := Observed{Epoch: 7, AnsweredBy: 1, Now: time.Unix(0, 0),
		Members: []Member{{ID: 1, NodeID: "leader", Started: true}},
		Nodes:   []Node{{ID: "leader", Revision: 10}}}
	step := func(want Kind, node string) Action {
		t.Helper()
		a := Plan(s, cfg)
		if a.Kind != want || (node != "" && a.NodeID != node) || a.Epoch != s.Epoch {
			t.Fatalf("got %v, want %v on %q at epoch %d", a, want, node, s.Epoch)
		}
		return a
	}
	step(AddRole, "leader")
	s.Nodes[0].ConsensusMember = true

	s.Nodes = append(s.Nodes, Node{ID: "new", Revision: 11, ConsensusMember: true, KubernetesController: true})
	s.Members = append(s.Members, Member{ID: 2, NodeID: "foo", Learner: true})
	a := step(RemoveMember, "foo")
	if a.MemberID != 2 {
		t.Fatalf("removes member %x, want 2", a.MemberID)
	}
	s.Members = s.Members[:1]

	a = step(RemoveRole, "new")
	if a.NodeRevision != 11 {
		t.Fatalf("role write at revision %d, want the read 11", a.NodeRevision)
	}
	s.Nodes[1].ConsensusMember, s.Nodes[1].KubernetesController = false, false
	step(None, "")
	step(None, "")
}

func TestGuardsAndLearners(t *testing.T) {
	base := func() Observed {
		return Observed{Epoch: 3, AnsweredBy: 1, Now: time.Unix(1000, 0),
			Members:      []Member{{ID: 1, NodeID: "a", Started: true}, {ID: 2, NodeID: "b", Started: true}},
			Nodes:        []Node{{ID: "a", ConsensusMember: true}, {ID: "b", ConsensusMember: true}},
			LearnerSince: map[uint64]time.Time{}, ReadySince: map[uint64]time.Time{}}
	}
	cases := map[string]struct {
		mutate func(*Observed)
		c      Config
		want   Kind
		says   string
	}{
		"converged":                   {func(o *Observed) {}, cfg, None, "converged"},
		"answering member unknown":    {func(o *Observed) { o.AnsweredBy = 9 }, cfg, Refuse, "not in it"},
		"answering member not a node": {func(o *Observed) { o.Nodes = o.Nodes[1:] }, cfg, Refuse, "not a cluster node"},
		"most members match no node": {func(o *Observed) {
			o.Members = append(o.Members, Member{ID: 3, NodeID: "x", Started: true}, Member{ID: 4, NodeID: "y", Started: true}, Member{ID: 5, NodeID: "z", Started: true})
		}, cfg, Refuse, "mapping looks broken"},
		"voter floor": {func(o *Observed) { o.Nodes = o.Nodes[:1] }, Config{VoterFloor: 2}, Refuse, "below the floor"},
		"learner not started, young": {func(o *Observed) {
			o.Members = append(o.Members, Member{ID: 3, NodeID: "c", Learner: true})
			o.Nodes = append(o.Nodes, Node{ID: "c", ConsensusMember: true})
			o.LearnerSince[3] = o.Now.Add(-time.Second)
		}, cfg, None, "to start"},
		"learner not started, too long": {func(o *Observed) {
			o.Members = append(o.Members, Member{ID: 3, NodeID: "c", Learner: true})
			o.Nodes = append(o.Nodes, Node{ID: "c", ConsensusMember: true})
			o.LearnerSince[3] = o.Now.Add(-2 * time.Minute)
		}, cfg, RemoveMember, "has not started"},
		"learner caught up, inside the window": {func(o *Observed) {
			o.Members = append(o.Members, Member{ID: 3, NodeID: "c", Learner: true, Started: true, CaughtUp: true})
			o.Nodes = append(o.Nodes, Node{ID: "c", ConsensusMember: true})
			o.ReadySince[3] = o.Now.Add(-time.Second)
		}, cfg, None, "catch up"},
		"learner caught up, window passed": {func(o *Observed) {
			o.Members = append(o.Members, Member{ID: 3, NodeID: "c", Learner: true, Started: true, CaughtUp: true})
			o.Nodes = append(o.Nodes, Node{ID: "c", ConsensusMember: true})
			o.ReadySince[3] = o.Now.Add(-time.Minute)
		}, cfg, Promote, "caught up"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := base()
			tc.mutate(&o)
			a := Plan(o, tc.c)
			if a.Kind != tc.want || !strings.Contains(a.Reason, tc.says) {
				t.Fatalf("got %v, want %v saying %q", a, tc.want, tc.says)
			}
		})
	}
}
