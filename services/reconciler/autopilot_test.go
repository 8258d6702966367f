package reconciler_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
	ct "curia.dev/services/consensus/consensustest"
	cut "curia.dev/services/curator/curatortest"
)

// heartbeat keeps a node healthy until the returned stop is called (or the
// test ends): one heartbeat stream, a beat every 200ms.
func heartbeat(t *testing.T, cur curatorv1.CuratorClient) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := cur.Heartbeat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		go func() {
			for {
				if _, err := stream.Recv(); err != nil {
					return
				}
			}
		}()
		for ctx.Err() == nil {
			if stream.Send(&curatorv1.HeartbeatRequest{}) != nil {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return cancel
}

// voters are the node ids of etcd's voters.
func voters(c *cut.Cluster) map[string]bool {
	out := map[string]bool{}
	for _, m := range c.Voters[0].Members().Members {
		if !m.Learner {
			out[m.NodeId] = true
		}
	}
	return out
}

// TestAutopilot: with control_plane_size 3, a one-voter cluster grows to
// three voters by itself (the test plays the nodes' agents: heartbeats,
// and starting the member a role names); when a voter's node dies, a
// healthy node joins first and the dead voter goes after, and membership
// never drops below two healthy voters on the way.
func TestAutopilot(t *testing.T) {
	c := cut.New(t, 1, "--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s")
	ctx := ctxT(t)
	bootstrap, err := rpc.Dial(c.Running().Addr, rpc.ClientConfig{Credentials: c.BootstrapNode, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bootstrap.Close() })
	heartbeat(t, curatorv1.NewCuratorClient(bootstrap))

	type member struct {
		agent *cut.Agent
		cons  *ct.Node
		stop  func()
	}
	nodes := map[string]*member{}
	enrol := func() *member {
		a, n := c.NewConsensusAgent()
		a.Enrol(ctx)
		if _, err := a.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: cut.VoterStatus(n)}); err != nil {
			t.Fatal(err)
		}
		nd := &member{agent: a, cons: n, stop: heartbeat(t, a.Curator(c.Running()))}
		nodes[a.ID] = nd
		return nd
	}
	enrol()
	enrol()
	rec := startReconciler(t, c, "reconciler-0")

	// The plan a proposed size would cause, before it is written: two
	// nodes join and are promoted, ending at a tolerance of one failure.
	rc, err := rpc.Dial(rec.addr, rpc.ClientConfig{Credentials: c.PKI.Creds(t, cut.Admin), ServerKinds: []pki.Kind{pki.KindReconciler}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	var dry *reconcilerv1.PlanResponse
	proctest.Eventually(t, time.Minute, func() (err error) {
		dry, err = reconcilerv1.NewReconcilerClient(rc).Plan(ctx, &reconcilerv1.PlanRequest{
			Proposed: &curatorv1.ClusterConfig{ControlPlaneSize: 3}, ProposedMask: &fieldmaskpb.FieldMask{Paths: []string{"control_plane_size"}},
		})
		return err
	})
	kinds := map[reconcilerv1.ActionKind]int{}
	for _, s := range dry.Steps {
		kinds[s.Action.Kind]++
	}
	last := dry.Steps[len(dry.Steps)-1]
	if kinds[reconcilerv1.ActionKind_ACTION_KIND_ADD_MEMBER] != 2 || kinds[reconcilerv1.ActionKind_ACTION_KIND_PROMOTE] != 2 ||
		last.Action.Kind != reconcilerv1.ActionKind_ACTION_KIND_NONE || last.Voters != 3 || last.FailureTolerance != 1 {
		t.Fatalf("the plan of control_plane_size 3 from one voter: %v", dry.Steps)
	}
	if got, err := c.Management().GetClusterConfig(ctx, &curatorv1.GetClusterConfigRequest{}); err != nil || got.Config.ControlPlaneSize != 0 {
		t.Fatalf("after the dry run, the stored configuration: %v %v", got, err)
	}
	_, err = reconcilerv1.NewReconcilerClient(rc).Plan(ctx, &reconcilerv1.PlanRequest{
		Proposed: &curatorv1.ClusterConfig{ControlPlaneSize: 2}, ProposedMask: &fieldmaskpb.FieldMask{Paths: []string{"control_plane_size"}},
	})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a plan for control_plane_size 2: %v, want InvalidArgument", err)
	}

	// The agents' part: a node given ConsensusMember starts the member its
	// role names.
	started := map[string]bool{}
	playAgents := func() {
		for id, nd := range nodes {
			if started[id] || !nd.cons.Running() {
				continue
			}
			join := node(t, c, id).GetRoles().GetConsensusMember().GetJoin()
			if join == nil {
				continue
			}
			if _, err := nd.cons.Self().Start(ctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: join}}); err == nil {
				started[id] = true
			}
		}
	}
	// Healthy voters never drop below two once there are three: checked
	// on every poll.
	grown := false
	checkQuorum := func() {
		st, err := c.Management().GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
		if err != nil {
			return
		}
		if grown && st.HealthyVoters < 2 {
			t.Fatalf("%d healthy voters of %d", st.HealthyVoters, st.Voters)
		}
	}

	if _, err := c.Management().UpdateClusterConfig(ctx, &curatorv1.UpdateClusterConfigRequest{
		Config:     &curatorv1.ClusterConfig{ControlPlaneSize: 3, DeadNodeThreshold: durationpb.New(10 * time.Second)},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"control_plane_size", "dead_node_threshold"}},
		Reason:     "autopilot test",
	}); err != nil {
		t.Fatal(err)
	}
	begun := time.Now()
	want := map[string]bool{c.Voters[0].ID: true}
	for id := range nodes {
		want[id] = true
	}
	proctest.Eventually(t, 2*time.Minute, func() error {
		playAgents()
		if got := voters(c); !maps.Equal(got, want) {
			return fmt.Errorf("voters %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
		}
		return nil
	})
	grown = true
	t.Logf("1 → 3 voters %v after control_plane_size 3", time.Since(begun).Round(100*time.Millisecond))

	// A voter's node dies: no heartbeats, its member gone.
	spare := enrol()
	var victim string
	for id := range nodes {
		if id != spare.agent.ID {
			victim = id
			break
		}
	}
	nodes[victim].stop()
	nodes[victim].cons.Kill()
	died := time.Now()
	delete(want, victim)
	want[spare.agent.ID] = true
	proctest.Eventually(t, 2*time.Minute, func() error {
		playAgents()
		checkQuorum()
		got := voters(c)
		if got[victim] && got[spare.agent.ID] && len(got) == 3 {
			t.Fatalf("voters %v: the dead voter was kept and a live one removed", got)
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("voters %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
		}
		return nil
	})
	t.Logf("dead voter replaced %v after its node died (threshold 10s)", time.Since(died).Round(100*time.Millisecond))
	proctest.Eventually(t, time.Minute, func() error {
		if r := node(t, c, victim).GetRoles(); r.GetConsensusMember() != nil {
			return fmt.Errorf("the dead node still has ConsensusMember: %v", r)
		}
		return nil
	})
}
