package rolling

import (
	"slices"
	"testing"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

func TestOrder(t *testing.T) {
	nodes := []Node{{ID: "a", Name: "a"}, {ID: "b", Name: "b"}, {ID: "c", Name: "c"}, {ID: "w", Name: "w"}, {ID: "v", Name: "v"}}
	member := func(node string, leader bool) *curatorv1.ConsensusMemberStatus {
		return &curatorv1.ConsensusMemberStatus{NodeId: node, Leader: leader}
	}
	for name, tc := range map[string]struct {
		members []*curatorv1.ConsensusMemberStatus
		want    []string
	}{
		"workers first, the leader's node last": {
			members: []*curatorv1.ConsensusMemberStatus{member("a", true), member("b", false), member("c", false)},
			want:    []string{"w", "v", "b", "c", "a"},
		},
		"the leader listed last already": {
			members: []*curatorv1.ConsensusMemberStatus{member("a", false), member("b", false), member("v", true)},
			want:    []string{"c", "w", "a", "b", "v"},
		},
		"no leader known: voters after workers, in their order": {
			members: []*curatorv1.ConsensusMemberStatus{member("c", false), member("a", false)},
			want:    []string{"b", "w", "v", "a", "c"},
		},
		"no member: the fleet's order": {
			want: []string{"a", "b", "c", "w", "v"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var got []string
			for _, n := range Order(nodes, &curatorv1.GetConsensusStatusResponse{Members: tc.members}) {
				got = append(got, n.Name)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("order %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLast(t *testing.T) {
	for name, tc := range map[string]struct {
		names []string
		last  string
		want  []string
	}{
		"moved to the end":      {[]string{"x", "y", "z"}, "x", []string{"y", "z", "x"}},
		"already last":          {[]string{"x", "y"}, "y", []string{"x", "y"}},
		"unknown: order kept":   {[]string{"x", "y"}, "q", []string{"x", "y"}},
		"empty: order kept too": {[]string{"y", "x"}, "", []string{"y", "x"}},
	} {
		t.Run(name, func(t *testing.T) {
			if got := last(tc.names, tc.last); !slices.Equal(got, tc.want) {
				t.Errorf("last(%v, %q) = %v, want %v", tc.names, tc.last, got, tc.want)
			}
		})
	}
}

// TestUnhealthyVoters: the report tells a voter that did not answer (down)
// from one that answered without a leader (in an election); learners and
// healthy voters are not named.
func TestUnhealthyVoters(t *testing.T) {
	voter := func(node string, healthy bool, index uint64) *curatorv1.ConsensusMemberStatus {
		return &curatorv1.ConsensusMemberStatus{NodeId: node, Healthy: healthy, RaftIndex: index}
	}
	learner := &curatorv1.ConsensusMemberStatus{NodeId: "l", Learner: true}
	for name, tc := range map[string]struct {
		members []*curatorv1.ConsensusMemberStatus
		silent  int
		why     string
	}{
		"all healthy":                       {[]*curatorv1.ConsensusMemberStatus{voter("a", true, 9), voter("b", true, 9), learner}, 0, ""},
		"one restarts":                      {[]*curatorv1.ConsensusMemberStatus{voter("a", false, 0), voter("b", true, 9), voter("c", true, 9)}, 1, ", when a did not answer"},
		"the leader's restart: an election": {[]*curatorv1.ConsensusMemberStatus{voter("a", false, 0), voter("b", false, 9), voter("c", true, 9)}, 1, ", when a did not answer and b answered without a leader (an election)"},
		"two down: the quorum lost":         {[]*curatorv1.ConsensusMemberStatus{voter("a", false, 0), voter("b", false, 0), voter("c", false, 9)}, 2, ", when a, b did not answer and c answered without a leader (an election)"},
	} {
		t.Run(name, func(t *testing.T) {
			st := &curatorv1.GetConsensusStatusResponse{Members: tc.members}
			if got := silentVoters(st); got != tc.silent {
				t.Errorf("silentVoters = %d, want %d", got, tc.silent)
			}
			if got := unhealthyVoters(st); got != tc.why {
				t.Errorf("unhealthyVoters = %q, want %q", got, tc.why)
			}
		})
	}
}
