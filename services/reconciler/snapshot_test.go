package reconciler_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/proctest"
	cut "curia.dev/services/curator/curatortest"
)

// TestSnapshotBeforeMembershipChange: before the reconciler removes a
// member (one added outside curia), the curators take an etcd snapshot for
// it: the snapshot still holds the member, and its TakeSnapshot is in the
// audit log before the removal's intent. When the snapshot hangs, the
// removal goes on after the reconciler's bound, and the failure is
// counted.
func TestSnapshotBeforeMembershipChange(t *testing.T) {
	dir := t.TempDir()
	// No schedule, and no reuse: each change asks for a snapshot of its own.
	c := cut.New(t, 1, "--snapshot-dir", dir, "--snapshot-interval", "0", "--snapshot-reuse-within", "0s")
	ctx := ctxT(t)
	r := startReconciler(t, c, "reconciler-0", "--tick", "1h")
	r.untilConverged(t, c)
	etcd := c.Etcd(c.Voters[0].ClientURL)
	gone := func(id uint64) {
		t.Helper()
		proctest.Eventually(t, 30*time.Second, func() error {
			for _, m := range c.Voters[0].Members().Members {
				if m.Id == id {
					return fmt.Errorf("learner %x is still a member", id)
				}
			}
			return nil
		})
	}

	orphan, err := etcd.MemberAddAsLearner(ctx, []string{"https://127.0.0.9:2380"})
	if err != nil {
		t.Fatal(err)
	}
	id := orphan.Member.ID
	gone(id)
	list, err := c.Management().ListSnapshots(ctx, &curatorv1.ListSnapshotsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Snapshots) != 1 {
		t.Fatalf("%d snapshots, want the one before the removal: %v", len(list.Snapshots), list.Snapshots)
	}
	s := list.Snapshots[0]
	change := fmt.Sprintf("remove member %x (node ", id)
	if s.Trigger != curatorv1.SnapshotTrigger_SNAPSHOT_TRIGGER_BEFORE_MEMBERSHIP_CHANGE || !strings.HasPrefix(s.Reason, "before membership change: "+change) || s.RequestedBy != "reconciler" {
		t.Fatalf("snapshot %s: trigger %v, reason %q, requested by %q; want before %q, by the reconciler", s.Name, s.Trigger, s.Reason, s.RequestedBy, change)
	}
	held := false
	for _, m := range s.Members {
		held = held || m.Id == id && m.Learner
	}
	if !held {
		t.Fatalf("snapshot %s does not hold learner %x: members %v", s.Name, id, s.Members)
	}
	snapAt, removeAt := -1, -1
	for i, ev := range cut.AuditLog(t, c.Management()) {
		switch {
		case ev.Action == auditv1.AuditAction_AUDIT_ACTION_SNAPSHOT && ev.Actor == "reconciler" && strings.Contains(ev.Reason, s.Name) && snapAt < 0:
			snapAt = i
		case ev.Action == auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE && ev.MemberId == id && ev.Outcome == auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED && removeAt < 0:
			removeAt = i
		}
	}
	if snapAt < 0 || removeAt < 0 || snapAt > removeAt {
		t.Fatalf("audit log: the snapshot at %d, the removal's intent at %d; want the snapshot first", snapAt, removeAt)
	}
	if got := snapshotsCounted(t, r, "taken"); got != 1 {
		t.Fatalf("%v snapshots counted as taken, want 1", got)
	}

	// The curator's snapshot hangs: the removal does not wait for it.
	c.Curators[0].Hold("before-snapshot")
	orphan, err = etcd.MemberAddAsLearner(ctx, []string{"https://127.0.0.9:2381"})
	if err != nil {
		t.Fatal(err)
	}
	gone(orphan.Member.ID)
	if got := snapshotsCounted(t, r, "failed"); got < 1 {
		t.Fatalf("%v snapshots counted as failed, want the one that hung", got)
	}
}

// snapshotsCounted is the reconciler's count of snapshots before
// membership changes with that result.
func snapshotsCounted(t *testing.T, r *replica, result string) float64 {
	t.Helper()
	body := proctest.MetricsHave(t, r.metrics, "curia_reconciler_snapshots_before_change_total")
	m := regexp.MustCompile(`(?m)^curia_reconciler_snapshots_before_change_total\{result="` + result + `"\} (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no curia_reconciler_snapshots_before_change_total{result=%q} in /metrics", result)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
