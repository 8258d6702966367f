package dashboard

import (
	"fmt"
	"slices"
	"strings"
	"time"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// The membership timeline, the learners' catch-up and the nodes in
// maintenance: read from the curators' audit log (the view's audit
// stream), the consensus status and the node registry; no store of the
// dashboard's own.

// timelineActions are the audit actions of the membership timeline, in
// words: a membership change (MEMBER_ADD, _PROMOTE, _REMOVE) as what was
// asked, its outcome beside it. Anything else the audit log records (certificates, snapshots,
// node commits) stays on the audit page only.
var timelineActions = map[auditv1.AuditAction]string{
	auditv1.AuditAction_AUDIT_ACTION_CLUSTER_BOOTSTRAP:                       "cluster bootstrapped",
	auditv1.AuditAction_AUDIT_ACTION_CLUSTER_RECOVER:                         "cluster recovered",
	auditv1.AuditAction_AUDIT_ACTION_CLUSTER_CONFIG_UPDATE:                   "cluster config updated",
	auditv1.AuditAction_AUDIT_ACTION_NODE_APPROVE:                            "node approved",
	auditv1.AuditAction_AUDIT_ACTION_NODE_DELETE:                             "node deleted",
	auditv1.AuditAction_AUDIT_ACTION_NODE_DECOMMISSION:                       "node decommissioned",
	auditv1.AuditAction_AUDIT_ACTION_NODE_MAINTENANCE_START:                  "maintenance started",
	auditv1.AuditAction_AUDIT_ACTION_NODE_MAINTENANCE_END:                    "maintenance ended",
	auditv1.AuditAction_AUDIT_ACTION_ROLES_UPDATE:                            "roles set",
	auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_ADD_CONSENSUS_MEMBER:    "ConsensusMember given (reconciler)",
	auditv1.AuditAction_AUDIT_ACTION_ROLES_RECONCILE_REMOVE_CONSENSUS_MEMBER: "ConsensusMember taken (reconciler)",
	auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD:                              "add a learner",
	auditv1.AuditAction_AUDIT_ACTION_MEMBER_PROMOTE:                          "promote learner to voter",
	auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE:                           "remove member",
	auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE_REFUSED:                   "member removal refused",
	auditv1.AuditAction_AUDIT_ACTION_MEMBER_CHANGE_UNREADABLE:                "unreadable membership change finished",
	auditv1.AuditAction_AUDIT_ACTION_ETCD_NOSPACE_RECOVERED:                  "etcd out of space, recovered",
}

// inTimeline says whether e belongs on the membership timeline.
func inTimeline(e *auditv1.Event) bool {
	_, ok := timelineActions[e.GetAction()]
	return ok
}

// timelineRow is one change of the timeline: a membership change's intent
// and outcome (one change id) are one row.
type timelineRow struct {
	At       time.Time `json:"time"` // when it happened (a membership change: when it finished, else began)
	Time     string    `json:"-"`
	Ago      string    `json:"-"`
	Actor    string    `json:"actor"`
	Action   string    `json:"action"` // the audit action, e.g. MEMBER_ADD
	What     string    `json:"what"`   // in words
	Node     string    `json:"node,omitempty"`
	Member   string    `json:"member,omitempty"` // hex
	Outcome  string    `json:"outcome"`          // APPLIED, NOT_APPLIED, UNKNOWN, pending (no outcome yet), done (not a membership change)
	Reason   string    `json:"reason,omitempty"`
	Detail   string    `json:"detail,omitempty"` // the outcome's own reason
	ChangeID string    `json:"change_id,omitempty"`
	Revision int64     `json:"revision"`
}

// timelineOf is the membership timeline of the audit events (newest
// first), at most limit rows, none older than since (zero: no bound).
func timelineOf(newestFirst []auditEntry, limit int, since time.Time) []timelineRow {
	var out []timelineRow
	byChange := map[string]int{} // change id → index in out
	for _, e := range newestFirst {
		ev := e.Event
		if !inTimeline(ev) {
			continue
		}
		if id := ev.GetChangeId(); id != "" {
			if i, ok := byChange[id]; ok {
				// The intent of a change whose outcome is newer: its actor
				// and reason, the outcome's time.
				r := &out[i]
				if ev.GetOutcome() == auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED {
					r.Actor, r.Reason = ev.GetActor(), ev.GetReason()
					if r.Node == "" {
						r.Node = ev.GetNodeId()
					}
				}
				continue
			}
		}
		if len(out) == limit || (!since.IsZero() && ev.GetTime().AsTime().Before(since)) {
			continue // only to find the intents of the rows already out
		}
		r := timelineRow{
			At: ev.GetTime().AsTime(), Time: clock(ev.GetTime()), Ago: ago(ev.GetTime()),
			Actor: ev.GetActor(), Action: trimEnum(ev.GetAction().String()), What: whatOf(ev),
			Node: ev.GetNodeId(), Reason: ev.GetReason(), ChangeID: ev.GetChangeId(), Revision: e.Revision,
			Outcome: "done",
		}
		if ev.GetMemberId() != 0 {
			r.Member = fmt.Sprintf("%x", ev.GetMemberId())
		}
		switch {
		case ev.GetOutcome() != auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED:
			r.Outcome, r.Detail, r.Reason = trimEnum(ev.GetOutcome().String()), ev.GetReason(), ""
		case ev.GetChangeId() != "":
			r.Outcome = "pending"
		case ev.GetAction() == auditv1.AuditAction_AUDIT_ACTION_MEMBER_REMOVE_REFUSED:
			r.Outcome = "refused"
		}
		if r.ChangeID != "" {
			byChange[r.ChangeID] = len(out)
		}
		out = append(out, r)
	}
	return out
}

// whatOf says what an event changed, in words.
func whatOf(ev *auditv1.Event) string {
	what := timelineActions[ev.GetAction()]
	switch ev.GetAction() {
	case auditv1.AuditAction_AUDIT_ACTION_NODE_MAINTENANCE_END:
		if strings.Contains(ev.GetReason(), "expired") {
			what = "maintenance expired"
		}
	case auditv1.AuditAction_AUDIT_ACTION_NODE_MAINTENANCE_START:
		if strings.Contains(ev.GetReason(), "leadership moved") {
			what += "; etcd leadership moved"
		}
	case auditv1.AuditAction_AUDIT_ACTION_ROLES_UPDATE:
		var roles []string
		if r := ev.GetRoles(); r != nil {
			if r.ConsensusMember {
				roles = append(roles, "ConsensusMember")
			}
			if r.KubernetesController {
				roles = append(roles, "KubernetesController")
			}
			if r.KubernetesWorker {
				roles = append(roles, "KubernetesWorker")
			}
		}
		if len(roles) == 0 {
			roles = []string{"none"}
		}
		what += ": " + strings.Join(roles, ", ")
	}
	return what
}

// learnerRow is a learner and how far behind the leader it is.
type learnerRow struct {
	Node         string    `json:"node"`
	Member       string    `json:"member"`
	RaftIndex    uint64    `json:"raft_index"`
	LeaderIndex  uint64    `json:"leader_raft_index"`
	Lag          uint64    `json:"lag"`
	Percent      int       `json:"percent"` // of the leader's index, 0..100
	Answered     bool      `json:"answered"`
	Since        time.Time `json:"since"`
	SinceText    string    `json:"-"`
	SinceWhence  string    `json:"since_from"` // "audit log" (its add applied) or "dashboard" (first seen as a learner)
	SinceAgoText string    `json:"-"`
}

// learnersOf is the learners of the consensus status; since is when each
// became one: the time of its add in the audit log, else when the
// dashboard first saw it a learner (seen).
func learnersOf(cons *curatorv1.GetConsensusStatusResponse, newestFirst []auditEntry, seen map[uint64]time.Time) []learnerRow {
	var leader uint64
	for _, m := range cons.GetMembers() {
		if m.GetLeader() {
			leader = m.GetRaftIndex()
		}
	}
	var out []learnerRow
	for _, m := range cons.GetMembers() {
		if !m.GetLearner() {
			continue
		}
		r := learnerRow{Node: m.GetNodeId(), Member: fmt.Sprintf("%x", m.GetMemberId()), RaftIndex: m.GetRaftIndex(), LeaderIndex: leader, Lag: m.GetLag(), Answered: m.GetRaftIndex() != 0}
		if leader > 0 && r.Answered {
			r.Percent = int(min(100, r.RaftIndex*100/leader))
		}
		for _, e := range newestFirst {
			ev := e.Event
			if ev.GetAction() == auditv1.AuditAction_AUDIT_ACTION_MEMBER_ADD && ev.GetMemberId() == m.GetMemberId() && ev.GetOutcome() == auditv1.ChangeOutcome_CHANGE_OUTCOME_APPLIED {
				r.Since, r.SinceWhence = ev.GetTime().AsTime(), "audit log"
				break
			}
		}
		if t, ok := seen[m.GetMemberId()]; ok && r.Since.IsZero() {
			r.Since, r.SinceWhence = t, "dashboard"
		}
		if !r.Since.IsZero() {
			r.SinceText, r.SinceAgoText = r.Since.Local().Format("2006-01-02 15:04:05"), agoTime(r.Since)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b learnerRow) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// maintenanceRow is a node in maintenance.
type maintenanceRow struct {
	Node         string    `json:"node"`
	Reason       string    `json:"reason"`
	By           string    `json:"by"`
	Since        time.Time `json:"since"`
	Until        time.Time `json:"until"`
	SinceText    string    `json:"-"`
	UntilText    string    `json:"-"`
	Voter        bool      `json:"voter"`                         // its node's etcd member votes
	Learner      bool      `json:"learner"`                       // its node's etcd member is a learner
	LeadershipTo string    `json:"leadership_moved_to,omitempty"` // the member (hex, and its node) etcd leadership moved to when it began
}

// maintenanceOf is the nodes in maintenance now (a maintenance whose end
// passed is over, whether or not the curator cleared it yet), by id.
func maintenanceOf(nodes map[string]*curatorv1.Node, cons *curatorv1.GetConsensusStatusResponse, now time.Time) []maintenanceRow {
	members := map[string]*curatorv1.ConsensusMemberStatus{}
	byID := map[uint64]string{}
	for _, m := range cons.GetMembers() {
		members[m.GetNodeId()] = m
		byID[m.GetMemberId()] = m.GetNodeId()
	}
	var out []maintenanceRow
	for _, n := range nodes {
		mt := n.GetMaintenance()
		if mt == nil || !now.Before(mt.GetUntil().AsTime()) {
			continue
		}
		r := maintenanceRow{
			Node: n.GetId(), Reason: mt.GetReason(), By: mt.GetBy(),
			Since: mt.GetSince().AsTime(), Until: mt.GetUntil().AsTime(),
			SinceText: clock(mt.GetSince()), UntilText: clock(mt.GetUntil()),
		}
		if m := members[n.GetId()]; m != nil {
			r.Voter, r.Learner = !m.GetLearner(), m.GetLearner()
		}
		if to := mt.GetLeadershipMovedTo(); to != 0 {
			r.LeadershipTo = fmt.Sprintf("%x", to)
			if node := byID[to]; node != "" {
				r.LeadershipTo += " (" + node + ")"
			}
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b maintenanceRow) int { return strings.Compare(a.Node, b.Node) })
	return out
}
