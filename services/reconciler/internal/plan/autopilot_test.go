package plan

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The autopilot property test runs the planner against a model of a
// cluster whose nodes die or fall silent for a while: voters and candidate
// nodes in zones, a target size, learners that start and catch up (or, on
// a node that is silent, do not), deaths and silences at drawn times. Every
// pass is checked against the model; after the last death or silence the
// run must settle.

// pilot is the model.
type pilot struct {
	cfg     Config
	nodes   []Node
	members []Member
	deathAt map[string]time.Time // nodes that die, and when
	// nodes that fall silent at silentAt and heartbeat again at backAt
	silentAt, backAt map[string]time.Time
	joinAt           map[uint64]time.Time // when a learner has started and caught up
	epoch            int64
	nextID           uint64
	now              time.Time
	// learner clocks, kept across passes as observe.go keeps them
	learnerSince, readySince map[uint64]time.Time
	lastDeath                time.Time // the last death or return
	quorumLost               bool
}

func genPilot(t *rapid.T) *pilot {
	start := time.Unix(1_000_000, 0)
	p := &pilot{
		cfg: Config{
			TargetSize:          rapid.SampledFrom([]int{1, 3, 5}).Draw(t, "target"),
			VoterFloor:          rapid.IntRange(1, 3).Draw(t, "floor"),
			DeadAfter:           30 * time.Second,
			Stabilization:       5 * time.Second,
			LearnerStartTimeout: time.Minute,
		},
		deathAt: map[string]time.Time{}, joinAt: map[uint64]time.Time{},
		silentAt: map[string]time.Time{}, backAt: map[string]time.Time{},
		epoch: 1, nextID: 0x100, now: start, lastDeath: start,
	}
	zones := rapid.IntRange(1, 3).Draw(t, "zones")
	for i := range rapid.IntRange(1, 8).Draw(t, "nodes") {
		n := Node{
			ID: fmt.Sprintf("node-%d", i), Revision: 1, Up: rapid.IntRange(0, 5).Draw(t, fmt.Sprintf("up-%d", i)) > 0,
			Healthy: true, LastHeartbeat: start, Zone: fmt.Sprintf("zone-%d", rapid.IntRange(0, zones-1).Draw(t, fmt.Sprintf("zone-%d", i))),
		}
		if rapid.IntRange(0, 5).Draw(t, fmt.Sprintf("peer-%d", i)) > 0 {
			n.PeerURL = "https://" + n.ID + ":2380"
		}
		switch rapid.IntRange(0, 5).Draw(t, fmt.Sprintf("fate-%d", i)) {
		case 0: // dies
			at := start.Add(time.Duration(rapid.IntRange(-120, 300).Draw(t, fmt.Sprintf("death-%d", i))) * time.Second)
			p.deathAt[n.ID] = at
			if at.After(p.lastDeath) {
				p.lastDeath = at
			}
		case 1: // falls silent, for less or more than DeadAfter, and comes back
			at := start.Add(time.Duration(rapid.IntRange(0, 300).Draw(t, fmt.Sprintf("silent-%d", i))) * time.Second)
			back := at.Add(time.Duration(rapid.IntRange(1, 90).Draw(t, fmt.Sprintf("back-%d", i))) * time.Second)
			p.silentAt[n.ID], p.backAt[n.ID] = at, back
			if back.After(p.lastDeath) {
				p.lastDeath = back
			}
		}
		p.nodes = append(p.nodes, n)
	}
	// Voters to start with: a prefix of the nodes (at least one).
	for i := range rapid.IntRange(1, len(p.nodes)).Draw(t, "voters") {
		n := &p.nodes[i]
		n.ConsensusMember = true
		p.members = append(p.members, Member{ID: p.newID(), NodeID: n.ID, Started: true, CaughtUp: true})
	}
	return p
}

func (p *pilot) newID() uint64 { p.nextID++; return p.nextID }

func (p *pilot) node(id string) *Node {
	for i := range p.nodes {
		if p.nodes[i].ID == id {
			return &p.nodes[i]
		}
	}
	return nil
}

// tolerance is how many more voter failures the cluster survives.
func (p *pilot) tolerance() (n, healthy, t int) {
	for _, m := range p.members {
		if m.Learner {
			continue
		}
		n++
		if p.node(m.NodeID).Healthy {
			healthy++
		}
	}
	return n, healthy, healthy - (n/2 + 1)
}

func (p *pilot) dead(m Member) bool {
	return isDead(*p.node(m.NodeID), p.now, p.cfg.DeadAfter)
}

// world moves on to p.now: nodes die or fall silent (no more heartbeats),
// the living ones heartbeat, learners on living nodes start and catch up
// when due.
func (p *pilot) world() {
	for i := range p.nodes {
		n := &p.nodes[i]
		at, dies := p.deathAt[n.ID]
		silent, pauses := p.silentAt[n.ID]
		switch {
		case dies && !p.now.Before(at):
		case pauses && !p.now.Before(silent) && p.now.Before(p.backAt[n.ID]):
			at = silent
		default:
			n.Healthy, n.LastHeartbeat = true, p.now
			continue
		}
		if n.Healthy {
			n.Healthy, n.LastHeartbeat = false, at
		}
	}
	for i := range p.members {
		m := &p.members[i]
		switch at, ok := p.joinAt[m.ID]; {
		case !m.Learner || !ok:
		case !p.node(m.NodeID).Healthy:
			// consensus asks the learner how far it is: a dead one
			// does not answer, so it is not caught up.
			m.CaughtUp = false
		case !p.now.Before(at):
			m.Started, m.CaughtUp = true, true
		}
	}
	if _, _, t := p.tolerance(); t < 0 {
		p.quorumLost = true
	}
}

func (p *pilot) observe() Observed {
	since, ready := learnerClocks(p.members, p.learnerSince, p.readySince, p.now)
	p.learnerSince, p.readySince = since, ready
	leader := uint64(0)
	for _, m := range p.members {
		if !m.Learner && p.node(m.NodeID).Healthy {
			leader = m.ID
			break
		}
	}
	return Observed{Epoch: p.epoch, AnsweredBy: leader, Leader: leader, Members: slices.Clone(p.members), Nodes: slices.Clone(p.nodes),
		LearnerSince: since, ReadySince: ready, Now: p.now}
}

// apply carries an action out; without a quorum etcd refuses every
// membership change.
func (p *pilot) apply(t *rapid.T, a Action) {
	_, _, tol := p.tolerance()
	membership := a.Kind == RemoveMember || a.Kind == Promote || a.Kind == AddMember
	if membership && tol < 0 {
		return
	}
	switch a.Kind {
	case RemoveMember:
		p.members = slices.DeleteFunc(p.members, func(m Member) bool { return m.ID == a.MemberID })
		p.epoch++
	case Promote:
		for i := range p.members {
			if p.members[i].ID == a.MemberID {
				p.members[i].Learner = false
			}
		}
		p.epoch++
	case AddMember:
		n := p.node(a.NodeID)
		if a.PeerURL != n.PeerURL || a.NodeRevision != n.Revision {
			t.Fatalf("%v: the node's peer URL is %q, its revision %d", a, n.PeerURL, n.Revision)
		}
		id := p.newID()
		p.members = append(p.members, Member{ID: id, NodeID: n.ID, Learner: true})
		p.joinAt[id] = p.now.Add(time.Duration(rapid.IntRange(1, 20).Draw(t, "join-after")) * time.Second)
		n.ConsensusMember = true
		n.Revision++
		p.epoch++
	case RemoveRole:
		n := p.node(a.NodeID)
		n.ConsensusMember, n.KubernetesController = false, false
		n.Revision++
	case AddRole:
		n := p.node(a.NodeID)
		n.ConsensusMember = true
		n.Revision++
	}
}

// TestAutopilotProperties checks, on every pass:
//   - one learner at a time: AddMember only when no learner is in flight;
//   - a promotion only into a free seat: fewer live voters than the
//     target (a standby for a silent voter waits until it is dead);
//   - no voter removal below the floor;
//   - no healthy voter removed while a voter is dead;
//   - no step that adds, promotes or removes a dead voter lowers the
//     failure tolerance; a healthy voter goes only to shrink to the target;
//   - an added node is UP, healthy, no member, with a peer URL;
//
// and after the last death or return, unless silences took the quorum:
// the run settles (the plan changes nothing) within a bound of passes, with
// no learner left, and the target reached and no dead voter when enough
// healthy candidates exist.
func TestAutopilotProperties(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		p := genPilot(t)
		settled := 0
		for pass := 0; ; pass++ {
			if pass > 400 {
				t.Fatalf("not settled after %d passes", pass)
			}
			p.world()
			o := p.observe()
			a := Plan(o, p.cfg)
			t.Logf("pass %d at +%v: %v", pass, p.now.Sub(time.Unix(1_000_000, 0)), a)
			n, _, tolBefore := p.tolerance()
			var target *Member
			for i := range p.members {
				if p.members[i].ID == a.MemberID {
					target = &p.members[i]
				}
			}
			learners, dead := 0, 0
			for _, m := range p.members {
				if m.Learner {
					learners++
				} else if p.dead(m) {
					dead++
				}
			}
			anyDead := dead > 0
			switch a.Kind {
			case Promote:
				if n-dead >= p.cfg.TargetSize {
					t.Fatalf("%v: %d voters alive of %d make the target of %d already", a, n-dead, n, p.cfg.TargetSize)
				}
			case AddMember:
				if learners > 0 {
					t.Fatalf("%v with a learner in flight", a)
				}
				if c := p.node(a.NodeID); !c.Up || !c.Healthy || c.PeerURL == "" || slices.ContainsFunc(p.members, func(m Member) bool { return m.NodeID == c.ID }) {
					t.Fatalf("%v: the node is no candidate: %+v", a, *c)
				}
			case RemoveMember:
				if target != nil && !target.Learner {
					if n-1 < max(p.cfg.VoterFloor, 1) {
						t.Fatalf("%v: leaves %d voters, below the floor %d", a, n-1, p.cfg.VoterFloor)
					}
					if p.node(target.NodeID).Healthy && anyDead {
						t.Fatalf("%v: a healthy voter removed while a voter is dead", a)
					}
					if p.node(target.NodeID).Healthy && n <= p.cfg.TargetSize {
						t.Fatalf("%v: a healthy voter removed at %d voters, target %d", a, n, p.cfg.TargetSize)
					}
				}
			}
			healthyRemoval := a.Kind == RemoveMember && target != nil && !target.Learner && p.node(target.NodeID).Healthy
			p.apply(t, a)
			if _, _, tolAfter := p.tolerance(); !healthyRemoval && tolAfter < tolBefore && !p.quorumLost {
				t.Fatalf("%v lowered the failure tolerance from %d to %d", a, tolBefore, tolAfter)
			}

			if p.quorumLost {
				return // deaths or silences took the quorum: etcd refuses every change
			}
			if a.Kind == None || a.Kind == Refuse {
				settled++
			} else {
				settled = 0
			}
			// Settled: past the last death and every threshold, and a
			// minute of passes changed nothing.
			if p.now.After(p.lastDeath.Add(p.cfg.DeadAfter+p.cfg.LearnerStartTimeout)) && settled > 30 {
				p.checkSettled(t, a)
				return
			}
			p.now = p.now.Add(time.Duration(rapid.IntRange(1, 3).Draw(t, "step")) * time.Second)
		}
	})
}

// checkSettled: no learner is left (a standby goes once its voter is
// back); with enough healthy candidates the target is reached and no
// voter is dead.
func (p *pilot) checkSettled(t *rapid.T, last Action) {
	for _, m := range p.members {
		if m.Learner {
			t.Fatalf("settled with learner %x (node %s) left: %v", m.ID, m.NodeID, last)
		}
	}
	healthy := 0
	for _, n := range p.nodes {
		if n.Up && n.Healthy && n.PeerURL != "" {
			healthy++
		}
	}
	n, h, _ := p.tolerance()
	if healthy >= p.cfg.TargetSize && max(p.cfg.VoterFloor, 1) <= p.cfg.TargetSize && (n != p.cfg.TargetSize || h != n) {
		t.Fatalf("settled at %d voters (%d healthy) with %d healthy candidates, target %d: %v", n, h, healthy, p.cfg.TargetSize, last)
	}
}

// TestAutopilot: one scenario per autopilot decision, in a golden file
// (go test -run TestAutopilot -update rewrites it).
func TestAutopilot(t *testing.T) {
	t.Parallel()
	now := time.Unix(10_000, 0)
	ap := Config{VoterFloor: 1, Stabilization: 10 * time.Second, LearnerStartTimeout: time.Minute, TargetSize: 3, DeadAfter: 30 * time.Second}
	node := func(id, zone string, voter bool) Node {
		return Node{ID: id, Revision: 7, ConsensusMember: voter, Up: true, Healthy: true, LastHeartbeat: now, PeerURL: "https://" + id + ":2380", Zone: zone}
	}
	dead := func(n Node, silent time.Duration) Node {
		n.Healthy, n.LastHeartbeat = false, now.Add(-silent)
		return n
	}
	// maintenance puts n in maintenance until now+left.
	maintenance := func(n Node, left time.Duration) Node {
		n.MaintenanceUntil = now.Add(left)
		return n
	}
	// cluster: voters a, b, c... (members 1, 2, 3, ...) and other nodes.
	cluster := func(voters []Node, others ...Node) Observed {
		o := Observed{Epoch: 5, AnsweredBy: 1, Leader: 1, Now: now, LearnerSince: map[uint64]time.Time{}, ReadySince: map[uint64]time.Time{}}
		for i, n := range voters {
			n.ConsensusMember = true
			o.Members = append(o.Members, Member{ID: uint64(i + 1), NodeID: n.ID, Started: true, CaughtUp: true})
			o.Nodes = append(o.Nodes, n)
		}
		o.Nodes = append(o.Nodes, others...)
		return o
	}
	// standby adds n as learner 9, caught up for 20 s.
	standby := func(o Observed, n Node) Observed {
		o.Members = append(o.Members, Member{ID: 9, NodeID: n.ID, Learner: true, Started: true, CaughtUp: true})
		o.Nodes = append(o.Nodes, n)
		o.LearnerSince[9], o.ReadySince[9] = now.Add(-time.Minute), now.Add(-20*time.Second)
		return o
	}
	with := func(c Config, f func(*Config)) Config { f(&c); return c }
	// watched: the reconciler took its lease ago (Node.WatchedSince).
	watched := func(o Observed, ago time.Duration) Observed {
		for i := range o.Nodes {
			o.Nodes[i].WatchedSince = now.Add(-ago)
		}
		return o
	}
	cases := map[string]struct {
		o Observed
		c Config
	}{
		"manual: the target is 0": {cluster([]Node{node("a", "", true)}, node("x", "", false)), with(ap, func(c *Config) { c.TargetSize = 0 })},
		"grow: one voter, target 3": {cluster([]Node{node("a", "z1", true)},
			node("x", "z1", false), node("y", "z2", false)), ap},
		"grow: no candidate (no peer URL, not UP, unhealthy)": {cluster([]Node{node("a", "", true)},
			func() Node { n := node("x", "", false); n.PeerURL = ""; return n }(),
			func() Node { n := node("y", "", false); n.Up = false; return n }(),
			func() Node { n := node("z", "", false); n.Healthy = false; return n }()), ap},
		"converged at the target": {cluster([]Node{node("a", "", true), node("b", "", true), node("c", "", true)}, node("x", "", false)), ap},
		"standby: a voter unhealthy, not dead yet: a learner joins at once": {cluster([]Node{node("a", "", true), dead(node("b", "", true), 10*time.Second), node("c", "", true)}, node("x", "", false)), ap},
		"standby: a voter unhealthy, no candidate: nothing to do":           {cluster([]Node{node("a", "", true), dead(node("b", "", true), 10*time.Second), node("c", "", true)}), ap},
		"standby caught up, its voter not dead yet: held": {
			standby(cluster([]Node{node("a", "", true), dead(node("b", "", true), 10*time.Second), node("c", "", true)}), node("x", "", true)), ap},
		"standby caught up, its voter dead: promoted": {
			standby(cluster([]Node{node("a", "", true), dead(node("b", "", true), time.Minute), node("c", "", true)}), node("x", "", true)), ap},
		"standby caught up, its voter healthy again: removed": {
			standby(cluster([]Node{node("a", "", true), node("b", "", true), node("c", "", true)}), node("x", "", true)), ap},
		"replace: 3 voters, one dead: add first":                 {cluster([]Node{node("a", "", true), dead(node("b", "", true), time.Minute), node("c", "", true)}, node("x", "", false)), ap},
		"replace: the replacement is a voter: the dead one goes": {cluster([]Node{node("a", "", true), dead(node("b", "", true), time.Minute), node("c", "", true), node("x", "", true)}), ap},
		"replace: 3 voters, one dead, no candidate: wait":        {cluster([]Node{node("a", "", true), dead(node("b", "", true), time.Minute), node("c", "", true)}), ap},
		"dead voter of 2: removed first (raises the tolerance)":  {cluster([]Node{node("a", "", true), dead(node("b", "", true), time.Minute)}, node("x", "", false)), ap},
		"after a quorum loss: a voter of 2 silent for 43 s, watched for 10 s: not dead, a standby joins": {
			watched(cluster([]Node{node("a", "", true), dead(node("b", "", true), 43*time.Second)}, node("x", "", false)), 10*time.Second), ap},
		"after a quorum loss: a voter of 2 silent for 43 s, watched for 35 s: dead, removed first": {
			watched(cluster([]Node{node("a", "", true), dead(node("b", "", true), 43*time.Second)}, node("x", "", false)), 35*time.Second), ap},
		"dead voter of 2, floor 2: refused": {cluster([]Node{node("a", "", true), dead(node("b", "", true), time.Minute)}), with(ap, func(c *Config) { c.VoterFloor = 2; c.TargetSize = 1 })},
		"shrink: 5 voters, target 3, the leader stays": {cluster([]Node{node("a", "z1", true), node("b", "z1", true), node("c", "z2", true), node("d", "z2", true), node("e", "z3", true)}),
			ap},
		"shrink: an unhealthy voter first": {cluster([]Node{node("a", "", true), node("b", "", true), dead(node("c", "", true), 5*time.Second), node("d", "", true)}), ap},
		"grow: spread over zones": {cluster([]Node{node("a", "z1", true), node("b", "z1", true)},
			node("w", "z1", false), node("x", "z2", false)), ap},
		"maintenance: a voter silent for long, in maintenance: not replaced, no standby": {cluster([]Node{node("a", "", true), maintenance(dead(node("b", "", true), 10*time.Minute), time.Minute), node("c", "", true)}, node("x", "", false)), ap},
		"maintenance ended: the silent voter is dead, its replacement joins":             {cluster([]Node{node("a", "", true), maintenance(dead(node("b", "", true), 10*time.Minute), -time.Second), node("c", "", true)}, node("x", "", false)), ap},
		"maintenance: a node in maintenance is no candidate":                             {cluster([]Node{node("a", "", true)}, maintenance(node("x", "", false), time.Minute)), ap},
		"a learner behind on a dead node is removed": {func() Observed {
			o := cluster([]Node{node("a", "", true)}, dead(node("x", "", true), time.Minute))
			o.Members = append(o.Members, Member{ID: 9, NodeID: "x", Learner: true, Started: true})
			o.LearnerSince[9] = now.Add(-time.Minute)
			return o
		}(), ap},
	}
	var out strings.Builder
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		tc := cases[name]
		a := Plan(tc.o, tc.c)
		fmt.Fprintf(&out, "%s\n\t%s\n", name, describe(a))
	}
	golden(t, "testdata/autopilot.golden", out.String())
}

// TestSequence: the whole plan, in a golden file (-update rewrites it):
// from one voter to three; a dead voter replaced add-before-remove; an
// unhealthy one too, its standby joining before it is dead; a change in
// flight (nothing to sequence). Every sequence ends in nothing
// to do or a refusal, and (checked in code, not only in the file) the
// failure tolerance never drops while a dead voter is replaced.
func TestSequence(t *testing.T) {
	t.Parallel()
	now := time.Unix(10_000, 0)
	ap := Config{VoterFloor: 1, Stabilization: 10 * time.Second, LearnerStartTimeout: time.Minute, TargetSize: 3, DeadAfter: 30 * time.Second}
	node := func(id string, voter bool) Node {
		return Node{ID: id, Revision: 7, ConsensusMember: voter, Up: true, Healthy: true, LastHeartbeat: now, PeerURL: "https://" + id + ":2380"}
	}
	cluster := func(voters []Node, others ...Node) Observed {
		o := Observed{Epoch: 5, AnsweredBy: 1, Leader: 1, Now: now, LearnerSince: map[uint64]time.Time{}, ReadySince: map[uint64]time.Time{}}
		for i, n := range voters {
			o.Members = append(o.Members, Member{ID: uint64(i + 1), NodeID: n.ID, Started: true, CaughtUp: true})
			o.Nodes = append(o.Nodes, n)
		}
		o.Nodes = append(o.Nodes, others...)
		return o
	}
	deadB := node("b", true)
	deadB.Healthy, deadB.LastHeartbeat = false, now.Add(-time.Minute)
	silentB := node("b", true)
	silentB.Healthy, silentB.LastHeartbeat = false, now.Add(-10*time.Second)
	cases := map[string]Observed{
		"grow 1 → 3":                 cluster([]Node{node("a", true)}, node("x", false), node("y", false)),
		"replace a dead voter":       cluster([]Node{node("a", true), deadB, node("c", true)}, node("x", false)),
		"replace an unhealthy voter": cluster([]Node{node("a", true), silentB, node("c", true)}, node("x", false)),
		"change in flight": func() Observed {
			o := cluster([]Node{node("a", true)}, node("x", false))
			o.Pending = "add node z"
			return o
		}(),
	}
	var out strings.Builder
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		steps := Sequence(cases[name], ap)
		fmt.Fprintf(&out, "%s\n", name)
		for i, s := range steps {
			fmt.Fprintf(&out, "\t%d. %s\n\t   voters=%d healthy=%d tolerance=%d\n", i+1, strings.ReplaceAll(describe(s.Action), "\n\t", "\n\t   "), s.Voters, s.Healthy, s.FailureTolerance)
			if i > 0 && strings.HasPrefix(name, "replace") && s.FailureTolerance < steps[i-1].FailureTolerance {
				t.Errorf("%s: step %d lowers the failure tolerance: %v", name, i+1, s)
			}
		}
		if last := steps[len(steps)-1].Action; last.Kind != None && last.Kind != Refuse {
			t.Errorf("%s: the sequence ends at %v, not at nothing to do", name, last)
		}
	}
	golden(t, "testdata/sequence.golden", out.String())
}
