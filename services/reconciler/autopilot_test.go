package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	auditv1 "curia.dev/gen/curia/audit/v1"
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
// test ends), as its agent would: a beat every 200ms on one stream, a new
// stream when one breaks (a curator's etcd client may stall on a frozen
// member for a while).
func heartbeat(t *testing.T, cur curatorv1.CuratorClient) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			stream, err := cur.Heartbeat(ctx)
			for err == nil && ctx.Err() == nil {
				if err = stream.Send(&curatorv1.HeartbeatRequest{}); err == nil {
					select {
					case <-ctx.Done():
					case <-time.After(200 * time.Millisecond):
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return cancel
}

// beatingCluster is a one-voter cluster whose curators time a node out
// after 1 s, with the bootstrap node's heartbeats kept up.
func beatingCluster(t *testing.T) *cut.Cluster {
	t.Helper()
	c := cut.New(t, 1, "--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s")
	bootstrap, err := rpc.Dial(c.Running().Addr, rpc.ClientConfig{Credentials: c.BootstrapNode, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bootstrap.Close() })
	heartbeat(t, curatorv1.NewCuratorClient(bootstrap))
	return c
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

// TestAutopilot: a dry run of control_plane_size 3 shows the sequence;
// then a one-voter cluster grows to three voters by itself (the test plays
// the nodes' agents: heartbeats, and starting the member a role names);
// when a voter's node is silent for less than the dead node threshold, a
// standby joins and stands by, and goes when the voter is back; when a
// voter's node freezes, a healthy node joins first and the frozen voter
// goes after, never below two healthy voters; thawed, the removed member
// is turned away and the cluster stays as it was.
func TestAutopilot(t *testing.T) {
	c := beatingCluster(t)
	ctx := ctxT(t)

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

	// A voter's node falls silent for less than the threshold: a standby
	// joins at once, while the voter is merely unhealthy, and is held as
	// a learner; the voter's heartbeats come back and the standby goes.
	// The voters stay as they were throughout.
	setConfig := func(cfg *curatorv1.ClusterConfig, paths ...string) {
		t.Helper()
		if _, err := c.Management().UpdateClusterConfig(ctx, &curatorv1.UpdateClusterConfigRequest{Config: cfg, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}, Reason: "autopilot test"}); err != nil {
			t.Fatal(err)
		}
	}
	setConfig(&curatorv1.ClusterConfig{DeadNodeThreshold: durationpb.New(time.Minute), Stabilization: durationpb.New(time.Second)}, "dead_node_threshold", "stabilization")
	var victim string
	for id := range nodes {
		victim = id
		break
	}
	standby := enrol()
	nodes[victim].stop()
	silent := time.Now()
	proctest.Eventually(t, time.Minute, func() error {
		playAgents()
		if got := voters(c); !maps.Equal(got, want) {
			t.Fatalf("voters %v while %s is silent for less than the threshold, want %v; the reconciler acted:\n%s", got, victim, want, acted(rec))
		}
		st, err := reconcilerv1.NewReconcilerClient(rc).GetStatus(ctx, &reconcilerv1.GetStatusRequest{})
		if err != nil {
			return err
		}
		if !strings.Contains(st.GetLastResultDetail(), "stands by to replace it") {
			return fmt.Errorf("the reconciler's last pass: %s", st.GetLastResultDetail())
		}
		return nil
	})
	if since := time.Since(silent); since >= time.Minute {
		t.Fatalf("the standby stood by only %v after the voter fell silent, past the threshold", since)
	}
	t.Logf("a standby (%s) joined and stands by %v after voter %s fell silent", standby.agent.ID, time.Since(silent).Round(100*time.Millisecond), victim)
	nodes[victim].stop = heartbeat(t, nodes[victim].agent.Curator(c.Running()))
	proctest.Eventually(t, time.Minute, func() error {
		if got := voters(c); !maps.Equal(got, want) {
			t.Fatalf("voters %v after %s's heartbeats came back, want %v", got, victim, want)
		}
		for _, m := range c.Voters[0].Members().Members {
			if m.NodeId == standby.agent.ID {
				return fmt.Errorf("the standby is still a member: %v", m)
			}
		}
		if r := node(t, c, standby.agent.ID).GetRoles(); r.GetConsensusMember() != nil {
			return fmt.Errorf("the standby still has ConsensusMember: %v", r)
		}
		return nil
	})
	// It is no candidate for what follows: its member data is a removed
	// member's, which only its agent knows to wipe.
	standby.stop()
	delete(nodes, standby.agent.ID)
	setConfig(&curatorv1.ClusterConfig{DeadNodeThreshold: durationpb.New(10 * time.Second)}, "dead_node_threshold")

	// A voter's node dies: no heartbeats, its member gone.
	spare := enrol()
	// Frozen, as a stalled VM: no heartbeats, its etcd member silent.
	nodes[victim].stop()
	nodes[victim].cons.Pause()
	died := time.Now()
	delete(want, victim)
	want[spare.agent.ID] = true
	proctest.Eventually(t, 2*time.Minute, func() error {
		playAgents()
		checkQuorum()
		got := voters(c)
		if got[victim] && got[spare.agent.ID] && len(got) == 3 {
			t.Fatalf("voters %v: the dead voter was kept and a live one removed; the reconciler acted:\n%s", got, acted(rec))
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("voters %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
		}
		return nil
	})
	t.Logf("dead voter replaced %v after its node died (threshold 10s); the reconciler acted:\n%s", time.Since(died).Round(100*time.Millisecond), acted(rec))
	proctest.Eventually(t, time.Minute, func() error {
		if r := node(t, c, victim).GetRoles(); r.GetConsensusMember() != nil {
			return fmt.Errorf("the dead node still has ConsensusMember: %v", r)
		}
		return nil
	})

	// The frozen machine comes back: its member was removed, so etcd's
	// peers turn it away and it stops; the cluster is as it was, with
	// three healthy voters.
	nodes[victim].cons.Resume()
	proctest.Eventually(t, time.Minute, func() error {
		if st := nodes[victim].cons.Status(); st.State != consensusv1.LifecycleState_LIFECYCLE_STATE_STOPPED {
			return fmt.Errorf("the removed member after its thaw: %v (%s), want stopped", st.State, st.StateReason)
		}
		return nil
	})
	if got := voters(c); !maps.Equal(got, want) {
		t.Fatalf("voters %v after the removed member came back, want %v", got, want)
	}
	st, err := c.Management().GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil || st.HealthyVoters != 3 || st.FailureTolerance != 1 {
		t.Fatalf("after the removed member came back: %v %v, want 3 healthy voters", st, err)
	}
}

// acted is the reconciler's "acted" log lines: the changes it made.
func acted(r *replica) string {
	b, _ := os.ReadFile(r.Log)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `msg=acted`) || strings.Contains(l, `msg="action failed"`) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestCrashInAddMember: autopilot's AddMember is two writes, the etcd
// member and then the role; the reconciler dies between them (a failpoint).
// Restarted, it finds a member whose node lacks ConsensusMember and gives
// the role (rule 2), with join parameters that name that member, so the
// node joins and is promoted: the change is finished, not fought (no second
// member, no removal).
func TestCrashInAddMember(t *testing.T) {
	c := beatingCluster(t)
	ctx := ctxT(t)
	a, n := c.NewConsensusAgent()
	a.Enrol(ctx)
	if _, err := a.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: cut.VoterStatus(n)}); err != nil {
		t.Fatal(err)
	}
	heartbeat(t, a.Curator(c.Running()))

	rec := newReconciler(t, c, "reconciler-0")
	rec.ArmCrash("after-add-member")
	rec.Start()
	if _, err := c.Management().UpdateClusterConfig(ctx, &curatorv1.UpdateClusterConfigRequest{
		Config: &curatorv1.ClusterConfig{ControlPlaneSize: 3}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"control_plane_size"}}, Reason: "crash test",
	}); err != nil {
		t.Fatal(err)
	}
	proctest.Eventually(t, time.Minute, func() error {
		if rec.Running() {
			return errors.New("the reconciler has not reached its failpoint yet")
		}
		return nil
	})
	// Membership ahead of roles: a learner, no role.
	eventuallyState(t, c, map[string]consensusState{
		c.Voters[0].ID: {node: true, cm: true, kc: true, member: true},
		a.ID:           {node: true, member: true},
	})
	var learner uint64
	for _, m := range c.Voters[0].Members().Members {
		if m.NodeId == a.ID {
			learner = m.Id
		}
	}

	rec.Start()
	var join *consensusv1.JoinParameters
	proctest.Eventually(t, time.Minute, func() error {
		if join = node(t, c, a.ID).GetRoles().GetConsensusMember().GetJoin(); join == nil {
			return errors.New("no ConsensusMember yet")
		}
		return nil
	})
	if join.GetMemberId() != learner {
		t.Fatalf("the role names member %x, the learner added before the crash is %x", join.GetMemberId(), learner)
	}
	if _, err := n.Self().Start(ctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: join}}); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{c.Voters[0].ID: true, a.ID: true}
	proctest.Eventually(t, time.Minute, func() error {
		if got := voters(c); !maps.Equal(got, want) {
			return fmt.Errorf("voters %v, want %v", got, want)
		}
		return nil
	})
	for _, ev := range audit(t, c) {
		if ev.Action == auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE {
			t.Errorf("a member was removed on the way: %v", ev)
		}
	}
}
