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
