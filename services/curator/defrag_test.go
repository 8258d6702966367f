package curator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/failpoint"
	"curia.dev/platform/keys"
	"curia.dev/platform/proctest"
	"curia.dev/platform/records"
	ct "curia.dev/services/consensus/consensustest"
	cut "curia.dev/services/curator/curatortest"
)

// defragFlags: a check every second, and a floor of 2 MiB, which the
// tests' fill passes and a fresh database does not.
var defragFlags = []string{"--defrag-check-interval", "1s", "--defrag-min-wasted-bytes", fmt.Sprint(2 << 20)}

// TestDefragFollowersFirst: once compaction left most of every member's
// database free pages, the leader defragments every member, followers
// first, and moves etcd's leadership off the leader before its turn; the
// databases shrink, and the status and metrics say so.
func TestDefragFollowersFirst(t *testing.T) {
	c := cut.NewWithOptions(t, cut.Options{Voters: 3, Curators: 1, CuratorFlags: defragFlags})
	if err := defragOnce(t, c); err != nil {
		t.Fatal(err)
	}
}

// TestDefragOrderMutation: with the order switched off (members in id
// order, the leader's leadership not moved), TestDefragFollowersFirst's
// assertion fails.
func TestDefragOrderMutation(t *testing.T) {
	t.Setenv("CURIA_MUTATIONS", failpoint.NoDefragOrder)
	c := cut.NewWithOptions(t, cut.Options{Voters: 3, Curators: 1, CuratorFlags: defragFlags})
	err := defragOnce(t, c)
	if err == nil {
		t.Fatal("the defragmentation order was switched off, and its assertion still held")
	}
	t.Logf("as expected: %v", err)
}

// defragOnce fragments every member's database, waits for the leader's
// run and returns what is wrong with its order; it fails the test for
// everything else.
func defragOnce(t *testing.T, c *cut.Cluster) error {
	t.Helper()
	ctx := ctxT(t)
	cli := c.Etcd(voterURLs(c)...)
	// The leader looks only once every member shows its fragmentation,
	// for the test to see one run defragment all three.
	release := c.Leader().Hold("before-defrag-check")
	fill(ctx, t, cli)
	before := statuses(ctx, t, c)
	leader := before[c.Voters[0].ClientURL].Leader
	deleteAndCompact(ctx, t, cli)
	fragmented(ctx, t, c, cli, c.Voters)
	release()
	var run *curatorv1.EtcdMaintenanceStatus
	ct.Eventually(t, time.Minute, func() error {
		info, err := c.Management().GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
		if err != nil {
			return err
		}
		run = info.GetEtcdMaintenance()
		if run.GetLastRunTrigger() != "fragmented" || !run.GetLastRunOk() {
			return fmt.Errorf("no complete run yet: %v", run)
		}
		return nil
	})
	t.Logf("run: %s; steps %v", run.GetLastRunOutcome(), run.GetLastRunSteps())
	// Every member defragmented, and its database shrunk.
	after := statuses(ctx, t, c)
	var defragmented []string
	for _, s := range run.GetLastRunSteps() {
		if id, ok := strings.CutPrefix(s, "defragment "); ok {
			defragmented = append(defragmented, id)
		}
	}
	for url, st := range after {
		id := fmt.Sprintf("%x", st.Header.MemberId)
		if !slices.Contains(defragmented, id) {
			t.Fatalf("member %s was not defragmented (steps %v)", id, run.GetLastRunSteps())
		}
		if st.DbSize > before[url].DbSize/2 {
			t.Fatalf("member %s: %d bytes before, %d after its defragmentation", id, before[url].DbSize, st.DbSize)
		}
	}
	_, body, err := proctest.Get("http://" + c.Leader().Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if v := metricValue(t, body, "curia_curator_etcd_defrag_reclaimed_bytes_total"); v <= 0 {
		t.Fatalf("reclaimed bytes %v", v)
	}
	if n := strings.Count(body, "curia_curator_etcd_defrag_last_timestamp_seconds{member="); n != 3 {
		t.Fatalf("%d members with a last defragmentation time, want 3", n)
	}
	return followersFirst(run.GetLastRunSteps(), fmt.Sprintf("%x", leader))
}

// followersFirst checks a run's steps: every follower defragmented before
// etcd's leadership moves off leader, which is defragmented last.
func followersFirst(steps []string, leader string) error {
	if len(steps) != 4 {
		return fmt.Errorf("steps %v: want two followers, a leadership move, the leader", steps)
	}
	for _, s := range steps[:2] {
		if s == "defragment "+leader || !strings.HasPrefix(s, "defragment ") {
			return fmt.Errorf("steps %v: the etcd leader %s before the followers", steps, leader)
		}
	}
	if !strings.HasPrefix(steps[2], "move-leader "+leader+" ") || steps[3] != "defragment "+leader {
		return fmt.Errorf("steps %v: the etcd leader %s is not moved off and then defragmented last", steps, leader)
	}
	return nil
}

// TestDefragWaitsForHealth: while a membership change is pending, and
// then while a voter is down, the leader defragments nothing however
// fragmented the databases are; once the cluster is healthy again, it does.
func TestDefragWaitsForHealth(t *testing.T) {
	c := cut.NewWithOptions(t, cut.Options{Voters: 3, Curators: 1, CuratorFlags: defragFlags})
	ctx := ctxT(t)
	cur := c.Leader()
	// skips waits until the leader skipped its check twice more for why.
	skips := func(why string) {
		t.Helper()
		count := func() int {
			b, _ := os.ReadFile(cur.Log)
			return strings.Count(string(b), why)
		}
		seen := count()
		ct.Eventually(t, time.Minute, func() error {
			if n := count(); n < seen+2 {
				return fmt.Errorf("the leader skipped %d times for %q", n-seen, why)
			}
			return nil
		})
		info, err := c.Management().GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if run := info.GetEtcdMaintenance(); run.GetLastRunTrigger() != "" {
			t.Fatalf("a run while %s: %v", why, run)
		}
	}
	// A pending membership change: its record, as the consensus service
	// writes it, with a deadline that keeps the consensus processes from
	// resolving it (after twice the deadline) during the test.
	record, err := records.EncodePendingChange(&consensusv1.PendingChange{
		Id: "defrag-test", Operation: consensusv1.MembershipOperation_MEMBERSHIP_OPERATION_ADD, RecordedBy: "test",
		Started: timestamppb.Now(), Deadline: durationpb.New(10 * time.Minute),
	})
	if err != nil {
		t.Fatal(err)
	}
	cli := c.Etcd(voterURLs(c)...)
	if _, err := cli.Put(ctx, keys.MembershipPending, string(record)); err != nil {
		t.Fatal(err)
	}
	fill(ctx, t, cli)
	deleteAndCompact(ctx, t, cli)
	fragmented(ctx, t, c, cli, c.Voters)
	skips(`why="a membership change is pending"`)
	// A voter down, and the change done.
	down := c.Voters[2]
	down.Stop()
	if _, err := cli.Delete(ctx, keys.MembershipPending); err != nil {
		t.Fatal(err)
	}
	skips(`does not answer"`)
	down.Start()
	ct.Eventually(t, time.Minute, func() error {
		info, err := c.Management().GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
		if err != nil {
			return err
		}
		if run := info.GetEtcdMaintenance(); !run.GetLastRunOk() {
			return fmt.Errorf("no complete run yet: %v", run)
		}
		return nil
	})
}

// TestNoSpace: past a small quota etcd refuses writes with NOSPACE; the
// status and the metrics show the alarm. Once the data is deleted, the
// leader compacts, defragments every member (the etcd leader last, its
// leadership moved), disarms (audited), and writes go through again.
func TestNoSpace(t *testing.T) {
	c := cut.NewWithOptions(t, cut.Options{
		Voters: 3, Curators: 1, CuratorFlags: []string{"--defrag-check-interval", "0"},
		ConsensusFlags: []string{"--etcd-quota-backend-bytes", fmt.Sprint(4 << 20)},
	})
	ctx := ctxT(t)
	cli := c.Etcd(voterURLs(c)...)
	// The leader sees the alarm, and waits while the test looks: with
	// the fill's free pages, compaction and defragmentation alone might
	// bring the databases under the quota at once.
	release := c.Leader().Hold("before-nospace-recovery")
	value := strings.Repeat("x", 256<<10)
	var err error
	for i := 0; i < 64 && err == nil; i++ {
		_, err = cli.Put(ctx, fmt.Sprintf("/test/fill/%03d", i), value)
	}
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("filling a 4 MiB quota: %v, want NOSPACE", err)
	}
	c.Leader().Reached("before-nospace-recovery")
	info, err := c.Management().GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m := info.GetEtcdMaintenance(); !slices.ContainsFunc(m.GetAlarms(), func(a string) bool { return strings.HasPrefix(a, "NOSPACE") }) {
		t.Fatalf("alarms %v, want NOSPACE", m.GetAlarms())
	}
	_, body, err := proctest.Get("http://" + c.Leader().Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, `curia_curator_etcd_alarms{alarm="NOSPACE"} `) || strings.Contains(body, `curia_curator_etcd_alarms{alarm="NOSPACE"} 0`) {
		t.Fatal("no NOSPACE alarm in /metrics")
	}
	if _, err := cli.Put(ctx, "/test/still", "refused"); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("a write under NOSPACE: %v", err)
	}
	// Deleting is allowed under NOSPACE; the leader does the rest.
	if _, err := cli.Delete(ctx, "/test/fill/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	release()
	ct.Eventually(t, time.Minute, func() error {
		_, err := cli.Put(ctx, "/test/again", "accepted")
		return err
	})
	ct.Eventually(t, 30*time.Second, func() error {
		info, err := c.Management().GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
		if err != nil {
			return err
		}
		m := info.GetEtcdMaintenance()
		if !m.GetLastRunOk() || m.GetLastRunTrigger() != "NOSPACE" || len(m.GetAlarms()) != 0 || !strings.Contains(m.GetLastRunOutcome(), "compacted to revision") {
			return fmt.Errorf("after the recovery: %v", m)
		}
		// The same order as a scheduled run: the etcd leader, whichever
		// it was, moved off and defragmented last.
		steps := m.GetLastRunSteps()
		if len(steps) != 4 || len(strings.Fields(steps[2])) != 3 {
			return fmt.Errorf("steps %v", steps)
		}
		return followersFirst(steps, strings.Fields(steps[2])[1])
	})
	ct.Eventually(t, 30*time.Second, func() error {
		for _, e := range cut.AuditLog(t, c.Management()) {
			if e.Action == auditv1.AuditAction_AUDIT_ACTION_ETCD_NOSPACE_RECOVERED {
				return nil
			}
		}
		return errors.New("no NOSPACE recovery in the audit log")
	})
}

func voterURLs(c *cut.Cluster) []string {
	var out []string
	for _, v := range c.Voters {
		out = append(out, v.ClientURL)
	}
	return out
}

// fill writes 8 MiB, and deleteAndCompact deletes it and compacts: every
// member's database is then mostly free pages.
func fill(ctx context.Context, t *testing.T, cli *clientv3.Client) {
	t.Helper()
	value := strings.Repeat("x", 128<<10)
	for i := range 64 {
		if _, err := cli.Put(ctx, fmt.Sprintf("/test/fill/%03d", i), value); err != nil {
			t.Fatal(err)
		}
	}
}

func deleteAndCompact(ctx context.Context, t *testing.T, cli *clientv3.Client) {
	t.Helper()
	resp, err := cli.Delete(ctx, "/test/fill/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
}

// fragmented waits until the voters show most of their databases free:
// etcd recomputes the size in use when a member commits, so the test
// writes until it did.
func fragmented(ctx context.Context, t *testing.T, c *cut.Cluster, cli *clientv3.Client, voters []*ct.Node) {
	t.Helper()
	ct.Eventually(t, time.Minute, func() error {
		if _, err := cli.Put(ctx, "/test/commit", "x"); err != nil {
			return err
		}
		for _, v := range voters {
			st, err := cli.Status(ctx, v.ClientURL)
			if err != nil {
				return err
			}
			if st.DbSizeInUse > st.DbSize/2 || st.DbSize-st.DbSizeInUse < 2<<20 {
				return fmt.Errorf("member %x: %d of %d bytes in use", st.Header.MemberId, st.DbSizeInUse, st.DbSize)
			}
		}
		return nil
	})
}

// statuses is every voter's etcd status, by client URL.
func statuses(ctx context.Context, t *testing.T, c *cut.Cluster) map[string]*clientv3.StatusResponse {
	t.Helper()
	cli := c.Etcd(voterURLs(c)...)
	out := map[string]*clientv3.StatusResponse{}
	for _, url := range voterURLs(c) {
		st, err := cli.Status(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		out[url] = st
	}
	return out
}
