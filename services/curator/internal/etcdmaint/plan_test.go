package etcdmaint

import (
	"slices"
	"testing"
)

// TestPlanDefrag: followers first (most wasted first), the etcd leader
// last with its leadership moved; only members past both the threshold
// and the floor, except on NOSPACE (every member); nothing while a voter
// does not answer, the members know no common leader, or a membership
// change is pending. A learner that does not answer is left out.
func TestPlanDefrag(t *testing.T) {
	cfg := Config{Threshold: 0.5, MinWasted: 100}
	// member id, leader it names, db size, in use
	m := func(id, leader uint64, size, inUse int64) Member {
		return Member{ID: id, Answered: true, LeaderID: leader, DBSize: size, DBInUse: inUse}
	}
	down := func(id uint64) Member { return Member{ID: id} }
	learner := func(e Member) Member { e.Learner = true; return e }
	for name, tc := range map[string]struct {
		obs       Observation
		trigger   string
		wantOrder []uint64
		wantMove  bool
		wantSkip  bool
	}{
		"followers first by waste, leader last": {
			obs:       Observation{Members: []Member{m(1, 1, 1000, 100), m(2, 1, 1000, 300), m(3, 1, 1000, 200)}},
			wantOrder: []uint64{3, 2, 1}, wantMove: true,
		},
		"only the fragmented ones": {
			obs:       Observation{Members: []Member{m(1, 1, 1000, 900), m(2, 1, 1000, 100), m(3, 1, 1000, 499)}},
			wantOrder: []uint64{2, 3},
		},
		"below the floor: left alone": {
			obs:      Observation{Members: []Member{m(1, 1, 150, 60), m(2, 1, 150, 60), m(3, 1, 150, 60)}},
			wantSkip: true,
		},
		"NOSPACE: every member, whatever its fragmentation": {
			obs:       Observation{Members: []Member{m(1, 2, 1000, 990), m(2, 2, 1000, 990), m(3, 2, 1000, 980)}},
			trigger:   triggerNoSpace,
			wantOrder: []uint64{3, 1, 2}, wantMove: true,
		},
		"a voter down: nothing": {
			obs:      Observation{Members: []Member{m(1, 1, 1000, 100), m(2, 1, 1000, 100), down(3)}},
			wantSkip: true,
		},
		"a voter down on NOSPACE: nothing either": {
			obs:      Observation{Members: []Member{m(1, 1, 1000, 100), m(2, 1, 1000, 100), down(3)}},
			trigger:  triggerNoSpace,
			wantSkip: true,
		},
		"a membership change pending: nothing": {
			obs:      Observation{Pending: true, Members: []Member{m(1, 1, 1000, 100), m(2, 1, 1000, 100), m(3, 1, 1000, 100)}},
			wantSkip: true,
		},
		"no leader: nothing": {
			obs:      Observation{Members: []Member{m(1, 0, 1000, 100), m(2, 0, 1000, 100), m(3, 0, 1000, 100)}},
			wantSkip: true,
		},
		"leaders disagree: nothing": {
			obs:      Observation{Members: []Member{m(1, 1, 1000, 100), m(2, 1, 1000, 100), m(3, 3, 1000, 100)}},
			wantSkip: true,
		},
		"a learner is a follower; one that does not answer is left out": {
			obs:       Observation{Members: []Member{m(1, 1, 1000, 100), learner(m(4, 1, 1000, 0)), learner(down(5))}},
			wantOrder: []uint64{4, 1}, wantMove: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			trigger := tc.trigger
			if trigger == "" {
				trigger = triggerFragmented
			}
			p := planDefrag(tc.obs, cfg, trigger)
			var order []uint64
			for _, m := range p.order {
				order = append(order, m.ID)
			}
			if (p.skip != "") != tc.wantSkip || !slices.Equal(order, tc.wantOrder) || p.moveLeader != tc.wantMove {
				t.Fatalf("plan: order %v, move leader %v, skip %q; want order %v, move leader %v, skip %v", order, p.moveLeader, p.skip, tc.wantOrder, tc.wantMove, tc.wantSkip)
			}
		})
	}
}
