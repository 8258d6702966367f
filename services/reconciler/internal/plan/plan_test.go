package plan

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

var cfg = Config{VoterFloor: 1, Stabilization: 10 * time.Second, LearnerStartTimeout: time.Minute}

// TestMain has rapid check 1000 generated cases rather than 100, unless
// -rapid.checks or RAPID_CHECKS says otherwise: a case takes microseconds,
// and some shapes the properties need (the last voter's node gone with the
// floor at 0, a node-less learner at the floor) come up in a few cases in a
// hundred.
func TestMain(m *testing.M) {
	flag.Parse()
	set := os.Getenv("RAPID_CHECKS") != ""
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if !set {
		if err := flag.Set("rapid.checks", "1000"); err != nil {
			panic(err)
		}
	}
	m.Run()
}

// The property test drives the planner against a model of etcd membership,
// the node registry and the clock, as the reconciler's loop would: the world
// moves (learners start, catch up and fall behind, a change in flight ends,
// an unreadable record is repaired), the reconciler observes, plans, and
// acts on the model; the clock advances by drawn amounts between passes.
// Every pass is checked against the model, not against the planner's own
// inputs: each refusal and each wait must have a cause that is true in the
// model, and every run must end, within a bound of passes, converged or at a
// justified refusal that only an operator can lift.

// schedule is how a learner behaves over time, drawn with the case.
type schedule struct {
	starts    bool      // false: it never starts; the timeout must remove it
	startAt   time.Time // when it starts (if it does)
	catchUpAt time.Time // when it is (next) caught up, once started
	flaps     int       // how many more times it may fall behind
}

// model is etcd membership, the node registry and the clock.
type model struct {
	cfg     Config
	members []Member
	// nodes are the true records. An Unreadable one keeps roles that the
	// reconciler passes on as they are: the planner must not use them.
	nodes    []Node
	repairAt map[string]time.Time // unreadable records that get repaired, and when
	learners map[uint64]*schedule
	// answeredBy is the member the reconciler's consensus service reads the
	// member list from; after a refusal that names it, the reconciler asks
	// another one (act.go's nextConsensus).
	answeredBy   uint64
	epoch        int64
	pending      string
	pendingUntil time.Time
	now          time.Time
	rev          int64 // the last etcd revision written to a node record
	// The reconciler's learner clocks, kept across passes as
	// observe.go's learnerClocks keeps them.
	learnerSince, readySince map[uint64]time.Time
	// bound is how many passes the run may take.
	bound int
}

func seconds(t *rapid.T, label string, lo, hi int) time.Duration {
	return time.Duration(rapid.IntRange(lo, hi).Draw(t, label)) * time.Second
}

const (
	maxCatchUp = 8 * time.Second // a learner catches up within this, after starting or falling behind
	maxStep    = 3 * time.Second // the clock advances at most this between passes
)

func genModel(t *rapid.T) *model {
	start := time.Unix(1_000_000, 0)
	s := &model{
		cfg: Config{
			Stabilization:       seconds(t, "stabilization", 0, 5),
			LearnerStartTimeout: seconds(t, "learner-start-timeout", 1, 5),
		},
		epoch: rapid.Int64Range(1, 1000).Draw(t, "epoch"),
		now:   start, rev: 100,
		repairAt: map[string]time.Time{}, learners: map[uint64]*schedule{},
		learnerSince: map[uint64]time.Time{}, readySince: map[uint64]time.Time{},
	}
	// horizon: by when every scheduled event (the change in flight, the
	// repairs, each learner started and promoted or removed) has happened.
	var horizon time.Duration
	if rapid.IntRange(0, 3).Draw(t, "pending") == 0 {
		d := seconds(t, "pending-for", 0, 6)
		s.pending, s.pendingUntil = "promote member 99 (node-9) by reconciler/x", start.Add(d)
		horizon += d
	}
	var repairs time.Duration
	for i := range rapid.IntRange(1, 6).Draw(t, "nodes") {
		s.rev++
		n := Node{ID: fmt.Sprintf("node-%d", i), Revision: s.rev}
		switch rapid.IntRange(0, 3).Draw(t, "roles-"+n.ID) {
		case 1:
			n.ConsensusMember = true
		case 2:
			n.ConsensusMember, n.KubernetesController = true, true
		case 3: // KubernetesController without ConsensusMember: a half-done change to repair
			n.KubernetesController = true
		}
		if rapid.IntRange(0, 3).Draw(t, "unreadable-"+n.ID) == 0 {
			n.Unreadable = true
			if rapid.Bool().Draw(t, "repaired-"+n.ID) {
				d := seconds(t, "repaired-after-"+n.ID, 0, 8)
				s.repairAt[n.ID] = start.Add(d)
				repairs = max(repairs, d)
			}
		}
		s.nodes = append(s.nodes, n)
	}
	horizon += repairs

	// Members: a node is a voter, a learner or no member; a ghost (the
	// member of a node that does not exist) is a voter or a learner. At
	// most one learner, as etcd allows.
	id := uint64(1)
	var learnerFor time.Duration
	add := func(node string, kind int) {
		m := Member{ID: id, NodeID: node, Started: true}
		id++
		if kind == 2 && len(s.learners) == 0 {
			m.Learner, m.Started = true, false
			l := &schedule{starts: rapid.IntRange(0, 3).Draw(t, "starts-"+node) != 0}
			startAfter := seconds(t, "starts-after-"+node, 0, 8)
			l.startAt = start.Add(startAfter)
			l.catchUpAt = l.startAt.Add(seconds(t, "catches-up-after-"+node, 0, 8))
			l.flaps = rapid.IntRange(0, 2).Draw(t, "flaps-"+node)
			s.learners[m.ID] = l
			learnerFor = s.cfg.LearnerStartTimeout
			if l.starts {
				learnerFor = max(learnerFor, startAfter+time.Duration(l.flaps+1)*(maxCatchUp+s.cfg.Stabilization+maxStep))
			}
		}
		s.members = append(s.members, m)
	}
	// Sometimes no node's member is a voter, so that the voters are
	// ghosts (the shape of the fail-file that TestRegressions replays).
	// Ghosts or nodes first: whichever comes first is likelier to hold
	// the learner.
	nodeVoters := rapid.IntRange(0, 3).Draw(t, "node-voters") > 0
	nodeMembers := func() {
		for _, n := range s.nodes {
			kind := rapid.IntRange(0, 2).Draw(t, "member-"+n.ID)
			if kind == 2 && len(s.learners) > 0 {
				kind = 1 // a second learner: a voter
			}
			if kind == 2 || (kind == 1 && nodeVoters) {
				add(n.ID, kind)
			}
		}
	}
	ghostsFirst := rapid.Bool().Draw(t, "ghosts-first")
	if !ghostsFirst {
		nodeMembers()
	}
	for i := range rapid.IntRange(0, 3).Draw(t, "ghosts") {
		ghost := fmt.Sprintf("ghost-%d", i)
		add(ghost, rapid.IntRange(1, 2).Draw(t, "member-"+ghost))
	}
	if ghostsFirst {
		nodeMembers()
	}
	if s.voters() == 0 { // etcd always has a voter
		switch {
		case len(s.members) == 0:
			add(s.nodes[0].ID, 1)
		case rapid.Bool().Draw(t, "last-voter-a-ghost"): // the learner's peer is a ghost
			add("ghost-voter", 1)
		default:
			s.members[0].Learner, s.members[0].Started = false, true
			delete(s.learners, s.members[0].ID)
		}
	}
	horizon += learnerFor
	// The floor, around the number of voters: at or above it (every voter
	// removal refused), and at or below 0 (which must count as 1).
	s.cfg.VoterFloor = rapid.IntRange(-1, s.voters()+1).Draw(t, "voter-floor")

	// Mostly a member of a node answers; sometimes any member (a ghost
	// too), or an id that is no member.
	var ids []uint64
	for _, m := range s.members {
		if s.node(m.NodeID) != nil {
			ids = append(ids, m.ID)
		}
	}
	if len(ids) == 0 || rapid.IntRange(0, 2).Draw(t, "answered-by-anyone") == 0 {
		ids = []uint64{0xdead}
		for _, m := range s.members {
			ids = append(ids, m.ID)
		}
	}
	s.answeredBy = rapid.SampledFrom(ids).Draw(t, "answered-by")

	// Actions: each member removed or promoted at most once, each node
	// given the role and stripped of it at most once. Passes that wait
	// advance the clock by at least a second; passes that act advance it
	// by at most maxStep; one refusal may switch the answering member.
	actions := len(s.members) + 2*len(s.nodes)
	elapsed := horizon + time.Duration(actions+2)*maxStep
	s.bound = actions + 2 + int(elapsed/time.Second) + 2
	return s
}

func (s *model) node(id string) *Node {
	for i := range s.nodes {
		if s.nodes[i].ID == id {
			return &s.nodes[i]
		}
	}
	return nil
}

func (s *model) memberOf(node string) (Member, bool) {
	for _, m := range s.members {
		if m.NodeID == node {
			return m, true
		}
	}
	return Member{}, false
}

func (s *model) voters() int {
	v := 0
	for _, m := range s.members {
		if !m.Learner {
			v++
		}
	}
	return v
}

// unmatched counts members whose node does not exist; an unreadable node
// exists.
func (s *model) unmatched() int {
	u := 0
	for _, m := range s.members {
		if s.node(m.NodeID) == nil {
			u++
		}
	}
	return u
}

func (s *model) unreadable() []string {
	var ids []string
	for _, n := range s.nodes {
		if n.Unreadable {
			ids = append(ids, n.ID)
		}
	}
	return ids
}

func (s *model) floor() int { return max(s.cfg.VoterFloor, 1) }

// world moves on to s.now: a change in flight ends (and bumps the epoch),
// repaired records become readable, learners start, catch up, fall behind.
func (s *model) world(t *rapid.T) {
	if s.pending != "" && !s.now.Before(s.pendingUntil) {
		s.pending = ""
		s.epoch++
	}
	for _, id := range slices.Sorted(maps.Keys(s.repairAt)) {
		if !s.now.Before(s.repairAt[id]) {
			n := s.node(id)
			s.rev++
			n.Unreadable, n.Revision = false, s.rev
			delete(s.repairAt, id)
		}
	}
	for i := range s.members {
		m := &s.members[i]
		l := s.learners[m.ID]
		if l == nil {
			continue
		}
		if !m.Started && l.starts && !s.now.Before(l.startAt) {
			m.Started = true
		}
		switch {
		case m.Started && !m.CaughtUp && !s.now.Before(l.catchUpAt):
			m.CaughtUp = true
		case m.CaughtUp && l.flaps > 0 && rapid.Bool().Draw(t, "falls-behind"):
			m.CaughtUp = false
			l.flaps--
			l.catchUpAt = s.now.Add(seconds(t, "catches-up-again-after", 1, int(maxCatchUp/time.Second)))
		}
	}
}

// observe is what the reconciler sees, keeping its learner clocks as the
// real one does: when each learner was first seen, and since when it has
// been caught up without a break.
func (s *model) observe() Observed {
	since, ready := learnerClocks(s.members, s.learnerSince, s.readySince, s.now)
	s.learnerSince, s.readySince = since, ready
	return Observed{Epoch: s.epoch, Pending: s.pending, AnsweredBy: s.answeredBy,
		Members: slices.Clone(s.members), Nodes: slices.Clone(s.nodes),
		LearnerSince: maps.Clone(since), ReadySince: maps.Clone(ready), Now: s.now}
}

// apply carries an action out as the act step and its resources would.
func (s *model) apply(t *rapid.T, a Action) {
	switch a.Kind {
	case RemoveMember:
		if a.NodeAbsent && s.node(a.NodeID) != nil {
			t.Fatalf("%v: the resource refuses, node %s exists", a, a.NodeID)
		}
		s.members = slices.DeleteFunc(s.members, func(m Member) bool { return m.ID == a.MemberID })
		delete(s.learners, a.MemberID)
		s.epoch++
	case Promote:
		for i := range s.members {
			if s.members[i].ID == a.MemberID {
				s.members[i].Learner = false
			}
		}
		delete(s.learners, a.MemberID)
		s.epoch++
	case AddRole, RemoveRole:
		n := s.node(a.NodeID)
		if n.Revision != a.NodeRevision {
			t.Fatalf("%v: role write at revision %d, the record is at %d", a, a.NodeRevision, n.Revision)
		}
		if a.Kind == AddRole {
			n.ConsensusMember = true
		} else {
			n.ConsensusMember, n.KubernetesController = false, false
		}
		s.rev++
		n.Revision = s.rev
	}
}

// askAnother: after a refusal naming the member that answered, the
// reconciler reads the member list from another consensus service.
func (s *model) askAnother(t *rapid.T) bool {
	var ids []uint64
	for _, m := range s.members {
		if m.Started && m.ID != s.answeredBy && s.node(m.NodeID) != nil {
			ids = append(ids, m.ID)
		}
	}
	if len(ids) == 0 {
		return false
	}
	s.answeredBy = rapid.SampledFrom(ids).Draw(t, "answered-by-next")
	return true
}

// TestPlanProperties checks, on every pass from generated states:
//   - every action carries the snapshot's epoch;
//   - NodeAbsent is set exactly on removals of members whose node does not
//     exist; Unstarted on a learner's removal for not starting, and only on
//     an unstarted learner's;
//   - while a change is in flight the plan waits for it, and says so;
//   - a broken mapping (answering member not a member or not a node, most
//     members without a node) is refused, and every refusal has a cause that
//     is true in the model;
//   - no member whose node exists (an unreadable one included) is removed,
//     except an unstarted learner past the timeout; no voter removal goes
//     below the floor or removes the last voter;
//   - no learner is promoted before it stayed caught up for the window;
//   - role writes target readable records at the revision read, and only
//     where a rule says so; learner steps come only after roles and
//     membership agree;
//   - every wait is for a learner that really is unstarted and younger than
//     the timeout, or started and not yet stable (and none is ready to be
//     removed or promoted), or for a change in flight;
//   - "converged" means roles and membership agree (no KubernetesController
//     without ConsensusMember), no learner, no unreadable record; with
//     unreadable records the plan names them instead;
//   - the run ends, within a bound of passes, converged or at a justified
//     refusal: every wait ends as the clock advances.
func TestPlanProperties(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		s := genModel(t)
		for pass := 0; ; pass++ {
			if pass > s.bound {
				t.Fatalf("no convergence after %d passes", pass)
			}
			s.world(t)
			o := s.observe()
			a := Plan(o, s.cfg)
			t.Logf("pass %d at +%v: %v", pass, s.now.Sub(time.Unix(1_000_000, 0)), a)
			checkPass(t, s, o, a)
			switch a.Kind {
			case Refuse:
				if !strings.Contains(a.Reason, "answered the member list") || !s.askAnother(t) {
					return // only an operator lifts it
				}
				s.now = s.now.Add(seconds(t, "step", 0, int(maxStep/time.Second)))
			case None:
				if !strings.HasPrefix(a.Reason, reasonWaiting) && s.pending == "" && len(s.repairAt) == 0 {
					return // converged, and nothing more will happen
				}
				s.now = s.now.Add(seconds(t, "step", 1, int(maxStep/time.Second)))
			default:
				s.apply(t, a)
				s.now = s.now.Add(seconds(t, "step", 0, int(maxStep/time.Second)))
			}
		}
	})
}

func checkPass(t *rapid.T, s *model, o Observed, a Action) {
	if a.Epoch != o.Epoch {
		t.Fatalf("%v carries epoch %d, the snapshot has %d", a, a.Epoch, o.Epoch)
	}
	var target *Member // the member the action names, as it is in the model
	if m, ok := findMember(s.members, a.MemberID); ok && a.MemberID != 0 {
		target = &m
	}
	absent := a.Kind == RemoveMember && target != nil && s.node(target.NodeID) == nil
	if a.NodeAbsent != absent {
		t.Fatalf("%v: NodeAbsent is %v, want %v (true exactly when a member whose node does not exist is removed)", a, a.NodeAbsent, absent)
	}
	unstarted := a.Kind == RemoveMember && target != nil && target.Learner && !target.Started
	if a.Unstarted && !unstarted || strings.Contains(a.Reason, "has not started within") && !a.Unstarted {
		t.Fatalf("%v: Unstarted is %v: want it set on a learner's removal for not starting, and only on an unstarted learner's", a, a.Unstarted)
	}

	if s.pending != "" {
		if a.Kind != None || !strings.HasPrefix(a.Reason, reasonWaiting+" the membership change in flight") || !strings.Contains(a.Reason, s.pending) {
			t.Fatalf("a change is in flight (%q), yet the plan is %v", s.pending, a)
		}
		return
	}
	if cause := s.brokenMapping(); cause != "" && a.Kind != Refuse {
		t.Fatalf("%s, yet the plan is %v", cause, a)
	}

	switch a.Kind {
	case Refuse:
		checkRefusal(t, s, a, target)
	case None:
		checkNone(t, s, a)
	case RemoveMember:
		if target == nil {
			t.Fatalf("%v: no such member", a)
		}
		if n := s.node(target.NodeID); n != nil {
			since, seen := s.learnerSince[target.ID]
			if !target.Learner || target.Started || !seen || s.now.Sub(since) < s.cfg.LearnerStartTimeout {
				t.Fatalf("%v removes member %+v whose node exists (unreadable: %v)", a, *target, n.Unreadable)
			}
			checkAgreement(t, s, a) // learner steps come after rules 1-3
		}
		if !target.Learner && s.voters()-1 < s.floor() {
			t.Fatalf("%v removes voter %+v: %d voters would be left, the floor is %d", a, *target, s.voters()-1, s.floor())
		}
	case Promote:
		if target == nil {
			t.Fatalf("%v: no such member", a)
		}
		ready, isReady := s.readySince[target.ID]
		if !target.Learner || !target.Started || !target.CaughtUp || !isReady || s.now.Sub(ready) < s.cfg.Stabilization {
			t.Fatalf("%v promotes %+v before it stayed caught up for %v (caught up since %v: %v, now %v)", a, *target, s.cfg.Stabilization, isReady, ready, s.now)
		}
		checkAgreement(t, s, a)
	case AddRole, RemoveRole:
		n := s.node(a.NodeID)
		if n == nil || n.Unreadable {
			t.Fatalf("%v writes the roles of a node that does not exist or cannot be read: %+v", a, n)
		}
		if s.unmatched() > 0 {
			t.Fatalf("%v before every member has a node (rule 1 comes first)", a)
		}
		mem, ok := s.memberOf(n.ID)
		if a.Kind == AddRole && (!ok || mem.ID != a.MemberID || n.ConsensusMember) {
			t.Fatalf("%v: node %+v is not member %x lacking ConsensusMember", a, *n, a.MemberID)
		}
		if a.Kind == RemoveRole && (ok || !n.ConsensusMember && !n.KubernetesController) {
			t.Fatalf("%v: node %+v is a member, or has neither role", a, *n)
		}
	default:
		t.Fatalf("unknown action %v", a)
	}
}

// brokenMapping names a reason the planner must refuse for, "" if none.
func (s *model) brokenMapping() string {
	answered, ok := findMember(s.members, s.answeredBy)
	switch {
	case !ok:
		return fmt.Sprintf("the answering member %x is not a member", s.answeredBy)
	case s.node(answered.NodeID) == nil:
		return fmt.Sprintf("the answering member %x's node %s does not exist", answered.ID, answered.NodeID)
	case s.unmatched()*2 > len(s.members):
		return fmt.Sprintf("%d of %d members have no node", s.unmatched(), len(s.members))
	}
	return ""
}

// checkRefusal: the cause a refusal states is true in the model.
func checkRefusal(t *rapid.T, s *model, a Action, target *Member) {
	answered, isMember := findMember(s.members, s.answeredBy)
	switch {
	case strings.Contains(a.Reason, "is not in it"):
		if isMember {
			t.Fatalf("%v, but member %x is in the list", a, s.answeredBy)
		}
	case strings.Contains(a.Reason, "is not a cluster node"):
		if !isMember || s.node(answered.NodeID) != nil {
			t.Fatalf("%v, but member %x is not in the list or its node %q exists", a, s.answeredBy, answered.NodeID)
		}
	case strings.Contains(a.Reason, "match no node"):
		if s.unmatched()*2 <= len(s.members) {
			t.Fatalf("%v, but only %d of %d members have no node", a, s.unmatched(), len(s.members))
		}
	case strings.Contains(a.Reason, "below the floor"):
		if target == nil || target.Learner || s.node(target.NodeID) != nil || s.voters()-1 >= s.floor() {
			t.Fatalf("%v, but the member %+v is no node-less voter whose removal crosses the floor (%d voters, floor %d)", a, target, s.voters(), s.floor())
		}
	default:
		t.Fatalf("%v: a refusal for no cause the model knows", a)
	}
}

// checkNone: a wait has something to wait for; convergence is real.
func checkNone(t *rapid.T, s *model, a Action) {
	unreadable := s.unreadable()
	names := func() {
		for _, id := range unreadable {
			if !strings.Contains(a.Reason, id) {
				t.Fatalf("%v does not name the unreadable record of %s", a, id)
			}
		}
	}
	switch {
	case strings.HasPrefix(a.Reason, reasonWaiting+" the membership change in flight"):
		t.Fatalf("%v, but no change is in flight", a)
	case strings.HasPrefix(a.Reason, reasonWaiting):
		checkAgreement(t, s, a)
		names()
		learners := 0
		for _, m := range s.members {
			if !m.Learner {
				continue
			}
			learners++
			since := s.learnerSince[m.ID]
			ready, isReady := s.readySince[m.ID]
			if !m.Started && s.now.Sub(since) >= s.cfg.LearnerStartTimeout {
				t.Fatalf("%v, but learner %x has not started for %v, past the timeout %v", a, m.ID, s.now.Sub(since), s.cfg.LearnerStartTimeout)
			}
			if m.Started && m.CaughtUp && isReady && s.now.Sub(ready) >= s.cfg.Stabilization {
				t.Fatalf("%v, but learner %x has been caught up for %v, the window is %v", a, m.ID, s.now.Sub(ready), s.cfg.Stabilization)
			}
		}
		if learners == 0 {
			t.Fatalf("%v, but there is no learner and no change in flight", a)
		}
		var named uint64
		if _, err := fmt.Sscanf(a.Reason, reasonWaiting+" learner %x", &named); err != nil {
			t.Fatalf("%v names no learner to wait for: %v", a, err)
		}
		if m, ok := findMember(s.members, named); !ok || !m.Learner {
			t.Fatalf("%v, but member %x is no learner", a, named)
		}
	case strings.HasPrefix(a.Reason, reasonUnreadable), strings.HasPrefix(a.Reason, reasonConverged):
		checkAgreement(t, s, a)
		for _, m := range s.members {
			if m.Learner {
				t.Fatalf("%v, but member %x is a learner", a, m.ID)
			}
		}
		if strings.HasPrefix(a.Reason, reasonConverged) && len(unreadable) > 0 {
			t.Fatalf("%v, but the records of %v cannot be read", a, unreadable)
		}
		if strings.HasPrefix(a.Reason, reasonUnreadable) && len(unreadable) == 0 {
			t.Fatalf("%v, but every record can be read", a)
		}
		names()
	default:
		t.Fatalf("%v: no known kind of nothing to do", a)
	}
}

// checkAgreement: every member has a node, with ConsensusMember if it can
// be read; no readable node that is not a member has ConsensusMember or
// KubernetesController; no KubernetesController without ConsensusMember.
func checkAgreement(t *rapid.T, s *model, a Action) {
	for _, m := range s.members {
		n := s.node(m.NodeID)
		if n == nil || (!n.Unreadable && !n.ConsensusMember) {
			t.Fatalf("%v, but member %+v has no node with ConsensusMember: %+v", a, m, n)
		}
	}
	for _, n := range s.nodes {
		if n.Unreadable {
			continue
		}
		if _, ok := s.memberOf(n.ID); !ok && (n.ConsensusMember || n.KubernetesController) {
			t.Fatalf("%v, but node %+v has roles without membership", a, n)
		}
		if n.KubernetesController && !n.ConsensusMember {
			t.Fatalf("%v, but node %s has KubernetesController without ConsensusMember", a, n.ID)
		}
	}
}

// TestBackgroundSyncEtcd follows Metropolis' test of the same name: a
// member without the role gets it; an extra member with no node is removed
// while roles stay; then the stale roles go; then nothing changes.
func TestBackgroundSyncEtcd(t *testing.T) {
	t.Parallel()
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
	if a.MemberID != 2 || !a.NodeAbsent {
		t.Fatalf("got %v, want member 2 removed with its node's absence to prove", a)
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

// TestRegressions replays states property tests once failed on, written
// out so that they stay covered whatever rapid's fail-file format becomes.
func TestRegressions(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	cases := map[string]struct {
		o    Observed
		c    Config
		want Action
	}{
		// Was testdata/rapid/TestPlanProperties/TestPlanProperties-20261130132550-14565.fail
		// (rapid fail-file v0.4.8, drawn by the generator of commit
		// 1c434c4; today's generator decodes its draws differently, so
		// the file is gone). One node, node-0, without roles, whose
		// member 1 is an unstarted learner and answered the list; member
		// 2, the only voter, belongs to ghost-0, which does not exist. A
		// planner removed member 2 ("removes voter {2 ghost-0 false true
		// false} below the floor (1 voters)"). Removing it would leave no
		// voter: refuse, and say so.
		"rapid 20261130132550-14565: the only voter's node does not exist": {
			o: Observed{Epoch: 1, AnsweredBy: 1, Now: now,
				Members: []Member{
					{ID: 1, NodeID: "node-0", Learner: true},
					{ID: 2, NodeID: "ghost-0", Started: true},
				},
				Nodes:        []Node{{ID: "node-0", Revision: 100}},
				LearnerSince: map[uint64]time.Time{1: now}, ReadySince: map[uint64]time.Time{}},
			c: cfg,
			want: Action{Kind: Refuse, Refused: RemoveMember, MemberID: 2, NodeID: "ghost-0", Epoch: 1,
				Reason: "member 2 has no node, but removing it would leave 0 voters, below the floor of 1"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if a := Plan(tc.o, tc.c); a != tc.want {
				t.Fatalf("got  %#v\nwant %#v", a, tc.want)
			}
		})
	}
}

func TestPlan(t *testing.T) {
	t.Parallel()
	base := func() Observed {
		return Observed{Epoch: 3, AnsweredBy: 1, Now: time.Unix(1000, 0),
			Members:      []Member{{ID: 1, NodeID: "a", Started: true}, {ID: 2, NodeID: "b", Started: true}},
			Nodes:        []Node{{ID: "a", Revision: 10, ConsensusMember: true}, {ID: "b", Revision: 11, ConsensusMember: true}},
			LearnerSince: map[uint64]time.Time{}, ReadySince: map[uint64]time.Time{}}
	}
	learner := func(o *Observed, m Member, n Node) {
		m.ID, m.NodeID, m.Learner, n.ID = 3, "c", true, "c"
		o.Members = append(o.Members, m)
		o.Nodes = append(o.Nodes, n)
	}
	cases := map[string]struct {
		mutate func(*Observed)
		c      Config
	}{
		"converged":                   {func(o *Observed) {}, cfg},
		"answering member unknown":    {func(o *Observed) { o.AnsweredBy = 9 }, cfg},
		"answering member not a node": {func(o *Observed) { o.Nodes = o.Nodes[1:] }, cfg},
		"most members match no node": {func(o *Observed) {
			o.Members = append(o.Members, Member{ID: 3, NodeID: "x", Started: true}, Member{ID: 4, NodeID: "y", Started: true}, Member{ID: 5, NodeID: "z", Started: true})
		}, cfg},
		"voter floor": {func(o *Observed) { o.Nodes = o.Nodes[:1] }, Config{VoterFloor: 2}},
		"last voter, floor 0 counts as 1": {func(o *Observed) {
			o.Members[0].Learner = true
			o.Members[1].NodeID = "gone"
		}, Config{VoterFloor: 0}},

		// Rule 1: the act step proves the node's absence.
		"member whose node does not exist": {func(o *Observed) {
			o.Members = append(o.Members, Member{ID: 3, NodeID: "gone", Started: true})
		}, cfg},
		"learner whose node does not exist": {func(o *Observed) {
			o.Members = append(o.Members, Member{ID: 3, NodeID: "gone", Learner: true})
		}, cfg},

		// A change in flight: wait, before the guards and every rule.
		"change in flight": {func(o *Observed) { o.Pending = "remove member 2 (node b) by curator/x" }, cfg},
		"change in flight, answering member unknown": {func(o *Observed) {
			o.Pending, o.AnsweredBy = "add node c", 9
		}, cfg},
		"change in flight, member without node": {func(o *Observed) {
			o.Pending = "add node c"
			o.Members = append(o.Members, Member{ID: 3, NodeID: "gone", Started: true})
		}, cfg},

		// Unreadable records: the node exists, its roles are unknown.
		"unreadable node answers": {func(o *Observed) { o.Nodes[0] = Node{ID: "a", Unreadable: true} }, cfg},
		"unreadable member node without ConsensusMember": {func(o *Observed) {
			o.Members = append(o.Members, Member{ID: 3, NodeID: "c", Started: true})
			o.Nodes = append(o.Nodes, Node{ID: "c", Unreadable: true, KubernetesController: true})
		}, cfg},
		"unreadable non-member with ConsensusMember": {func(o *Observed) {
			o.Nodes = append(o.Nodes, Node{ID: "d", Unreadable: true, ConsensusMember: true, KubernetesController: true},
				Node{ID: "c", Unreadable: true})
		}, cfg},
		"unreadable nodes count as nodes for the guard": {func(o *Observed) {
			o.Members = append(o.Members, Member{ID: 3, NodeID: "c", Started: true},
				Member{ID: 4, NodeID: "x", Started: true}, Member{ID: 5, NodeID: "y", Started: true})
			o.Nodes = append(o.Nodes, Node{ID: "c", Unreadable: true})
		}, cfg},
		"unreadable learner not started, too long": {func(o *Observed) {
			learner(o, Member{}, Node{Unreadable: true})
			o.LearnerSince[3] = o.Now.Add(-2 * time.Minute)
		}, cfg},
		"unreadable record while waiting": {func(o *Observed) {
			learner(o, Member{}, Node{ConsensusMember: true})
			o.LearnerSince[3] = o.Now
			o.Nodes = append(o.Nodes, Node{ID: "d", Unreadable: true})
		}, cfg},

		// KubernetesController without ConsensusMember.
		"KubernetesController without ConsensusMember, not a member": {func(o *Observed) {
			o.Nodes = append(o.Nodes, Node{ID: "c", Revision: 12, KubernetesController: true})
		}, cfg},
		"KubernetesController without ConsensusMember, a member": {func(o *Observed) {
			o.Nodes[1].ConsensusMember, o.Nodes[1].KubernetesController = false, true
		}, cfg},
		"ConsensusMember, not a member": {func(o *Observed) {
			o.Nodes = append(o.Nodes, Node{ID: "c", Revision: 12, ConsensusMember: true, KubernetesController: true})
		}, cfg},

		// Learners.
		"learner not started, young": {func(o *Observed) {
			learner(o, Member{}, Node{ConsensusMember: true})
			o.LearnerSince[3] = o.Now.Add(-time.Second)
		}, cfg},
		"learner not started, too long": {func(o *Observed) {
			learner(o, Member{}, Node{ConsensusMember: true})
			o.LearnerSince[3] = o.Now.Add(-time.Minute)
		}, cfg},
		"learner caught up, inside the window": {func(o *Observed) {
			learner(o, Member{Started: true, CaughtUp: true}, Node{ConsensusMember: true})
			o.ReadySince[3] = o.Now.Add(-time.Second)
		}, cfg},
		"learner caught up, window passed": {func(o *Observed) {
			learner(o, Member{Started: true, CaughtUp: true}, Node{ConsensusMember: true})
			o.ReadySince[3] = o.Now.Add(-10 * time.Second)
		}, cfg},
	}
	var out strings.Builder
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		tc := cases[name]
		o := base()
		tc.mutate(&o)
		a := Plan(o, tc.c)
		if a.Epoch != o.Epoch {
			t.Errorf("%s: planned at epoch %d, observed %d", name, a.Epoch, o.Epoch)
		}
		fmt.Fprintf(&out, "%s\n\t%s\n", name, describe(a))
	}
	golden(t, "testdata/plan.golden", out.String())
}

// describe is an action as the golden file holds it: every field that
// matters, then the reason in full.
func describe(a Action) string {
	var b strings.Builder
	b.WriteString(a.Kind.String())
	if a.MemberID != 0 {
		fmt.Fprintf(&b, " member=%x", a.MemberID)
	}
	if a.NodeID != "" {
		fmt.Fprintf(&b, " node=%s", a.NodeID)
	}
	if a.NodeRevision != 0 {
		fmt.Fprintf(&b, " node_revision=%d", a.NodeRevision)
	}
	if a.NodeAbsent {
		b.WriteString(" node_absent")
	}
	if a.PeerURL != "" {
		fmt.Fprintf(&b, " peer_url=%s", a.PeerURL)
	}
	if a.Refused != None {
		fmt.Fprintf(&b, " refused=%s", a.Refused)
	}
	fmt.Fprintf(&b, "\n\treason: %s", a.Reason)
	return b.String()
}

var update = flag.Bool("update", false, "rewrite the golden files from what the planner does now")

// golden compares got with the file at path, or, with -update, writes it.
func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to write it)", err, t.Name())
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Fatalf("the planner's actions differ from %s (-want +got); if the change is meant, go test -run %s -update and review the diff:\n%s", path, t.Name(), diff)
	}
}

// learnerClocks keeps the reconciler's learner clocks across passes, as
// observe.go's learnerClocks does: when each learner was first seen, and
// since when it has been caught up without a break.
func learnerClocks(members []Member, learnerSince, readySince map[uint64]time.Time, now time.Time) (since, ready map[uint64]time.Time) {
	since, ready = map[uint64]time.Time{}, map[uint64]time.Time{}
	for _, m := range members {
		if !m.Learner {
			continue
		}
		since[m.ID] = now
		if t, ok := learnerSince[m.ID]; ok {
			since[m.ID] = t
		}
		if m.CaughtUp {
			ready[m.ID] = now
			if t, ok := readySince[m.ID]; ok {
				ready[m.ID] = t
			}
		}
	}
	return since, ready
}
