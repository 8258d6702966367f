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
	r := startReconciler(b, c, "reconciler-0", "--tick", "1h")
	proctest.Eventually(b, time.Minute, func() error {
		st, err := r.status(b, c)
		if err != nil {
			return err
		}
		if st.LastResult != reconcilerv1.PassResult_PASS_RESULT_CONVERGED {
			return fmt.Errorf("not converged: %s: %s", st.LastResult, st.LastResultDetail)
		}
		return nil
	})
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

// untilGone polls etcd's member list every 5 ms until no member has peer
// URL peer, and returns when it saw that; a benchmark must not wait on
// Eventually's backoff.
func untilGone(b *testing.B, cli *clientv3.Client, peer string) time.Time {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := cli.MemberList(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if !slices.ContainsFunc(resp.Members, func(m *etcdserverpb.Member) bool { return slices.Contains(m.PeerURLs, peer) }) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			b.Fatalf("a member with peer URL %s still listed after 30s", peer)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
