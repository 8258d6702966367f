package plan

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// at is o observed at now: nothing else changed.
func at(o Observed, now time.Time) Observed {
	o.Now = now
	return o
}

// sameStep reports whether a and b do the same thing (the reasons, which
// name durations, move on with the clock).
func sameStep(a, b Action) bool {
	return a.Kind == b.Kind && a.MemberID == b.MemberID && a.NodeID == b.NodeID
}

// genTimed is an observation with deadlines near its Now: learners seen
// and caught up a few seconds ago, nodes unhealthy since a few seconds
// ago (a heartbeat a little ahead of Now too: the curator's clock may be
// ahead), thresholds of a few seconds, zero included. Roles mostly agree
// with membership, so that most plans reach the timed rules (4 and 6).
func genTimed(t *rapid.T) (Observed, Config) {
	now := time.Unix(1_000_000, 0)
	near := func(label string, lo, hi int) time.Time { return now.Add(seconds(t, label, lo, hi)) }
	c := Config{
		VoterFloor:          rapid.IntRange(0, 3).Draw(t, "floor"),
		Stabilization:       seconds(t, "stabilization", 0, 10),
		LearnerStartTimeout: seconds(t, "learner-start-timeout", 1, 10),
		DeadAfter:           seconds(t, "dead-after", 0, 15),
		// 3 first: rapid draws the first element most, and autopilot
		// is where voters' deadlines matter.
		TargetSize: rapid.SampledFrom([]int{3, 0, 1, 5}).Draw(t, "target"),
	}
	o := Observed{Epoch: 7, Now: now, LearnerSince: map[uint64]time.Time{}, ReadySince: map[uint64]time.Time{}}
	if rapid.IntRange(0, 19).Draw(t, "pending") == 0 {
		o.Pending = "promote member 99 (node-9) by reconciler/x"
	}
	zones := rapid.IntRange(1, 3).Draw(t, "zones")
	learners := 0
	for i := range rapid.IntRange(1, 7).Draw(t, "nodes") {
		id := fmt.Sprintf("node-%d", i)
		n := Node{
			ID: id, Revision: int64(10 + i),
			Up: rapid.IntRange(0, 4).Draw(t, "up-"+id) > 0, Healthy: rapid.Bool().Draw(t, "healthy-"+id),
			Zone:       fmt.Sprintf("zone-%d", rapid.IntRange(0, zones-1).Draw(t, "zone-"+id)),
			Unreadable: rapid.IntRange(0, 29).Draw(t, "unreadable-"+id) == 0,
		}
		if rapid.IntRange(0, 4).Draw(t, "heartbeat-"+id) > 0 {
			n.LastHeartbeat = near("heartbeat-at-"+id, -20, 2)
		}
		if rapid.IntRange(0, 4).Draw(t, "peer-"+id) > 0 {
			n.PeerURL = "https://" + id + ":2380"
		}
		// The first node's member is a voter; others a voter, a learner
		// (at most two) or no member.
		kind := 0
		if i > 0 {
			kind = rapid.IntRange(0, 2).Draw(t, "member-"+id)
		}
		if kind == 1 && learners == 2 {
			kind = 0
		}
		n.ConsensusMember = kind != 2
		if rapid.IntRange(0, 29).Draw(t, "roles-disagree-"+id) == 0 {
			n.ConsensusMember = !n.ConsensusMember
		}
		o.Nodes = append(o.Nodes, n)
		if kind == 2 {
			continue
		}
		m := Member{ID: uint64(i + 1), NodeID: id, Started: true, CaughtUp: true}
		if kind == 1 {
			learners++
			m.Learner = true
			m.Started = rapid.Bool().Draw(t, "started-"+id)
			m.CaughtUp = m.Started && rapid.Bool().Draw(t, "caught-up-"+id)
			if rapid.IntRange(0, 4).Draw(t, "seen-"+id) > 0 {
				o.LearnerSince[m.ID] = near("seen-at-"+id, -15, 0)
			}
			if m.CaughtUp && rapid.IntRange(0, 4).Draw(t, "ready-"+id) > 0 {
				o.ReadySince[m.ID] = near("ready-at-"+id, -15, 0)
			}
		}
		o.Members = append(o.Members, m)
	}
	if rapid.IntRange(0, 19).Draw(t, "ghost") == 0 {
		o.Members = append(o.Members, Member{ID: 0x99, NodeID: "ghost", Started: true, CaughtUp: true})
	}
	o.AnsweredBy, o.Leader = 1, 1
	if rapid.IntRange(0, 3).Draw(t, "leader-elsewhere") == 0 {
		o.Leader = rapid.SampledFrom(o.Members).Draw(t, "leader").ID
	}
	return o, c
}

// pilotObservation is what the autopilot model's reconciler observes after
// a drawn number of passes (TestAutopilotProperties' model): the states a
// run goes through, learner clocks kept across passes, nodes dying.
func pilotObservation(t *rapid.T) (Observed, Config) {
	p := genPilot(t)
	for range rapid.IntRange(0, 60).Draw(t, "passes") {
		p.world()
		p.apply(t, Plan(p.observe(), p.cfg))
		p.now = p.now.Add(seconds(t, "step", 1, 3))
	}
	p.world()
	return p.observe(), p.cfg
}

// TestRecheckProperties: for generated observations, Recheck is after Now
// (or zero), and at every instant from Now up to it (for ever, when it is
// zero) the plan takes the same step as at Now, and Recheck asked then
// gives the same instant. At the recheck the plan may take another step;
// asking there gives a later instant, so the loop never wakes twice for one.
//
// Some cases' plans must change at their recheck, across the run: with
// none, a Recheck that is always a nanosecond ahead would pass, and so
// would one always too late if no case reached a deadline.
func TestRecheckProperties(t *testing.T) {
	t.Parallel()
	var cases, changed int
	rapid.Check(t, func(t *rapid.T) {
		o, c := genTimed(t)
		if rapid.Bool().Draw(t, "from-pilot") {
			o, c = pilotObservation(t)
		}
		cases++
		base := Plan(o, c)
		r := Recheck(o, c)
		t.Logf("at +0: %v; recheck %v", base, r)
		if !r.IsZero() && !r.After(o.Now) {
			t.Fatalf("Recheck %v is not after Now %v", r, o.Now)
		}
		end := r
		if r.IsZero() {
			end = o.Now.Add(24 * time.Hour) // for ever: every deadline drawn is well before
		}
		window := int64(end.Sub(o.Now))
		instants := []time.Time{o.Now, end.Add(-time.Nanosecond)}
		for range 3 {
			instants = append(instants, o.Now.Add(time.Duration(rapid.Int64Range(0, window-1).Draw(t, "instant"))))
		}
		for _, now := range instants {
			if a := Plan(at(o, now), c); !sameStep(a, base) {
				t.Fatalf("at +%v, before the recheck (%v): %v; at +0: %v", now.Sub(o.Now), r, a, base)
			}
			if got := Recheck(at(o, now), c); !got.Equal(r) {
				t.Fatalf("Recheck asked at +%v: %v; asked at +0: %v", now.Sub(o.Now), got, r)
			}
		}
		if r.IsZero() {
			return
		}
		if next := Recheck(at(o, r), c); !next.IsZero() && !next.After(r) {
			t.Fatalf("Recheck asked at the recheck %v: %v, not later", r, next)
		}
		if !sameStep(Plan(at(o, r), c), base) {
			changed++
		}
	})
	if cases >= 100 && changed == 0 {
		t.Errorf("in %d cases no plan changed at its recheck: Recheck is early everywhere, or no case reaches a deadline and the property checks nothing", cases)
	}
}

// TestRecheck: concrete deadlines, and the step each one brings.
func TestRecheck(t *testing.T) {
	t.Parallel()
	now := time.Unix(10_000, 0)
	cfg := Config{VoterFloor: 1, Stabilization: 10 * time.Second, LearnerStartTimeout: time.Minute, TargetSize: 3, DeadAfter: 10 * time.Second}
	node := func(id string, member bool) Node {
		return Node{ID: id, Revision: 7, ConsensusMember: member, Up: true, Healthy: true, LastHeartbeat: now, PeerURL: "https://" + id + ":2380"}
	}
	unhealthy := func(n Node, silent time.Duration) Node {
		n.Healthy, n.LastHeartbeat = false, now.Add(-silent)
		return n
	}
	// cluster: members 1, 2, ... of the member nodes, voters unless listed
	// as learners, and the other nodes.
	cluster := func(members []Node, others ...Node) Observed {
		o := Observed{Epoch: 5, AnsweredBy: 1, Leader: 1, Now: now, LearnerSince: map[uint64]time.Time{}, ReadySince: map[uint64]time.Time{}}
		for i, n := range members {
			o.Members = append(o.Members, Member{ID: uint64(i + 1), NodeID: n.ID, Started: true, CaughtUp: true})
			o.Nodes = append(o.Nodes, n)
		}
		o.Nodes = append(o.Nodes, others...)
		return o
	}
	// learner makes member id a learner: started, caught up for ready
	// (0: not caught up), or not started, seen since.
	learner := func(o Observed, id uint64, started bool, since, ready time.Duration) Observed {
		m := &o.Members[id-1]
		m.Learner, m.Started, m.CaughtUp = true, started, started && ready > 0
		o.LearnerSince[id] = now.Add(-since)
		if m.CaughtUp {
			o.ReadySince[id] = now.Add(-ready)
		}
		return o
	}
	three := []Node{node("a", true), node("b", true), node("c", true)}
	tests := map[string]struct {
		o     Observed
		c     Config
		after time.Duration // 0: Recheck is zero
		then  Kind          // the step at the recheck
		// unchanged: the step at the recheck is the one at +0 (a pass
		// for nothing; Recheck promises no change before, not one at)
		unchanged bool
	}{
		"a learner caught up 3 s of 10 s: promoted at +7 s": {
			o: learner(cluster(three), 3, true, 5*time.Second, 3*time.Second), c: cfg, after: 7 * time.Second, then: Promote},
		"a learner unstarted 20 s of 1 m: removed at +40 s": {
			o: learner(cluster(three), 3, false, 20*time.Second, 0), c: cfg, after: 40 * time.Second, then: RemoveMember},
		"a standby caught up, its voter's node unhealthy, heartbeat 4 s ago, DeadAfter 10 s: promoted at +6 s": {
			o: learner(cluster([]Node{node("a", true), unhealthy(node("b", true), 4*time.Second), node("c", true), node("x", true)}), 4, true, 20*time.Second, 15*time.Second),
			c: cfg, after: 6 * time.Second, then: Promote},
		"a learner behind on a node unhealthy for 4 s: removed at +6 s": {
			o: learner(cluster([]Node{node("a", true), node("b", true), unhealthy(node("c", true), 4*time.Second)}), 3, true, 5*time.Second, 0), c: cfg, after: 6 * time.Second, then: RemoveMember},
		"the earliest deadline: a learner's node dead at +6 s, before a voter's at +8 s": {
			o: learner(cluster([]Node{node("a", true), unhealthy(node("b", true), 2*time.Second), node("c", true), unhealthy(node("d", true), 4*time.Second)}), 4, true, 5*time.Second, 0),
			c: cfg, after: 6 * time.Second, then: RemoveMember},
		"a deadline that an earlier rule overrides: a voter dead at +6 s, while a learner is waited for": {
			o: learner(cluster([]Node{node("a", true), node("b", true), unhealthy(node("c", true), 4*time.Second), node("d", true)}), 4, true, 5*time.Second, 3*time.Second),
			c: cfg, after: 6 * time.Second, then: None, unchanged: true},
		"nothing timed: converged": {o: cluster(three), c: cfg},
		"a deadline past counts no more: the node is dead already": {
			o: cluster([]Node{node("a", true), unhealthy(node("b", true), time.Minute), node("c", true)}), c: cfg},
		"a node unhealthy that never sent a heartbeat is never dead": {
			o: cluster([]Node{node("a", true), func() Node { n := node("b", true); n.Healthy, n.LastHeartbeat = false, time.Time{}; return n }(), node("c", true)}), c: cfg},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := Recheck(tc.o, tc.c)
			if tc.after == 0 {
				if !r.IsZero() {
					t.Fatalf("Recheck %v (+%v), want zero", r, r.Sub(now))
				}
				return
			}
			if want := now.Add(tc.after); !r.Equal(want) {
				t.Fatalf("Recheck +%v, want +%v", r.Sub(now), tc.after)
			}
			before, base := Plan(at(tc.o, r.Add(-time.Nanosecond)), tc.c), Plan(tc.o, tc.c)
			if !sameStep(before, base) {
				t.Fatalf("just before the recheck: %v; at +0: %v", before, base)
			}
			if got := Plan(at(tc.o, r), tc.c); got.Kind != tc.then || sameStep(got, base) != tc.unchanged {
				t.Fatalf("at the recheck: %v, want a %v, unchanged %v (at +0: %v)", got, tc.then, tc.unchanged, base)
			}
		})
	}
}
