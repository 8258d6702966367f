package curator_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	fencev1 "curia.dev/gen/curia/fence/v1"
	storagev1 "curia.dev/gen/curia/storage/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/proctest"
	ct "curia.dev/services/consensus/consensustest"
	cut "curia.dev/services/curator/curatortest"
)

// mgmtRegister registers a (NEW) node with labels, as its agent would.
func mgmtRegister(t *testing.T, c *cut.Cluster, labels map[string]string) *cut.Agent {
	t.Helper()
	ctx := ctxT(t)
	a := c.NewAgent()
	ticket, err := c.Management().GetRegisterTicket(ctx, &curatorv1.GetRegisterTicketRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Enrolling(c.Running()).RegisterNode(ctx, &curatorv1.RegisterNodeRequest{
		RegisterTicket: ticket.Ticket, PublicKey: a.Key.Public().(ed25519.PublicKey), Labels: labels,
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// mgmtFilterErr runs GetNodes with a filter that should fail.
func mgmtFilterErr(m curatorv1.ManagementClient, filter string) error {
	stream, err := m.GetNodes(context.Background(), &curatorv1.GetNodesRequest{Filter: filter})
	if err != nil {
		return err
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("filter %q was accepted", filter)
			}
			return err
		}
	}
}

// TestGetNodesFilter: CEL filters over nodes, health included; broken and
// expensive filters are InvalidArgument with CEL's word on what is wrong.
func TestGetNodesFilter(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	m := c.Management()
	boot := c.Voters[0].ID // UP, ConsensusMember + KubernetesController, no labels
	up := c.NewAgent()     // UP, no roles, HEALTHY
	up.Enrol(ctx)
	if _, err := hbOnce(ctx, up.Curator(c.Running())); err != nil { // healthy for the default 20s
		t.Fatal(err)
	}
	zoneA := mgmtRegister(t, c, map[string]string{"zone": "a"}) // NEW
	zoneB := mgmtRegister(t, c, map[string]string{"zone": "b"}) // STANDBY
	if _, err := m.ApproveNode(ctx, &curatorv1.ApproveNodeRequest{NodeId: zoneB.ID}); err != nil {
		t.Fatal(err)
	}
	all := []string{boot, up.ID, zoneA.ID, zoneB.ID}

	for filter, want := range map[string][]string{
		``:                                      all,
		`node.state == NodeState.NODE_STATE_UP`: {boot, up.ID},
		`node.state == NODE_STATE_UP`:           {boot, up.ID}, // the API doc's spelling
		`node.state == curia.curator.v1.NodeState.NODE_STATE_STANDBY`:                {zoneB.ID},
		`has(node.roles.consensus_member)`:                                           {boot},
		`node.state == NodeState.NODE_STATE_UP && !has(node.roles.consensus_member)`: {up.ID},
		`node.health == NodeHealth.NODE_HEALTH_HEALTHY`:                              {up.ID},
		`node.health == NodeHealth.NODE_HEALTH_UNKNOWN`:                              {boot, zoneA.ID, zoneB.ID},
		`node.last_heartbeat > now - duration("1h")`:                                 {up.ID},
		`node.labels["zone"] == "a"`:                                                 {zoneA.ID},
		`"zone" in node.labels`:                                                      {zoneA.ID, zoneB.ID},
		`node.id.startsWith("node-")`:                                                all,
		`node.id == "` + up.ID + `"`:                                                 {up.ID},
		`false`:                                                                      nil,
	} {
		t.Run(filter, func(t *testing.T) {
			got := slices.Sorted(maps.Keys(getNodes(t, m, filter)))
			want = slices.Sorted(slices.Values(want))
			if !slices.Equal(got, want) {
				t.Fatalf("filter %q: got %v, want %v", filter, got, want)
			}
		})
	}

	for filter, msg := range map[string]string{
		`node.id`:                       "must be a boolean expression, but it is of type string",
		`node.roles`:                    "must be a boolean expression",
		`node.foo == 1`:                 "undefined field 'foo'",
		`node.state ==`:                 "Syntax error",
		`nodes.state == 1`:              "undeclared reference to 'nodes'",
		`node.state == NodeState.BOGUS`: "undeclared reference",
		`size(node.id) / (size(node.id) - size(node.id)) == 1`: "filter on node node-",
		// 10^5 iterations: stopped by the cost limit.
		`[0,1,2,3,4,5,6,7,8,9].all(a, [0,1,2,3,4,5,6,7,8,9].all(b, [0,1,2,3,4,5,6,7,8,9].all(c, [0,1,2,3,4,5,6,7,8,9].all(d, [0,1,2,3,4,5,6,7,8,9].all(e, a+b+c+d+e >= 0)))))`: "cost limit",
		strings.Repeat("true && ", 600) + "true": "at most 4096",
	} {
		t.Run("bad/"+filter[:min(len(filter), 30)], func(t *testing.T) {
			wantCode(t, mgmtFilterErr(m, filter), codes.InvalidArgument, msg)
		})
	}
}

// TestConsensusStatusPassesOverAHungConsensus: the first consensus service
// a curator knows accepts connections and never answers (a frozen VM: the
// kernel still accepts). Reads of the member list pass over it in time and
// GetConsensusStatus answers before its caller's deadline. While each
// service was asked with the caller's whole deadline, the first one took
// all of it (the e2e test of a frozen voter found GetConsensusStatus
// failing the whole time).
func TestConsensusStatusPassesOverAHungConsensus(t *testing.T) {
	c := cut.New(t, 1)
	// The only curator: one whose first consensus address hangs.
	c.ConsensusFirst = []string{proctest.BlackHole(t)}
	hung := c.AddCurator()
	c.Curators[0].Stop()
	proctest.Eventually(t, time.Minute, func() error {
		if c.Leader() != hung {
			return errors.New("the new curator does not lead yet")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Management().GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		t.Fatalf("GetConsensusStatus with a hung consensus service first: %v", err)
	}
	if st.Voters != 1 || st.HealthyVoters != 1 {
		t.Fatalf("voters %d, healthy %d, want 1 and 1", st.Voters, st.HealthyVoters)
	}
}

// TestGetConsensusStatus: members mapped to nodes, from the bootstrapped
// cluster to members and roles that disagree.
func TestGetConsensusStatus(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	m := c.Management()
	voter := c.Voters[0]

	st, err := m.GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 1 {
		t.Fatalf("members: %v", st.Members)
	}
	mem := st.Members[0]
	if mem.NodeId != voter.ID || !mem.NodeExists || !mem.HasRole || mem.Learner || !mem.Started || !mem.Leader ||
		mem.RaftIndex == 0 || mem.Lag != 0 || !slices.Equal(mem.PeerUrls, []string{voter.PeerURL}) || mem.MemberId != voter.Status().MemberId {
		t.Fatalf("bootstrap member: %v", mem)
	}
	if len(st.RoleWithoutMember) != 0 {
		t.Fatalf("role_without_member: %v", st.RoleWithoutMember)
	}
	if !mem.Healthy || st.Voters != 1 || st.HealthyVoters != 1 || st.Quorum != 1 || st.FailureTolerance != 0 {
		t.Fatalf("one healthy voter: member healthy %v, voters %d, healthy %d, quorum %d, failure tolerance %d, want true, 1, 1, 1, 0",
			mem.Healthy, st.Voters, st.HealthyVoters, st.Quorum, st.FailureTolerance)
	}
	epoch := st.MembershipEpoch
	if want := voter.Members().MembershipEpoch; epoch != want {
		t.Fatalf("membership epoch %d, want %d", epoch, want)
	}

	// Make roles and membership disagree, with the curator leader's fence:
	// a node with ConsensusMember whose member is removed behind its back,
	// and a learner added for a node that does not exist.
	fence := mgmtLeaderFence(t, c)
	a := c.NewAgent()
	a.Enrol(ctx)
	peerURL := "https://" + proctest.FreeAddr(t)
	if _, err := a.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: &curatorv1.NodeStatus{ConsensusPeerUrl: peerURL, ConsensusPublicKey: cut.ConsensusKey(t)}}); err != nil {
		t.Fatal(err)
	}
	mgmtRetryUnavailable(t, func() error {
		_, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(true)})
		return err
	})
	mgmtRetryUnavailable(t, func() error {
		_, err := voter.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_NodeId{NodeId: a.ID}, Fence: withEpoch(fence, voter.Members().MembershipEpoch)})
		return err
	})
	_, ghost := newKey(t)
	ghostURL := "https://" + proctest.FreeAddr(t)
	mgmtRetryUnavailable(t, func() error {
		_, err := voter.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: ghost, PeerUrl: ghostURL, Fence: withEpoch(fence, voter.Members().MembershipEpoch)})
		return err
	})

	st, err = m.GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.RoleWithoutMember, []string{a.ID}) {
		t.Fatalf("role_without_member %v, want [%s]", st.RoleWithoutMember, a.ID)
	}
	byNode := map[string]*curatorv1.ConsensusMemberStatus{}
	for _, mem := range st.Members {
		byNode[mem.NodeId] = mem
	}
	if len(st.Members) != 2 || byNode[voter.ID].GetHasRole() != true || !byNode[voter.ID].GetLeader() {
		t.Fatalf("members: %v", st.Members)
	}
	g := byNode[ghost]
	if g == nil || g.NodeExists || g.HasRole || !g.Learner || g.Started || g.Leader || g.RaftIndex != 0 || !slices.Equal(g.PeerUrls, []string{ghostURL}) {
		t.Fatalf("learner of a node that does not exist: %v", g)
	}
	// The learner that never started is neither healthy nor a voter.
	if g.Healthy || st.Voters != 1 || st.HealthyVoters != 1 || st.FailureTolerance != 0 {
		t.Fatalf("with an unstarted learner: learner healthy %v, voters %d, healthy %d, failure tolerance %d", g.Healthy, st.Voters, st.HealthyVoters, st.FailureTolerance)
	}
	if want := voter.Members().MembershipEpoch; st.MembershipEpoch != want || st.MembershipEpoch <= epoch {
		t.Fatalf("membership epoch %d, want %d (and past %d, before the changes)", st.MembershipEpoch, want, epoch)
	}
	if st.Pending != nil {
		t.Fatalf("pending change %v, want none", st.Pending)
	}

	// A membership change in flight is shown as it is recorded (one left
	// by a process that died, with a deadline that keeps it there).
	rec, err := proto.Marshal(&storagev1.PendingChangeRecord{Id: "change-1", Operation: consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_ADD,
		NodeId: ghost, Actor: "reconciler", Fence: []string{"leases/reconciler@7"}, Started: timestamppb.Now(), Deadline: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	cli := c.Etcd(voter.ClientURL)
	if _, err := cli.Put(ctx, keys.MembershipPending, string(rec)); err != nil {
		t.Fatal(err)
	}
	st, err = m.GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if p := st.Pending; p.GetId() != "change-1" || p.GetNodeId() != ghost || p.GetOperation() != consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_ADD || !slices.Equal(p.GetFence(), []string{"leases/reconciler@7"}) || p.GetStarted() == nil {
		t.Fatalf("pending change %v, want change-1 adding %s", p, ghost)
	}
	if _, err := cli.Delete(ctx, keys.MembershipPending); err != nil {
		t.Fatal(err)
	}
}

// TestUpdateRolesPlansAgainAfterAnotherChange: UpdateNodeRoles reads the
// member list, and another membership change (the reconciler's) lands
// before its fenced AddNode. etcd is not touched by the stale attempt; the
// curator reads again and adds the node, instead of handing the operator a
// stale fence it never held (the e2e's README commands met this while
// autopilot had just finished a change).
func TestUpdateRolesPlansAgainAfterAnotherChange(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	voter := c.Voters[0]
	a, n := c.NewConsensusAgent()
	a.Enrol(ctx)
	if _, err := a.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: cut.VoterStatus(n)}); err != nil {
		t.Fatal(err)
	}
	fence := mgmtLeaderFence(t, c)
	leader := c.Leader()
	release := leader.Hold("before-membership-call")
	done := make(chan error, 1)
	go func() {
		_, err := c.Management().UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: new(true), Reason: "test"})
		done <- err
	}()
	leader.Reached("before-membership-call")
	// Another change meanwhile: a learner added and removed again, which
	// moves the epoch twice and leaves membership as it was.
	_, ghost := newKey(t)
	var added *consensusv1.AddNodeResponse
	mgmtRetryUnavailable(t, func() (err error) {
		added, err = voter.Curator().AddNode(ctx, &consensusv1.AddNodeRequest{NodeId: ghost, PeerUrl: "https://" + proctest.FreeAddr(t), Fence: withEpoch(fence, voter.Members().MembershipEpoch)})
		return err
	})
	mgmtRetryUnavailable(t, func() error {
		_, err := voter.Curator().RemoveMember(ctx, &consensusv1.RemoveMemberRequest{Target: &consensusv1.RemoveMemberRequest_MemberId{MemberId: added.Join.MemberId}, Fence: withEpoch(fence, voter.Members().MembershipEpoch)})
		return err
	})
	release()
	if err := <-done; err != nil {
		t.Fatalf("UpdateNodeRoles after another change landed between its read and its call: %v", err)
	}
	join := getNodes(t, c.Management(), "")[a.ID].GetRoles().GetConsensusMember().GetJoin()
	found := false
	for _, m := range voter.Members().Members {
		found = found || (m.NodeId == a.ID && m.Id == join.GetMemberId())
	}
	if !found {
		t.Fatalf("the role names member %x, which is not %s's member in etcd: %v", join.GetMemberId(), a.ID, voter.Members().Members)
	}
}

// mgmtLeaderFence is the curator leader's fence: its election key at its
// term, read from etcd.
func mgmtLeaderFence(t *testing.T, c *cut.Cluster) *fencev1.Fence {
	t.Helper()
	ctx := ctxT(t)
	leader := c.Leader()
	resp, err := curatorv1.NewCuratorClient(c.Conn(leader, cut.Admin)).GetCurrentLeader(ctx, &curatorv1.GetCurrentLeaderRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cur, err := resp.Recv()
	if err != nil {
		t.Fatal(err)
	}
	kvs, err := c.Etcd(c.Voters[0].ClientURL).Get(ctx, keys.LeaderElection, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kvs.Kvs {
		if kv.CreateRevision == cur.Term {
			return &fencev1.Fence{Conditions: []*fencev1.FenceCondition{{Key: string(kv.Key), CreateRevision: cur.Term}}}
		}
	}
	t.Fatalf("no election key at term %d", cur.Term)
	return nil
}

// withEpoch is f planned at epoch.
func withEpoch(f *fencev1.Fence, epoch int64) *fencev1.Fence {
	f = proto.Clone(f).(*fencev1.Fence)
	f.MembershipEpoch = epoch
	return f
}

// mgmtRetryUnavailable retries f while what refuses it passes by itself
// (etcd's reconfiguration window, a change in flight); other errors fail.
func mgmtRetryUnavailable(t *testing.T, f func() error) {
	t.Helper()
	if err := ct.RetryUnavailable(t, f); err != nil {
		t.Fatal(err)
	}
}

// TestWatchAuditLog: the backlog (bootstrap first), then new events as
// they are committed, with who did it and under which fence.
func TestWatchAuditLog(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	m := c.Management()
	a := c.NewAgent()
	a.Enrol(ctx)
	fence := mgmtLeaderFence(t, c)

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stream, err := m.WatchAuditLog(wctx, &curatorv1.WatchAuditLogRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var lastRev int64
	next := func() *curatorv1.WatchAuditLogResponse {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Revision <= lastRev {
			t.Fatalf("event at revision %d after %d", resp.Revision, lastRev)
		}
		lastRev = resp.Revision
		return resp
	}
	// The backlog: the bootstrap first, a's commit last.
	var backlog []*auditv1.Event
	for {
		ev := next().Event
		backlog = append(backlog, ev)
		if ev.Action == auditv1.AuditAction_AUDIT_ACTION_NODE_COMMIT && ev.NodeId == a.ID {
			break
		}
	}
	boot := slices.IndexFunc(backlog, func(ev *auditv1.Event) bool { return ev.Action == auditv1.AuditAction_AUDIT_ACTION_CLUSTER_BOOTSTRAP })
	if boot < 0 || backlog[boot].NodeId != c.Voters[0].ID {
		t.Fatalf("no bootstrap event in the backlog: %v", backlog)
	}

	// Followed: a role change made now.
	if _, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, KubernetesWorker: new(true), Reason: "run workloads"}); err != nil {
		t.Fatal(err)
	}
	resp := next()
	ev := resp.Event
	wantFence := []string{fmt.Sprintf("%s@%d", fence.Conditions[0].Key, fence.Conditions[0].CreateRevision)}
	if ev.Action != auditv1.AuditAction_AUDIT_ACTION_ROLES_UPDATE || !proto.Equal(ev.Roles, &auditv1.Roles{KubernetesWorker: true}) || ev.NodeId != a.ID ||
		ev.Actor != "admin/test" || !slices.Equal(ev.Fence, wantFence) || ev.Reason != "run workloads" ||
		ev.RecordedBy != "curator/"+c.Leader().Name || ev.Time == nil {
		t.Fatalf("role change event: %v, want actor admin/test, fence %v", ev, wantFence)
	}

	// no_follow: the newest events, newest last, then the end.
	nf, err := m.WatchAuditLog(ctx, &curatorv1.WatchAuditLogRequest{Backlog: 2, NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []*curatorv1.WatchAuditLogResponse
	for {
		r, err := nf.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if len(got) != 2 || got[1].Revision != resp.Revision || got[0].Revision >= got[1].Revision || got[0].Event.Action != auditv1.AuditAction_AUDIT_ACTION_NODE_COMMIT {
		t.Fatalf("backlog 2, no_follow: %v", got)
	}

	bad, err := m.WatchAuditLog(ctx, &curatorv1.WatchAuditLogRequest{Backlog: -1})
	if err == nil {
		_, err = bad.Recv()
	}
	wantCode(t, err, codes.InvalidArgument, "backlog")

	// A stream that broke resumes after the last revision it received:
	// exactly what came after, no backlog, then new events.
	cancel()
	if _, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, KubernetesWorker: new(false), Reason: "missed while away"}); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	resumed, err := m.WatchAuditLog(rctx, &curatorv1.WatchAuditLogRequest{StartRevision: resp.Revision})
	if err != nil {
		t.Fatal(err)
	}
	missed, err := resumed.Recv()
	if err != nil || missed.Revision <= resp.Revision || missed.Event.Reason != "missed while away" {
		t.Fatalf("resumed after revision %d: first event %v (%v), want the one missed", resp.Revision, missed, err)
	}
	if _, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, KubernetesWorker: new(true), Reason: "after resuming"}); err != nil {
		t.Fatal(err)
	}
	if later, err := resumed.Recv(); err != nil || later.Event.Reason != "after resuming" {
		t.Fatalf("resumed stream, next event %v (%v), want the new one", later, err)
	}
	both, err := m.WatchAuditLog(ctx, &curatorv1.WatchAuditLogRequest{StartRevision: resp.Revision, Backlog: 5})
	if err == nil {
		_, err = both.Recv()
	}
	wantCode(t, err, codes.InvalidArgument, "start_revision")
}

// TestAuditRetention: the leader keeps at most --audit-max-events events
// (the newest) and none older than --audit-max-age.
func TestAuditRetention(t *testing.T) {
	c := cut.New(t, 1, "--audit-max-events", "4", "--audit-max-age", "1h", "--audit-prune-interval", "100ms")
	ctx := ctxT(t)
	m := c.Management()
	etcd := c.Etcd(c.Voters[0].ClientURL)
	// An event from two hours ago, as an older curator would have left it.
	old := keys.Audit(time.Now().Add(-2*time.Hour), "curator-old")
	if _, err := etcd.Put(ctx, old, ""); err != nil {
		t.Fatal(err)
	}
	a := c.NewAgent()
	a.Enrol(ctx)
	for i := range 6 {
		if _, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, KubernetesWorker: new(i%2 == 0), Reason: fmt.Sprintf("change %d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	proctest.Eventually(t, 30*time.Second, func() error {
		resp, err := etcd.Get(ctx, keys.AuditPrefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 4 {
			return fmt.Errorf("%d audit events, want 4", len(resp.Kvs))
		}
		for _, kv := range resp.Kvs {
			if string(kv.Key) == old {
				return errors.New("the two-hour-old event is still there")
			}
		}
		return nil
	})
	// The newest stay: the last change is the last event kept.
	nf, err := m.WatchAuditLog(ctx, &curatorv1.WatchAuditLogRequest{Backlog: 1, NoFollow: true})
	if err != nil {
		t.Fatal(err)
	}
	if last, err := nf.Recv(); err != nil || last.Event.Reason != "change 5" {
		t.Fatalf("newest event kept: %v (%v), want change 5", last, err)
	}
}

// TestCorruptRecord: a node record that does not decode is listed as
// unreadable, saying why (never left out, and the other nodes still list);
// a write to it is DataLoss, naming what to do: never Internal.
func TestCorruptRecord(t *testing.T) {
	c := cut.New(t, 1)
	ctx := ctxT(t)
	m := c.Management()
	a := mgmtRegister(t, c, nil)
	if _, err := c.Etcd(c.Voters[0].ClientURL).Put(ctx, keys.Node(a.ID), "\xff\xfe not a node record"); err != nil {
		t.Fatal(err)
	}
	// At once: a listing is at least as new as the write before it.
	if n := getNodes(t, m, `node.id == "`+a.ID+`"`)[a.ID]; !strings.Contains(n.GetUnreadable(), "does not decode") {
		t.Fatalf("listed %v, want node %s unreadable", n, a.ID)
	}
	_, err := m.UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, KubernetesWorker: new(true), Reason: "test"})
	wantCode(t, err, codes.DataLoss, "DeleteNode")
}

// TestGetNodesOnAFollower: a follower answers GetNodes from its own watch
// hub, at least as new as etcd when the call came (a node registered just
// before is listed), without the leader: it answers while the leader is
// frozen.
func TestGetNodesOnAFollower(t *testing.T) {
	c := cut.New(t, 2)
	leader := c.Leader()
	follower := c.Curators[0]
	if follower == leader {
		follower = c.Curators[1]
	}
	m := curatorv1.NewManagementClient(c.Conn(follower, cut.Admin))
	a := mgmtRegister(t, c, nil)
	if _, ok := getNodes(t, m, "")[a.ID]; !ok {
		t.Fatalf("node %s registered, but the follower does not list it", a.ID)
	}
	leader.Pause()
	defer leader.Resume()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	stream, err := m.GetNodes(ctx, &curatorv1.GetNodesRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if err != nil {
		t.Fatalf("GetNodes on the follower while the leader is frozen: %v", err)
	}
}
