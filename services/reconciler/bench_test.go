package reconciler_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/keys"
	"curia.dev/platform/proctest"
	"curia.dev/platform/records"
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

// BenchmarkDrift10: ten drifts at once, made outside curia in one etcd
// transaction: ten nodes given ConsensusMember in their records without
// being etcd members (what a registry restored from an older backup, or a
// hand edit, leaves), until the reconciler has taken every one away
// (membership is the truth), one fenced change per pass. ms/consistent is
// from the transaction to the last role gone, polled every 5 ms. None of
// these changes touches etcd's membership, so no reconfiguration hold
// stands in the way: this is curia's own time for ten passes and ten
// writes.
func BenchmarkDrift10(b *testing.B) {
	const drifts = 10
	c := cut.New(b, 1)
	ctx := context.Background()
	cli := c.Etcd(c.Voters[0].ClientURL)
	ids := cut.SeedNodes(b, cli, drifts)
	startReconciler(b, c, "reconciler-0", "--tick", "1h").untilConverged(b, c)
	var consistent time.Duration
	for b.Loop() {
		ops := make([]clientv3.Op, 0, drifts)
		for _, id := range ids {
			n := node(b, c, id)
			n.Roles = &curatorv1.Roles{ConsensusMember: &curatorv1.ConsensusMember{}}
			v, err := records.EncodeNode(n)
			if err != nil {
				b.Fatal(err)
			}
			ops = append(ops, clientv3.OpPut(keys.Node(id), string(v)))
		}
		begun := time.Now()
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
		deadline := begun.Add(time.Minute)
		for slices.ContainsFunc(ids, func(id string) bool { return node(b, c, id).GetRoles().GetConsensusMember() != nil }) {
			if time.Now().After(deadline) {
				b.Fatal("drift left after a minute")
			}
			time.Sleep(5 * time.Millisecond)
		}
		consistent += time.Since(begun)
	}
	b.ReportMetric(float64(consistent.Microseconds())/1000/float64(b.N), "ms/consistent")
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

// BenchmarkPass: the active replica's pass (observe: the member list, every
// node from the replica's own view once it is at least as new (view.go),
// the cluster configuration; then plan) over registries of 1,000, 5,000
// and 10,000 nodes, every pass finding nothing to do, through real
// consensus, curator and reconciler processes. The replica ticks every
// 100 ms and nothing else writes, so every pass is a tick. ms/pass is the
// replica's own measure (curia_reconciler_pass_observe_plan_seconds);
// etcd-ranges/pass is etcd's count of key-range reads over the passes
// (etcd_mvcc_range_total, everything etcd served in the while, divided by
// the passes). The metrics are polled every 20 ms.
func BenchmarkPass(b *testing.B) {
	for _, n := range []int{1_000, 5_000, 10_000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			c := cut.New(b, 1)
			cut.SeedNodes(b, c.Etcd(c.Voters[0].ClientURL), n)
			r := startReconciler(b, c, "reconciler-0", "--tick", "100ms")
			r.untilConverged(b, c)
			passes := func() (count, seconds float64) {
				return scrape(b, r.metrics, "curia_reconciler_pass_observe_plan_seconds_count"),
					scrape(b, r.metrics, "curia_reconciler_pass_observe_plan_seconds_sum")
			}
			ranges := func() float64 { return scrapeAt(b, c.Voters[0].Metrics, "/metrics/etcd", "etcd_mvcc_range_total") }
			if seen := scrape(b, r.metrics, "curia_reconciler_observed_nodes"); seen != float64(n+1) {
				b.Fatalf("a pass observed %v nodes, want %d", seen, n+1)
			}
			count0, sum0 := passes()
			ranges0 := ranges()
			last := count0
			for b.Loop() {
				deadline := time.Now().Add(time.Minute)
				for {
					if count, _ := passes(); count > last {
						last = count
						break
					}
					if time.Now().After(deadline) {
						b.Fatal("no pass within a minute")
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			count, sum := passes()
			b.ReportMetric((sum-sum0)/(count-count0)*1000, "ms/pass")
			b.ReportMetric((ranges()-ranges0)/(count-count0), "etcd-ranges/pass")
		})
	}
}

// scrape reads one metric without labels from http://addr/metrics.
func scrape(b *testing.B, addr, name string) float64 {
	b.Helper()
	return scrapeAt(b, addr, "/metrics", name)
}

// scrapeAt reads one metric without labels from http://addr<path>
// (consensus serves etcd's own on /metrics/etcd).
func scrapeAt(b *testing.B, addr, path, name string) float64 {
	b.Helper()
	code, body, err := proctest.Get("http://" + addr + path)
	if err != nil || code != 200 {
		b.Fatalf("%s of %s: %d, %v", path, addr, code, err)
	}
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				b.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	b.Fatalf("%s of %s has no %s", path, addr, name)
	return 0
}
