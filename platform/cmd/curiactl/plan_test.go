package main

import (
	"bytes"
	"strings"
	"testing"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
)

func testPlan() *reconcilerv1.PlanResponse {
	add := &reconcilerv1.Action{Kind: reconcilerv1.ActionKind_ACTION_KIND_ADD_MEMBER, NodeId: "node-d", Reason: "autopilot: 3 voters,\ncontrol_plane_size 5"}
	return &reconcilerv1.PlanResponse{
		Action: add, Members: 3, Nodes: 5,
		Config: &curatorv1.ClusterConfig{ControlPlaneSize: 5},
		Steps: []*reconcilerv1.PlannedStep{
			{Action: add, Voters: 3, HealthyVoters: 3, FailureTolerance: 1},
			{Action: &reconcilerv1.Action{Kind: reconcilerv1.ActionKind_ACTION_KIND_PROMOTE, NodeId: "node-d", MemberId: 0xabc, Reason: "caught up"}, Voters: 4, HealthyVoters: 4, FailureTolerance: 1},
			{Action: &reconcilerv1.Action{Kind: reconcilerv1.ActionKind_ACTION_KIND_NONE, Reason: "converged"}, Voters: 5, HealthyVoters: 5, FailureTolerance: 2},
		},
	}
}

func TestPlanTable(t *testing.T) {
	var b bytes.Buffer
	tw := newTable(&b)
	planTable(tw, testPlan(), []string{"control_plane_size"})
	tw.Flush()
	want := `PLANNED UNDER:  control_plane_size=5 paused=false (proposed: control_plane_size; nothing written)
OBSERVED:       3 etcd members, 5 nodes
NEXT ACTION:    ADD_MEMBER node-d: autopilot: 3 voters, control_plane_size 5

STEP  ACTION      NODE    MEMBER            VOTERS  HEALTHY  TOLERANCE  REASON
1     ADD_MEMBER  node-d  -                 3       3        1          autopilot: 3 voters, control_plane_size 5
2     PROMOTE     node-d  0000000000000abc  4       4        1          caught up
3     NONE        -       -                 5       5        2          converged
`
	if b.String() != want {
		t.Fatalf("plan:\n%s\nwant:\n%s", b.String(), want)
	}
	for _, format := range []string{"json", "yaml"} {
		var b bytes.Buffer
		if err := printMessage(&b, format, testPlan(), nil); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), "ACTION_KIND_PROMOTE") || !strings.Contains(b.String(), "controlPlaneSize") {
			t.Errorf("-o %s:\n%s", format, b.String())
		}
	}
}
