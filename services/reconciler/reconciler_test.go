package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/records"
	"curia.dev/platform/rpc"
	cut "curia.dev/services/curator/curatortest"
)

// replica is one reconciler process.
type replica struct {
	name, addr string
	// metrics is the plain-HTTP address of /metrics and /healthz.
	metrics string
	*proctest.Proc
}

func startReconciler(t testing.TB, c *cut.Cluster, name string, flags ...string) *replica {
	t.Helper()
	r := newReconciler(t, c, name, flags...)
	r.Start()
	return r
}

// newReconciler prepares a replica; Start runs it. flags come after the
// defaults, so they override them.
func newReconciler(t testing.TB, c *cut.Cluster, name string, flags ...string) *replica {
	t.Helper()
	files := c.PKI.Files(t, pki.Principal{Kind: pki.KindReconciler})
	var curators, consensus []string
	for _, cur := range c.Curators {
		curators = append(curators, cur.Addr)
	}
	for _, v := range c.Voters {
		consensus = append(consensus, v.API)
	}
	r := &replica{name: name, addr: proctest.FreeAddr(t), metrics: proctest.FreeAddr(t)}
	r.Proc = proctest.New(t, name, proctest.Build(t, "curia.dev/services/reconciler/cmd/reconciler", "failpoints"), append([]string{
		"--cluster", c.PKI.Cluster, "--name", name,
		"--ca", files.CA, "--cert", files.Cert, "--key", files.Key,
		"--listen", r.addr,
		"--listen-metrics", r.metrics,
		"--curator", strings.Join(curators, ","),
		"--consensus", strings.Join(consensus, ","),
		"--lease-ttl", "3s", "--tick", "500ms",
		"--stabilization", "1s", "--learner-start-timeout", "30s",
		"--log-level", "debug",
	}, flags...)...)
	return r
}

func (r *replica) status(t testing.TB, c *cut.Cluster) (*reconcilerv1.GetStatusResponse, error) {
	return r.statusAs(t, c.PKI.Creds(t, cut.Admin))
}

// untilConverged waits for a pass of r that found roles and membership in
// agreement.
func (r *replica) untilConverged(t testing.TB, c *cut.Cluster) {
	t.Helper()
	proctest.Eventually(t, time.Minute, func() error {
		st, err := r.status(t, c)
		if err != nil {
			return err
		}
		if st.LastResult != reconcilerv1.PassResult_PASS_RESULT_CONVERGED {
			return fmt.Errorf("not converged: %s: %s", st.LastResult, st.LastResultDetail)
		}
		return nil
	})
}

// statusAs asks for the replica's status with creds, on a new connection.
func (r *replica) statusAs(t testing.TB, creds *rpc.Credentials) (*reconcilerv1.GetStatusResponse, error) {
	cc, err := rpc.Dial(r.addr, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindReconciler}})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return reconcilerv1.NewReconcilerClient(cc).GetStatus(ctx, &reconcilerv1.GetStatusRequest{})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// consensusState is what a test compares: per node id, whether it is a
// node, has ConsensusMember / KubernetesController, is an etcd member.
type consensusState struct{ node, cm, kc, member bool }

func state(t *testing.T, c *cut.Cluster) (map[string]consensusState, error) {
	t.Helper()
	return stateOf(t, c, c.Voters[0].Members())
}

// stateOf is state with the given member list.
func stateOf(t *testing.T, c *cut.Cluster, members *consensusv1.ListMembersResponse) (map[string]consensusState, error) {
	t.Helper()
	out := map[string]consensusState{}
	stream, err := c.Management().GetNodes(context.Background(), &curatorv1.GetNodesRequest{})
	if err != nil {
		return nil, err
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		for _, n := range resp.Nodes {
			out[n.Id] = consensusState{node: true, cm: n.Roles.GetConsensusMember() != nil, kc: n.Roles.GetKubernetesController() != nil}
		}
	}
	for _, m := range members.Members {
		s := out[m.NodeId]
		s.member = true
		out[m.NodeId] = s
	}
	return out, nil
}

func eventuallyState(t *testing.T, c *cut.Cluster, want map[string]consensusState) {
	t.Helper()
	proctest.Eventually(t, time.Minute, func() error {
		got, err := state(t, c)
		if err != nil {
			return err
		}
		if !maps.Equal(got, want) {
			return fmt.Errorf("state %v, want %v", got, want)
		}
		return nil
	})
}

// putRecord rewrites a node record directly in etcd: the test plays a
// management change that was interrupted half-way.
func putRecord(t *testing.T, c *cut.Cluster, n *curatorv1.Node) {
	t.Helper()
	b, err := records.EncodeNode(n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Etcd(c.Voters[0].ClientURL).Put(context.Background(), keys.Node(n.Id), string(b)); err != nil {
		t.Fatal(err)
	}
}

func node(t testing.TB, c *cut.Cluster, id string) *curatorv1.Node {
	t.Helper()
	resp, err := c.Etcd(c.Voters[0].ClientURL).Get(context.Background(), keys.Node(id))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("node %s: %v %v", id, resp, err)
	}
	n, err := records.DecodeNode(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBackgroundSyncEtcd is Metropolis' test of the same name against real
// services: a member without the role gets it; an extra member with no node
// is removed while roles stay; the stale ConsensusMember and
// KubernetesController roles go next; then nothing changes.
func TestBackgroundSyncEtcd(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	boot := c.Voters[0].ID

	// The bootstrap node is a member whose role write was lost.
	n := node(t, c, boot)
	n.Roles.ConsensusMember, n.Roles.KubernetesController = nil, nil
	putRecord(t, c, n)
	eventuallyState(t, c, map[string]consensusState{boot: {node: true, member: true}})

	r := startReconciler(t, c, "reconciler-0")
	eventuallyState(t, c, map[string]consensusState{boot: {node: true, cm: true, member: true}})

	// A node with ConsensusMember and KubernetesController that is not a
	// member, and a member of no node; the reconciler is paused meanwhile
	// so the order of its next actions can be checked.
	pause(t, c, r, true)
	extra := c.NewAgent()
	extra.Enrol(ctx)
	en := node(t, c, extra.ID)
	en.Roles = &curatorv1.Roles{ConsensusMember: &curatorv1.ConsensusMember{}, KubernetesController: &curatorv1.KubernetesController{}}
	putRecord(t, c, en)
	if _, err := c.Etcd(c.Voters[0].ClientURL).MemberAddAsLearner(ctx, []string{"https://foo:1234"}); err != nil {
		t.Fatal(err)
	}
	eventuallyState(t, c, map[string]consensusState{
		boot:     {node: true, cm: true, member: true},
		extra.ID: {node: true, cm: true, kc: true},
		"foo":    {member: true},
	})
	pause(t, c, r, false)
	eventuallyState(t, c, map[string]consensusState{
		boot:     {node: true, cm: true, member: true},
		extra.ID: {node: true},
	})
	// The member went before the roles: the audit log says so.
	var order []auditv1.AuditAction
	for _, ev := range audit(t, c) {
		if strings.HasPrefix(ev.Actor, "reconciler") && ev.Outcome == auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED {
			order = append(order, ev.Action) // intents and role writes
		}
	}
	want := []auditv1.AuditAction{
		auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_ADD_CONSENSUS_MEMBER,
		auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE,
		auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_REMOVE_CONSENSUS_MEMBER,
	}
	if !slices.Equal(order, want) {
		t.Fatalf("reconciler actions %v, want %v", order, want)
	}
	// Converged: further passes change nothing.
	st, err := r.status(t, c)
	if err != nil {
		t.Fatal(err)
	}
	proctest.Eventually(t, 30*time.Second, func() error {
		later, err := r.status(t, c)
		if err != nil {
			return err
		}
		if later.Passes < st.Passes+3 {
			return fmt.Errorf("%d passes so far", later.Passes)
		}
		if later.Actions != st.Actions || later.LastResult != reconcilerv1.PassResult_PASS_RESULT_CONVERGED {
			return fmt.Errorf("not converged: %d actions (had %d), %s: %s", later.Actions, st.Actions, later.LastResult, later.LastResultDetail)
		}
		return nil
	})
}

// TestDriftOutsideCuria: a member added outside curia (etcdctl member add)
// bumps no membership epoch and changes no node, and yet the reconciler
// removes it at once: consensus's WatchMembership sends etcd's member list
// when it changes. The replica's tick is an hour, so no backstop pass
// hides a missing trigger.
func TestDriftOutsideCuria(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	r := startReconciler(t, c, "reconciler-0", "--tick", "1h")
	r.untilConverged(t, c)
	begun := time.Now()
	orphan, err := c.Etcd(c.Voters[0].ClientURL).MemberAddAsLearner(ctx, []string{"https://127.0.0.9:2380"})
	if err != nil {
		t.Fatal(err)
	}
	proctest.Eventually(t, 30*time.Second, func() error {
		for _, m := range c.Voters[0].Members().Members {
			if m.Id == orphan.Member.ID {
				return fmt.Errorf("the orphan learner %x is still a member", m.Id)
			}
		}
		return nil
	})
	t.Logf("a learner added outside curia removed %v later", time.Since(begun).Round(time.Millisecond))
}

// TestConfigChangeTriggersPass: a change of the cluster configuration
// starts a pass at once, with no tick to wait for (an hour here) and no
// node or membership change to trigger one.
func TestConfigChangeTriggersPass(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	r := startReconciler(t, c, "reconciler-0", "--tick", "1h")
	r.untilConverged(t, c)
	// The passes the start triggered are over once the count holds still
	// for 2 s; the hour's tick brings no other.
	var before int64
	since := time.Now()
	proctest.Eventually(t, time.Minute, func() error {
		st, err := r.status(t, c)
		if err != nil {
			return err
		}
		if st.Passes != before {
			before, since = st.Passes, time.Now()
		}
		if time.Since(since) < 2*time.Second {
			return fmt.Errorf("%d passes so far, the last within 2 s", before)
		}
		return nil
	})
	if _, err := c.Management().UpdateClusterConfig(ctx, &curatorv1.UpdateClusterConfigRequest{
		Config:     &curatorv1.ClusterConfig{DeadNodeThreshold: durationpb.New(time.Minute)},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"dead_node_threshold"}},
	}); err != nil {
		t.Fatal(err)
	}
	proctest.Eventually(t, 30*time.Second, func() error {
		st, err := r.status(t, c)
		if err != nil {
			return err
		}
		if st.Passes == before {
			return fmt.Errorf("no pass since the configuration changed (%d passes)", st.Passes)
		}
		return nil
	})
}

func pause(t *testing.T, c *cut.Cluster, r *replica, on bool) {
	t.Helper()
	cc, err := rpc.Dial(r.addr, rpc.ClientConfig{Credentials: c.PKI.Creds(t, cut.Admin), ServerKinds: []pki.Kind{pki.KindReconciler}})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cl := reconcilerv1.NewReconcilerClient(cc)
	if on {
		_, err = cl.Pause(context.Background(), &reconcilerv1.PauseRequest{Reason: "test"})
	} else {
		_, err = cl.Resume(context.Background(), &reconcilerv1.ResumeRequest{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

func audit(t *testing.T, c *cut.Cluster) []*auditv1.Event {
	t.Helper()
	return cut.AuditLog(t, c.Management())
}

// TestCrashAfterAddNode: the curator dies between a successful AddNode and
// the role write; the reconciler completes the role, the node joins, the
// learner is promoted. Then the same for removal.
func TestCrashAfterMembershipChange(t *testing.T) {
	c := cut.New(t, 2)
	ctx := ctxT(t)
	// Whichever curator leads crashes at the first of each.
	for _, cur := range c.Curators {
		cur.ArmCrash("after-add-node")
		cur.ArmCrash("after-remove-member")
	}
	a, cn := c.NewConsensusAgent()
	a.Enrol(ctx)
	if _, err := a.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: cut.VoterStatus(cn)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Management().UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(true)}); err == nil {
		t.Fatal("the curator survived its failpoint")
	}
	for _, cur := range c.Curators {
		cur.Start() // the one that hit the failpoint comes back
	}
	eventuallyState(t, c, map[string]consensusState{
		c.Voters[0].ID: {node: true, cm: true, kc: true, member: true},
		a.ID:           {node: true, member: true}, // membership ahead of roles
	})

	startReconciler(t, c, "reconciler-0")
	eventuallyState(t, c, map[string]consensusState{
		c.Voters[0].ID: {node: true, cm: true, kc: true, member: true},
		a.ID:           {node: true, cm: true, member: true},
	})
	// The role carries join parameters: the node's consensus joins with
	// them and the reconciler promotes it.
	join := node(t, c, a.ID).Roles.GetConsensusMember().GetJoin()
	if _, err := cn.Self().Start(ctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: join}}); err != nil {
		t.Fatal(err)
	}
	proctest.Eventually(t, time.Minute, func() error {
		for _, m := range c.Voters[0].Members().Members {
			if m.NodeId == a.ID && !m.Learner {
				return nil
			}
		}
		return errors.New("not promoted yet")
	})

	// Removal: the curator dies after RemoveMember; the reconciler takes
	// the role.
	proctest.Eventually(t, time.Minute, func() error {
		_, err := c.Management().UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(false)})
		if err == nil {
			t.Fatal("the curator survived its failpoint")
		}
		for _, m := range c.Voters[0].Members().Members {
			if m.NodeId == a.ID {
				return fmt.Errorf("still a member: %v", err)
			}
		}
		return nil
	})
	for _, cur := range c.Curators {
		if !cur.Running() {
			cur.Start()
		}
	}
	eventuallyState(t, c, map[string]consensusState{
		c.Voters[0].ID: {node: true, cm: true, kc: true, member: true},
		a.ID:           {node: true},
	})
}

// acceptedBy counts the changes the audit log records as accepted from a
// reconciler fenced on the lease of create revision leaseRev: role writes,
// and membership changes that etcd applied.
func acceptedBy(t *testing.T, c *cut.Cluster, leaseRev int64) (roleWrites, memberChanges int) {
	t.Helper()
	fence := fmt.Sprintf("%s@%d", keys.Lease("reconciler"), leaseRev)
	for _, ev := range audit(t, c) {
		if !slices.Contains(ev.Fence, fence) {
			continue
		}
		switch ev.Action {
		case auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_ADD_CONSENSUS_MEMBER, auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_REMOVE_CONSENSUS_MEMBER:
			roleWrites++
		default:
			if ev.Outcome == auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED {
				memberChanges++
			}
		}
	}
	return roleWrites, memberChanges
}

// leaseRevision waits until a replica holds the lease and returns the
// lease's create revision.
func leaseRevision(t *testing.T, c *cut.Cluster, r *replica) int64 {
	t.Helper()
	var rev int64
	proctest.Eventually(t, time.Minute, func() error {
		st, err := r.status(t, c)
		if err != nil {
			return err
		}
		for _, cond := range st.Fence.GetConditions() {
			if cond.Key == keys.Lease("reconciler") && st.Role == reconcilerv1.Role_ROLE_ACTIVE {
				rev = cond.CreateRevision
				return nil
			}
		}
		return fmt.Errorf("%s holds no lease: %v", r.name, st)
	})
	return rev
}

// TestStaleSnapshotRefused: a management change lands between a pass's
// read and its role write; the write is refused at the curator (zero stale
// writes accepted), and the next pass plans anew without losing the
// management change.
func TestStaleSnapshotRefused(t *testing.T) {
	c := cut.New(t, 1)
	boot := c.Voters[0].ID
	r := startReconciler(t, c, "reconciler-0")
	eventuallyState(t, c, map[string]consensusState{boot: {node: true, cm: true, kc: true, member: true}})
	lease := leaseRevision(t, c, r)

	// Hold the next action right before its call, after every check of
	// the reconciler's own.
	release := r.Hold("before-call")
	n := node(t, c, boot)
	n.Roles.ConsensusMember, n.Roles.KubernetesController = nil, nil
	putRecord(t, c, n) // drift: the reconciler plans to add the role
	r.Reached("before-call")
	// Meanwhile the record changes (its ModRevision moves).
	n.Labels = map[string]string{"changed": "meanwhile"}
	putRecord(t, c, n)
	before, _ := acceptedBy(t, c, lease)
	release()

	// The next pass is right: the role comes back, the label stays.
	eventuallyState(t, c, map[string]consensusState{boot: {node: true, cm: true, member: true}})
	if got := node(t, c, boot).Labels["changed"]; got != "meanwhile" {
		t.Fatalf("the management change was lost: labels %v", node(t, c, boot).Labels)
	}
	// Exactly one role write was accepted: the fresh pass's. Had the held
	// (stale) one been accepted too, there would be two.
	if after, _ := acceptedBy(t, c, lease); after-before != 1 {
		t.Fatalf("%d role writes accepted after the record changed, want exactly 1 (the fresh pass's)", after-before)
	}
	if !r.LogContains("changed since revision") {
		t.Fatal("the held write was never refused: did it run?")
	}
}

// TestMemberOfLiveNodeKept: the reconciler plans to remove an etcd member
// whose node does not exist; before its call lands, the node appears (it
// enrolled; a stale view of the registry would still miss it). The removal
// carries the proof of absence, which fails at the resource: the member
// stays, and zero removals are applied.
func TestMemberOfLiveNodeKept(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	boot := c.Voters[0].ID
	r := startReconciler(t, c, "reconciler-0")
	eventuallyState(t, c, map[string]consensusState{boot: {node: true, cm: true, kc: true, member: true}})
	lease := leaseRevision(t, c, r)

	// A learner named after a node that does not exist yet (etcd names an
	// unstarted learner by its peer URL's host).
	ghost := c.NewAgent()
	release := r.Hold("before-call")
	if _, err := c.Etcd(c.Voters[0].ClientURL).MemberAddAsLearner(ctx, []string{"https://" + ghost.ID + ":2380"}); err != nil {
		t.Fatal(err)
	}
	r.Reached("before-call")
	ghost.Enrol(ctx)
	release()

	proctest.Eventually(t, time.Minute, func() error {
		if st, err := state(t, c); err == nil && !st[ghost.ID].member {
			t.Fatalf("the member of node %s, which exists, was removed", ghost.ID)
		}
		if !r.LogContains("node " + ghost.ID + " exists") {
			return errors.New("the held removal was not refused yet")
		}
		return nil
	})
	if _, removed := acceptedBy(t, c, lease); removed != 0 {
		t.Fatalf("%d membership changes applied; the member of a live node was removed", removed)
	}
	if st, err := state(t, c); err != nil || !st[ghost.ID].member {
		t.Fatalf("the member of node %s, which exists, is gone (%v)", ghost.ID, err)
	}
}

// TestIncarnations: a second process under the same name (a restarted twin
// while the first is only paused, a duplicated deployment) is another
// holder: it stands by while the first holds the lease.
func TestIncarnations(t *testing.T) {
	c := cut.New(t, 1)
	first := startReconciler(t, c, "reconciler-0")
	proctest.Eventually(t, time.Minute, func() error {
		st, err := first.status(t, c)
		if err != nil || st.Role != reconcilerv1.Role_ROLE_ACTIVE {
			return fmt.Errorf("first not active: %v %v", st, err)
		}
		return nil
	})
	twin := startReconciler(t, c, "reconciler-0")
	proctest.Eventually(t, time.Minute, func() error {
		st, err := twin.status(t, c)
		if err != nil {
			return err
		}
		if st.LeaseHolder == "" {
			return errors.New("the twin has not asked for the lease yet")
		}
		if st.Role != reconcilerv1.Role_ROLE_STANDBY || !strings.HasPrefix(st.LeaseHolder, "reconciler-0/") {
			// The holder's name, not a message about it.
			return fmt.Errorf("twin is %v, says the holder is %q; want standby behind reconciler-0/<first's incarnation>", st.Role, st.LeaseHolder)
		}
		return nil
	})
	if st, err := first.status(t, c); err != nil || st.Role != reconcilerv1.Role_ROLE_ACTIVE {
		t.Fatalf("first is %v (%v), want still active", st.GetRole(), err)
	}
}

// TestPausedReconcilerChangesNothing: the active replica is held right
// before a role write and frozen (SIGSTOP) past its lease; a standby (told
// to not act) takes the lease over. Nothing else changes: the node's
// revision and the membership epoch are as the frozen replica read them, so
// only the fence can stop its write. Woken up, its call goes out with the
// old lease's fence and is refused at the resource: zero of its writes are
// accepted after the takeover.
func TestPausedReconcilerChangesNothing(t *testing.T) {
	c := cut.New(t, 1)
	boot := c.Voters[0].ID
	old := startReconciler(t, c, "reconciler-0")
	eventuallyState(t, c, map[string]consensusState{boot: {node: true, cm: true, kc: true, member: true}})
	oldLease := leaseRevision(t, c, old)

	release := old.Hold("before-call")
	n := node(t, c, boot)
	n.Roles.ConsensusMember, n.Roles.KubernetesController = nil, nil
	putRecord(t, c, n)
	old.Reached("before-call")
	old.Pause()
	accepted, _ := acceptedBy(t, c, oldLease)

	// The standby takes the lease but does not act (held before acting).
	standby := newReconciler(t, c, "reconciler-1")
	releaseStandby := standby.Hold("before-act")
	standby.Start()
	proctest.Eventually(t, time.Minute, func() error {
		st, err := standby.status(t, c)
		if err != nil || st.Role != reconcilerv1.Role_ROLE_ACTIVE {
			return fmt.Errorf("the standby does not hold the lease yet: %v %v", st.GetRole(), err)
		}
		return nil
	})

	old.Resume()
	release()
	proctest.Eventually(t, time.Minute, func() error {
		if !old.LogContains("action failed") {
			return errors.New("the woken replica has not made its call yet")
		}
		return nil
	})
	if got, _ := acceptedBy(t, c, oldLease); got != accepted {
		t.Fatalf("%d writes with the old lease's fence accepted after the takeover", got-accepted)
	}
	if node(t, c, boot).Roles.GetConsensusMember() != nil {
		t.Fatal("the woken replica's stale write landed")
	}
	// The new holder completes the role.
	releaseStandby()
	eventuallyState(t, c, map[string]consensusState{boot: {node: true, cm: true, member: true}})
}

// TestStandbyTakesOver: one replica acts, the other stands by; kill -9 the
// active one and the standby takes over within the lease TTL.
func TestStandbyTakesOver(t *testing.T) {
	c := cut.New(t, 1)
	r0 := startReconciler(t, c, "reconciler-0")
	r1 := startReconciler(t, c, "reconciler-1")
	var active, standby *replica
	proctest.Eventually(t, time.Minute, func() error {
		s0, err0 := r0.status(t, c)
		s1, err1 := r1.status(t, c)
		if err0 != nil || err1 != nil {
			return fmt.Errorf("%v %v", err0, err1)
		}
		switch {
		case s0.Role == reconcilerv1.Role_ROLE_ACTIVE && s1.Role == reconcilerv1.Role_ROLE_STANDBY:
			active, standby = r0, r1
		case s1.Role == reconcilerv1.Role_ROLE_ACTIVE && s0.Role == reconcilerv1.Role_ROLE_STANDBY:
			active, standby = r1, r0
		default:
			return fmt.Errorf("roles %v and %v", s0.Role, s1.Role)
		}
		if s := map[*replica]*reconcilerv1.GetStatusResponse{r0: s0, r1: s1}[standby]; !strings.HasPrefix(s.LeaseHolder, active.name+"/") {
			return fmt.Errorf("standby says the holder is %q", s.LeaseHolder)
		}
		return nil
	})
	begun := time.Now()
	active.Kill()
	proctest.Eventually(t, time.Minute, func() error {
		s, err := standby.status(t, c)
		if err != nil {
			return err
		}
		if s.Role != reconcilerv1.Role_ROLE_ACTIVE {
			return fmt.Errorf("still %v", s.Role)
		}
		return nil
	})
	t.Logf("standby took over %v after kill -9", time.Since(begun).Round(time.Millisecond))
}

// TestAPIRefusesRevoked: the reconciler has no etcd access, yet refuses a
// certificate within 2s of its revocation: it follows the CRL from the
// curators.
func TestAPIRefusesRevoked(t *testing.T) {
	c := cut.New(t, 1)
	r := startReconciler(t, c, "reconciler-0")
	doomed := c.PKI.Issue(t, cut.Admin, time.Hour)
	proctest.Eventually(t, time.Minute, func() error {
		_, err := r.statusAs(t, doomed)
		return err
	})
	c.PKI.Revoke(t, c.Etcd(c.Voters[0].ClientURL), doomed.Leaf())
	revoked := time.Now()
	proctest.Eventually(t, 2*time.Second, func() error {
		if _, err := r.statusAs(t, doomed); err == nil {
			return errors.New("the revoked certificate still gets an answer")
		}
		return nil
	})
	t.Logf("the reconciler refuses a revoked certificate %v after the CRL was written", time.Since(revoked).Round(time.Millisecond))
	if _, err := r.status(t, c); err != nil {
		t.Fatalf("a certificate not revoked: %v", err)
	}
}
