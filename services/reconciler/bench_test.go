package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/proctest"
	cut "curia.dev/services/curator/curatortest"
)

// BenchmarkDrift: one drift made outside curia, a learner added to etcd
// for no node (etcdctl member add --learner), until the reconciler has
// removed it, through real consensus, curator and reconciler processes.
// ms/noticed is until the reconciler's fenced intent to remove it is in
// the audit log (a pass saw the learner, planned, and its fence was
// checked); ms/consistent until etcd no longer lists it. The replica's
// tick is an hour, so only triggers count; etcd removes a learner without
// its reconfiguration hold, so this is curia's own time.
func BenchmarkDrift(b *testing.B) {
	c := cut.New(b, 1)
	ctx := context.Background()
	startReconciler(b, c, "reconciler-0", "--tick", "1h").untilConverged(b, c)
	cli := c.Etcd(c.Voters[0].ClientURL)
	var noticed, consistent time.Duration
	i := 0
	for b.Loop() {
		i++
		peer := fmt.Sprintf("https://127.0.0.9:%d", 10000+i)
		begun := time.Now()
		// The add can answer "member not found": the reconciler removed
		// the learner before etcd answered the call that added it.
		if _, err := cli.MemberAddAsLearner(ctx, []string{peer}); err != nil && !errors.Is(err, rpctypes.ErrMemberNotFound) {
			b.Fatal(err)
		}
		consistent += untilGone(b, cli, peer).Sub(begun)
		// The intent, not its outcome: the first removal audited since.
		events := cut.AuditLog(b, c.Management())
		at := slices.IndexFunc(events, func(ev *auditv1.Event) bool {
			return ev.Action == auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE && !ev.Time.AsTime().Before(begun)
		})
		if at < 0 {
			b.Fatalf("no member removal audited after %v", begun)
		}
		noticed += events[at].Time.AsTime().Sub(begun)
	}
	perOp := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(perOp(noticed), "ms/noticed")
	b.ReportMetric(perOp(consistent), "ms/consistent")
}

// BenchmarkLearnerToVoter: a node is given ConsensusMember through the
// curator (UpdateNodeRoles: a learner, then the role), its agent starts the
// learner (the benchmark plays the agent), and the reconciler promotes it
// under the cluster's default stabilization (the replica's own override
// is off). time/op is from the learner's Start until etcd lists it as a
// voter. Between rounds the role is taken away and the node's data wiped,
// outside the timer.
func BenchmarkLearnerToVoter(b *testing.B) {
	c := cut.New(b, 1)
	ctx := context.Background()
	startReconciler(b, c, "reconciler-0", "--stabilization", "0s")
	a, n := c.NewConsensusAgent()
	a.Enrol(ctx)
	if _, err := a.Curator(c.Running()).UpdateNodeStatus(ctx, &curatorv1.UpdateNodeStatusRequest{NodeId: a.ID, Status: cut.VoterStatus(n)}); err != nil {
		b.Fatal(err)
	}
	cli := c.Etcd(c.Voters[0].ClientURL)
	setRole := func(on bool) {
		// etcd refuses a change for a few seconds after the last one
		// (Unavailable), and so does curia while one is in flight
		// (Aborted).
		proctest.Eventually(b, time.Minute, func() error {
			_, err := c.Management().UpdateNodeRoles(ctx, &curatorv1.UpdateNodeRolesRequest{NodeId: a.ID, ConsensusMember: &on, Reason: "benchmark"})
			return err
		})
	}
	for b.Loop() {
		b.StopTimer()
		setRole(true)
		role := node(b, c, a.ID).GetRoles().GetConsensusMember()
		// The member certificate comes with the role (the last one was
		// revoked with it), as the agent installs it.
		if _, err := n.Self().SetCredentials(ctx, &consensusv1.SetCredentialsRequest{MemberCertificate: role.GetMemberCertificate()}); err != nil {
			b.Fatal(err)
		}
		join := role.GetJoin()
		b.StartTimer()
		if _, err := n.Self().Start(ctx, &consensusv1.StartRequest{Mode: &consensusv1.StartRequest_Join{Join: join}}); err != nil {
			b.Fatal(err)
		}
		until(b, cli, func(ms []*etcdserverpb.Member) bool {
			return slices.ContainsFunc(ms, func(m *etcdserverpb.Member) bool { return m.Name == a.ID && !m.IsLearner })
		})
		b.StopTimer()
		setRole(false)
		proctest.Eventually(b, time.Minute, func() error {
			_, err := n.Self().Leave(ctx, &consensusv1.LeaveRequest{})
			return err
		})
		b.StartTimer()
	}
}

// BenchmarkTakeover: two replicas with a 3 s lease; the active one is
// frozen (SIGSTOP, a stalled VM), and ms/takeover is until the standby
// reports itself active, ms/over-ttl that less the lease TTL (the lease
// was last kept alive up to a third of the TTL before the freeze, so a
// takeover that waits on nothing else comes in under the TTL). The frozen
// replica is thawed between rounds, outside the timer, and stands by.
func BenchmarkTakeover(b *testing.B) {
	const ttl = 3 * time.Second
	c := cut.New(b, 1)
	rs := []*replica{
		startReconciler(b, c, "reconciler-0", "--lease-ttl", ttl.String()),
		startReconciler(b, c, "reconciler-1", "--lease-ttl", ttl.String()),
	}
	// roles polls both replicas every 10 ms until one is active and the
	// other not, and returns them.
	roles := func() (active, other *replica) {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			s0, err0 := rs[0].status(b, c)
			s1, err1 := rs[1].status(b, c)
			switch {
			case err0 == nil && s0.Role == reconcilerv1.Role_ROLE_ACTIVE && (err1 != nil || s1.Role != reconcilerv1.Role_ROLE_ACTIVE):
				return rs[0], rs[1]
			case err1 == nil && s1.Role == reconcilerv1.Role_ROLE_ACTIVE && (err0 != nil || s0.Role != reconcilerv1.Role_ROLE_ACTIVE):
				return rs[1], rs[0]
			}
			time.Sleep(10 * time.Millisecond)
		}
		b.Fatal("no one replica active within a minute")
		return nil, nil
	}
	var took time.Duration
	for b.Loop() {
		b.StopTimer()
		active, standby := roles()
		b.StartTimer()
		begun := time.Now()
		active.Pause()
		for {
			if st, err := standby.status(b, c); err == nil && st.Role == reconcilerv1.Role_ROLE_ACTIVE {
				break
			}
			if time.Since(begun) > time.Minute {
				b.Fatal("the standby did not take over within a minute")
			}
			time.Sleep(10 * time.Millisecond)
		}
		took += time.Since(begun)
		b.StopTimer()
		active.Resume()
		b.StartTimer()
	}
	ms := float64(took.Microseconds()) / 1000 / float64(b.N)
	b.ReportMetric(ms, "ms/takeover")
	b.ReportMetric(ms-float64(ttl.Milliseconds()), "ms/over-ttl")
}

// untilGone returns when no member has peer URL peer.
func untilGone(b *testing.B, cli *clientv3.Client, peer string) time.Time {
	return until(b, cli, func(ms []*etcdserverpb.Member) bool {
		return !slices.ContainsFunc(ms, func(m *etcdserverpb.Member) bool { return slices.Contains(m.PeerURLs, peer) })
	})
}

// until polls etcd's member list every 5 ms until done says yes, and
// returns when it did; a benchmark must not wait on Eventually's backoff.
func until(b *testing.B, cli *clientv3.Client, done func([]*etcdserverpb.Member) bool) time.Time {
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := cli.MemberList(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if done(resp.Members) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			b.Fatalf("etcd's members after a minute: %v", resp.Members)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
