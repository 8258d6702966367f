package dashboard

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// ev is an audit event at t0+sec seconds.
func ev(sec int, action auditv1.AuditAction, node string, f ...func(*auditv1.Event)) *auditv1.Event {
	e := &auditv1.Event{Time: timestamppb.New(t0.Add(time.Duration(sec) * time.Second)), Actor: "admin/ops", RecordedBy: "curator/curator-1", Action: action, NodeId: node, Reason: "because"}
	for _, f := range f {
		f(e)
	}
	return e
}

func change(id string, member uint64, outcome auditv1.ChangeOutcome, actor, reason string) func(*auditv1.Event) {
	return func(e *auditv1.Event) {
		e.ChangeId, e.MemberId, e.Outcome, e.Actor, e.Reason = id, member, outcome, actor, reason
	}
}

// newestFirst numbers events given oldest first with revisions 1.. and
// returns them newest first, as the view keeps them.
func newestFirst(events ...*auditv1.Event) []auditEntry {
	var out []auditEntry
	for i, e := range events {
		out = append(out, auditEntry{Event: e, Revision: int64(i + 1)})
	}
	slices.Reverse(out)
	return out
}

// row is the part of a timeline row a test compares.
type row struct{ What, Node, Member, Actor, Outcome, Reason, Detail string }

func TestTimelineOf(t *testing.T) {
	const (
		applied    = auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED
		notApplied = auditv1.ChangeOutcome_CHANGE_OUTCOME_NOT_APPLIED
		intent     = auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED
	)
	formation := newestFirst(
		ev(0, auditv1.AuditAction_AUDIT_ACTION_CLUSTER_BOOTSTRAP, "node-1"),
		ev(1, auditv1.AuditAction_AUDIT_ACTION_NODE_COMMIT, "node-2"), // not membership
		ev(2, auditv1.AuditAction_AUDIT_ACTION_NODE_APPROVE, "node-2"),
		ev(3, auditv1.AuditAction_AUDIT_ACTION_NODE_CERTIFICATES, "node-2"), // not membership
		ev(4, auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_ADD_CONSENSUS_MEMBER, "node-2", func(e *auditv1.Event) { e.Actor = "reconciler/reconciler-1" }),
		ev(5, auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD, "node-2", change("c1", 0, intent, "reconciler/reconciler-1", "control_plane_size 3")),
		ev(6, auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD, "node-2", change("c1", 0xabc, applied, "reconciler/reconciler-1", "etcd added it")),
		ev(7, auditv1.AuditAction_AUDIT_ACTION_MEMBER_PROMOTE, "node-2", change("c2", 0xabc, intent, "reconciler/reconciler-1", "caught up")),
		ev(8, auditv1.AuditAction_AUDIT_ACTION_MEMBER_PROMOTE, "node-2", change("c2", 0xabc, applied, "reconciler/reconciler-1", "")),
	)
	for name, tc := range map[string]struct {
		events []auditEntry
		limit  int
		since  time.Time
		want   []row
	}{
		"no event": {limit: 10},
		"cluster formation: a change's intent and outcome in one row, newest first": {
			events: formation, limit: 10,
			want: []row{
				{What: "promote learner to voter", Node: "node-2", Member: "abc", Actor: "reconciler/reconciler-1", Outcome: "APPLIED", Reason: "caught up"},
				{What: "add a learner", Node: "node-2", Member: "abc", Actor: "reconciler/reconciler-1", Outcome: "APPLIED", Reason: "control_plane_size 3", Detail: "etcd added it"},
				{What: "ConsensusMember given (reconciler)", Node: "node-2", Actor: "reconciler/reconciler-1", Outcome: "done", Reason: "because"},
				{What: "node approved", Node: "node-2", Actor: "admin/ops", Outcome: "done", Reason: "because"},
				{What: "cluster bootstrapped", Node: "node-1", Actor: "admin/ops", Outcome: "done", Reason: "because"},
			},
		},
		"limit: the newest rows": {
			events: formation, limit: 2,
			want: []row{
				{What: "promote learner to voter", Node: "node-2", Member: "abc", Actor: "reconciler/reconciler-1", Outcome: "APPLIED", Reason: "caught up"},
				{What: "add a learner", Node: "node-2", Member: "abc", Actor: "reconciler/reconciler-1", Outcome: "APPLIED", Reason: "control_plane_size 3", Detail: "etcd added it"},
			},
		},
		"limit: the last row still gets its intent from behind other events": {
			events: newestFirst(
				ev(0, auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE, "node-3", change("c5", 0x3, intent, "admin/ops", "take it out")),
				ev(1, auditv1.AuditAction_AUDIT_ACTION_NODE_APPROVE, "node-4"),
				ev(2, auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE, "node-3", change("c5", 0x3, applied, "admin/ops", "gone")),
			),
			limit: 1,
			want: []row{
				{What: "remove member", Node: "node-3", Member: "3", Actor: "admin/ops", Outcome: "APPLIED", Reason: "take it out", Detail: "gone"},
			},
		},
		"since: a change that finished since, begun before": {
			events: formation, limit: 10, since: t0.Add(8 * time.Second),
			want: []row{
				{What: "promote learner to voter", Node: "node-2", Member: "abc", Actor: "reconciler/reconciler-1", Outcome: "APPLIED", Reason: "caught up"},
			},
		},
		"since: none older": {
			events: formation, limit: 10, since: t0.Add(7 * time.Second),
			want: []row{
				{What: "promote learner to voter", Node: "node-2", Member: "abc", Actor: "reconciler/reconciler-1", Outcome: "APPLIED", Reason: "caught up"},
			},
		},
		"a change in flight is pending; one not applied says so": {
			events: newestFirst(
				ev(0, auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE, "node-3", change("c3", 0x3, intent, "admin/ops", "take it out")),
				ev(1, auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE, "node-3", change("c3", 0x3, notApplied, "admin/ops", "etcd refused")),
				ev(2, auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD, "node-4", change("c4", 0, intent, "admin/ops", "grow")),
			),
			limit: 10,
			want: []row{
				{What: "add a learner", Node: "node-4", Actor: "admin/ops", Outcome: "pending", Reason: "grow"},
				{What: "remove member", Node: "node-3", Member: "3", Actor: "admin/ops", Outcome: "NOT_APPLIED", Reason: "take it out", Detail: "etcd refused"},
			},
		},
		"maintenance: started moving leadership, ended, expired; refusal; deletion": {
			events: newestFirst(
				ev(0, auditv1.AuditAction_AUDIT_ACTION_NODE_MAINTENANCE_START, "node-2", func(e *auditv1.Event) {
					e.Reason = "in maintenance for 10m0s, until 2026-01-02T03:14:05Z: upgrade; etcd leadership moved from its voter a to b"
				}),
				ev(1, auditv1.AuditAction_AUDIT_ACTION_NODE_MAINTENANCE_END, "node-2", func(e *auditv1.Event) { e.Reason = "maintenance (upgrade, since …) ended by admin/ops" }),
				ev(2, auditv1.AuditAction_AUDIT_ACTION_NODE_MAINTENANCE_START, "node-3", func(e *auditv1.Event) { e.Reason = "reboot; its node has no etcd voter" }),
				ev(3, auditv1.AuditAction_AUDIT_ACTION_NODE_MAINTENANCE_END, "node-3", func(e *auditv1.Event) {
					e.Actor, e.Reason = "curator/curator-1", "maintenance (reboot, since …) expired (its end passed)"
				}),
				ev(4, auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE_REFUSED, "node-2", func(e *auditv1.Event) { e.MemberId, e.Reason = 0xb, "quorum" }),
				ev(5, auditv1.AuditAction_AUDIT_ACTION_NODE_DECOMMISSION, "node-4", func(e *auditv1.Event) { e.Reason = "decommissioned: gone" }),
				ev(6, auditv1.AuditAction_AUDIT_ACTION_NODE_DELETE, "node-4", func(e *auditv1.Event) { e.Reason = "" }),
				ev(7, auditv1.AuditAction_AUDIT_ACTION_ROLES_UPDATE, "node-5", func(e *auditv1.Event) {
					e.Reason, e.Roles = "", &auditv1.Roles{ConsensusMember: true, KubernetesWorker: true}
				}),
				ev(8, auditv1.AuditAction_AUDIT_ACTION_CLUSTER_RECOVER, "node-1", func(e *auditv1.Event) { e.Reason = "lost quorum" }),
			),
			limit: 20,
			want: []row{
				{What: "cluster recovered", Node: "node-1", Actor: "admin/ops", Outcome: "done", Reason: "lost quorum"},
				{What: "roles set: ConsensusMember, KubernetesWorker", Node: "node-5", Actor: "admin/ops", Outcome: "done"},
				{What: "node deleted", Node: "node-4", Actor: "admin/ops", Outcome: "done"},
				{What: "node decommissioned", Node: "node-4", Actor: "admin/ops", Outcome: "done", Reason: "decommissioned: gone"},
				{What: "member removal refused", Node: "node-2", Member: "b", Actor: "admin/ops", Outcome: "refused", Reason: "quorum"},
				{What: "maintenance expired", Node: "node-3", Actor: "curator/curator-1", Outcome: "done", Reason: "maintenance (reboot, since …) expired (its end passed)"},
				{What: "maintenance started", Node: "node-3", Actor: "admin/ops", Outcome: "done", Reason: "reboot; its node has no etcd voter"},
				{What: "maintenance ended", Node: "node-2", Actor: "admin/ops", Outcome: "done", Reason: "maintenance (upgrade, since …) ended by admin/ops"},
				{What: "maintenance started; etcd leadership moved", Node: "node-2", Actor: "admin/ops", Outcome: "done", Reason: "in maintenance for 10m0s, until 2026-01-02T03:14:05Z: upgrade; etcd leadership moved from its voter a to b"},
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := timelineOf(tc.events, tc.limit, tc.since)
			var rows []row
			for i, r := range got {
				rows = append(rows, row{What: r.What, Node: r.Node, Member: r.Member, Actor: r.Actor, Outcome: r.Outcome, Reason: r.Reason, Detail: r.Detail})
				if i > 0 && got[i-1].Revision < r.Revision {
					t.Errorf("row %d (revision %d) is newer than row %d (revision %d)", i, r.Revision, i-1, got[i-1].Revision)
				}
			}
			if !slices.Equal(rows, tc.want) {
				t.Fatalf("timeline\n%s\nwant\n%s", fmtRows(rows), fmtRows(tc.want))
			}
		})
	}
}

func fmtRows(rows []row) string {
	var b strings.Builder
	for _, r := range rows {
		b.WriteString("  " + strings.Join([]string{r.What, r.Node, r.Member, r.Actor, r.Outcome, r.Reason, r.Detail}, " | ") + "\n")
	}
	return b.String()
}

// TestTimelineRendering renders the membership timeline's table from
// audit entries as the membership page does: one row per change, newest
// first, the outcome, and the page's markup escapes what the events say.
func TestTimelineRendering(t *testing.T) {
	p := newPages(&Dashboard{})
	entries := newestFirst(
		ev(0, auditv1.AuditAction_AUDIT_ACTION_CLUSTER_BOOTSTRAP, "node-1"),
		ev(1, auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD, "node-2", change("c1", 0, auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED, "reconciler/r-1", "<grow>")),
		ev(2, auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD, "node-2", change("c1", 0xabc, auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED, "reconciler/r-1", "")),
	)
	for name, tc := range map[string]struct {
		rows []timelineRow
		want []string // in this order
		not  []string
	}{
		"empty": {want: []string{`id="timeline"`, "no membership event in the audit log yet"}},
		"formation": {
			rows: timelineOf(entries, 10, time.Time{}),
			want: []string{
				`data-revision="3" data-action="MEMBER_ADD" data-node="node-2" data-outcome="APPLIED"`,
				`<td class="what">add a learner</td>`, `<td>abc</td>`, `&lt;grow&gt;`,
				`data-revision="1" data-action="CLUSTER_BOOTSTRAP" data-node="node-1" data-outcome="done"`,
				`<td class="what">cluster bootstrapped</td>`,
			},
			not: []string{`data-revision="2"`, "<grow>", "no membership event"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			html, err := p.render("timeline", liveData{Timeline: tc.rows})
			if err != nil {
				t.Fatal(err)
			}
			at := 0
			for _, w := range tc.want {
				i := strings.Index(html[at:], w)
				if i < 0 {
					t.Fatalf("no %q (in order) in\n%s", w, html)
				}
				at += i + len(w)
			}
			for _, n := range tc.not {
				if strings.Contains(html, n) {
					t.Errorf("%q in\n%s", n, html)
				}
			}
		})
	}
}

func TestLearnersOf(t *testing.T) {
	seen := t0.Add(time.Hour)
	cons := &curatorv1.GetConsensusStatusResponse{Members: []*curatorv1.ConsensusMemberStatus{
		{MemberId: 0x1, NodeId: "node-1", Leader: true, RaftIndex: 1000},
		{MemberId: 0x2, NodeId: "node-2", Learner: true, RaftIndex: 900, Lag: 100},
		{MemberId: 0x3, NodeId: "node-3", Learner: true, RaftIndex: 0, Lag: 0},
		{MemberId: 0x4, NodeId: "node-4"},
	}}
	audit := newestFirst(
		ev(5, auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD, "node-2", change("c1", 0, auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED, "admin/ops", "")),
		ev(6, auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD, "node-2", change("c1", 0x2, auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED, "admin/ops", "")),
	)
	for name, tc := range map[string]struct {
		audit []auditEntry
		seen  map[uint64]time.Time
		want  []learnerRow
	}{
		"since from the audit log, else first seen": {
			audit: audit, seen: map[uint64]time.Time{0x2: seen, 0x3: seen},
			want: []learnerRow{
				{Node: "node-2", Member: "2", RaftIndex: 900, LeaderIndex: 1000, Lag: 100, Percent: 90, Answered: true, Since: t0.Add(6 * time.Second), SinceWhence: "audit log"},
				{Node: "node-3", Member: "3", LeaderIndex: 1000, Since: seen, SinceWhence: "dashboard"},
			},
		},
		"no audit, never seen: since unknown": {
			want: []learnerRow{
				{Node: "node-2", Member: "2", RaftIndex: 900, LeaderIndex: 1000, Lag: 100, Percent: 90, Answered: true},
				{Node: "node-3", Member: "3", LeaderIndex: 1000},
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := learnersOf(cons, tc.audit, tc.seen)
			for i := range got {
				got[i].SinceText, got[i].SinceAgoText = "", ""
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("learners\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestLearnersSeen(t *testing.T) {
	earlier, now := t0, t0.Add(time.Minute)
	cons := &curatorv1.GetConsensusStatusResponse{Members: []*curatorv1.ConsensusMemberStatus{{MemberId: 1}, {MemberId: 2, Learner: true}, {MemberId: 3, Learner: true}}}
	got := learnersSeen(map[uint64]time.Time{2: earlier, 9: earlier}, cons, now)
	want := map[uint64]time.Time{2: earlier, 3: now}
	if len(got) != len(want) || got[2] != want[2] || got[3] != want[3] {
		t.Fatalf("learnersSeen = %v, want %v", got, want)
	}
}

func TestMaintenanceOf(t *testing.T) {
	now := t0.Add(time.Minute)
	mt := func(until time.Duration, moved uint64) *curatorv1.NodeMaintenance {
		return &curatorv1.NodeMaintenance{Reason: "upgrade", By: "admin/ops", Since: timestamppb.New(t0), Until: timestamppb.New(t0.Add(until)), LeadershipMovedTo: moved}
	}
	cons := &curatorv1.GetConsensusStatusResponse{Members: []*curatorv1.ConsensusMemberStatus{
		{MemberId: 0xa, NodeId: "node-1"}, {MemberId: 0xb, NodeId: "node-2"}, {MemberId: 0xc, NodeId: "node-3", Learner: true},
	}}
	for name, tc := range map[string]struct {
		nodes map[string]*curatorv1.Node
		want  []maintenanceRow
	}{
		"none": {nodes: map[string]*curatorv1.Node{"node-1": {Id: "node-1"}}},
		"a voter whose leadership moved": {
			nodes: map[string]*curatorv1.Node{"node-1": {Id: "node-1", Maintenance: mt(10*time.Minute, 0xb)}, "node-2": {Id: "node-2"}},
			want:  []maintenanceRow{{Node: "node-1", Reason: "upgrade", By: "admin/ops", Since: t0, Until: t0.Add(10 * time.Minute), Voter: true, LeadershipTo: "b (node-2)"}},
		},
		"a learner, and a worker": {
			nodes: map[string]*curatorv1.Node{"node-3": {Id: "node-3", Maintenance: mt(10*time.Minute, 0)}, "node-4": {Id: "node-4", Maintenance: mt(10*time.Minute, 0)}},
			want: []maintenanceRow{
				{Node: "node-3", Reason: "upgrade", By: "admin/ops", Since: t0, Until: t0.Add(10 * time.Minute), Learner: true},
				{Node: "node-4", Reason: "upgrade", By: "admin/ops", Since: t0, Until: t0.Add(10 * time.Minute)},
			},
		},
		"past its end: over, cleared or not": {
			nodes: map[string]*curatorv1.Node{"node-1": {Id: "node-1", Maintenance: mt(time.Minute, 0)}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := maintenanceOf(tc.nodes, cons, now)
			for i := range got {
				got[i].SinceText, got[i].UntilText = "", ""
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("maintenance\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}
