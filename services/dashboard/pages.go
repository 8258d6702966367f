package dashboard

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"html/template"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/nodes"
)

//go:embed web
var web embed.FS

// pages renders the four pages from the view. A page is its layout around
// a live part, which the event stream renders again on every change.
type pages struct {
	d    *Dashboard
	tmpl *template.Template
}

// page names the live part's template and the page's title.
var pageTitles = map[string]string{
	"cluster":    "Cluster",
	"nodes":      "Nodes",
	"membership": "Membership",
	"audit":      "Audit log",
}

func newPages(d *Dashboard) *pages {
	funcs := template.FuncMap{
		"ago":   ago,
		"clock": clock,
		"hex":   func(id uint64) string { return fmt.Sprintf("%x", id) },
		"trim":  trimEnum,
		"errText": func(err error) string {
			if err == nil {
				return ""
			}
			return errText(err)
		},
	}
	return &pages{d: d, tmpl: template.Must(template.New("").Funcs(funcs).ParseFS(web, "web/*.html"))}
}

// pageData is what a page's templates see.
type pageData struct {
	Page, Title string
	CSRF        string
	Filter      string
	Live        liveData
}

// liveData is what a live part sees.
type liveData struct {
	Now        time.Time
	Cluster    clusterData
	Nodes      []nodeRow
	FilterErr  string
	Filtered   bool
	Members    []nodeRow // etcd members, voters first
	Plan       planData
	Audit      []auditRow
	Problems   []string // streams or calls that fail now
	CSRF       string
	NodesTotal int
	// The cluster and membership pages' history (timeline.go, history.go).
	Timeline    []timelineRow
	Learners    []learnerRow
	Maintenance []maintenanceRow
	Chart       chartData
	History     string // how far back the chart reaches, e.g. "1h0m0s"
}

type clusterData struct {
	Name             string
	Leader, Term     string
	LeaderSince      string
	Reconciler       string // the active replica
	LeaseHolder      string
	LeaseExpires     string
	Fence            []string
	Epoch            int64
	Voters, Healthy  uint32
	Quorum           uint32
	Tolerance        int32
	HasConsensus     bool
	Pending          []auditRow
	NodesByState     []string
	ControlPlaneSize string
	Reconcilers      []reconcilerRow
}

type reconcilerRow struct {
	Addr, Name, Role, Result, Detail, Error string
	Paused                                  bool
}

type nodeRow struct {
	ID, Address, State, Health string
	Heartbeat, HeartbeatTime   string
	Roles                      []string
	HasCM, CanApprove          bool
	Member                     string // hex member id, "" when none
	Membership                 string // voter, learner, or ""
	Leader, Started, Healthy   bool
	Lag                        string
	Unreadable                 string
	// Maintenance says why and until when the node is in maintenance
	// ("" when it is not).
	Maintenance string
}

type planData struct {
	From, Error string
	Next        string
	Steps       []string
}

type auditRow struct {
	Time, Ago, Actor, Action, Node, Member, Reason, Outcome, ChangeID string
	Fence                                                             []string
	Revision                                                          int64
}

// live renders a page's live part from st; for the nodes page with a
// filter it asks the curator for the matching ids (ListNodes' filter).
func (p *pages) live(ctx context.Context, page, filter string, st state) liveData {
	ld := liveData{Now: time.Now(), CSRF: p.d.csrf, NodesTotal: len(st.Nodes)}
	ld.Problems = problems(st)
	cons := st.Consensus
	members := map[string]*curatorv1.ConsensusMemberStatus{}
	for _, m := range cons.GetMembers() {
		members[m.NodeId] = m
	}
	switch page {
	case "cluster":
		ld.Cluster = clusterOf(st)
		ld.Maintenance = maintenanceOf(st.Nodes, cons, ld.Now)
		ld.Chart, ld.History = chartOf(within(st.History, p.d.cfg.History, ld.Now)), p.d.cfg.History.String()
	case "nodes":
		ids := slices.Sorted(maps.Keys(st.Nodes))
		if filter != "" {
			ld.Filtered = true
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			matched, err := nodes.ListBasic(ctx, p.d.view.mgmt, filter)
			cancel()
			if err != nil {
				ld.FilterErr = errText(err)
				ids = nil
			} else {
				ids = ids[:0]
				for _, n := range matched {
					ids = append(ids, n.Id)
				}
			}
		}
		for _, id := range ids {
			if n := st.Nodes[id]; n != nil {
				ld.Nodes = append(ld.Nodes, rowOf(n, st.Heartbeats[id], members[id]))
			}
		}
	case "membership":
		for _, m := range cons.GetMembers() {
			row := rowOf(st.Nodes[m.NodeId], nil, m)
			if row.ID == "" {
				row.ID = m.NodeId + " (no such node)"
			}
			ld.Members = append(ld.Members, row)
		}
		slices.SortStableFunc(ld.Members, func(a, b nodeRow) int {
			if c := strings.Compare(b.Membership, a.Membership); c != 0 {
				return c // voters first
			}
			return strings.Compare(a.ID, b.ID)
		})
		ld.Plan = planOf(st)
		ld.Cluster = clusterOf(st)
		ld.Maintenance = maintenanceOf(st.Nodes, cons, ld.Now)
		ld.Learners = learnersOf(cons, st.Timeline, st.LearnerSeen)
		ld.Timeline = timelineOf(st.Timeline, p.d.cfg.TimelineEvents, time.Time{})
		ld.Chart, ld.History = chartOf(within(st.History, p.d.cfg.History, ld.Now)), p.d.cfg.History.String()
	case "audit":
		for _, e := range st.Audit {
			ld.Audit = append(ld.Audit, auditRowOf(e))
		}
	}
	return ld
}

func problems(st state) []string {
	var out []string
	add := func(what string, err error) {
		if err != nil {
			out = append(out, what+": "+errText(err))
		}
	}
	add("node watch", st.NodesErr)
	add("audit log", st.AuditErr)
	add("curator leader", st.LeaderErr)
	add("status", st.StatusErr)
	return out
}

func clusterOf(st state) clusterData {
	c := clusterData{Name: st.Info.GetClusterName()}
	if l := st.Leader; l != nil {
		c.Leader, c.Term = l.LeaderName, fmt.Sprint(l.Term)
		c.LeaderSince = clock(l.Since)
	}
	if cons := st.Consensus; cons != nil {
		c.HasConsensus = true
		c.Epoch, c.Voters, c.Healthy, c.Quorum, c.Tolerance = cons.MembershipEpoch, cons.Voters, cons.HealthyVoters, cons.Quorum, cons.FailureTolerance
	}
	for _, r := range st.Reconcilers {
		row := reconcilerRow{Addr: r.Addr}
		if r.Err != nil {
			row.Error = errText(r.Err)
		} else {
			s := r.Status
			row.Name, row.Role, row.Result, row.Detail, row.Paused = s.Name, trimEnum(s.Role.String()), trimEnum(s.LastResult.String()), s.LastResultDetail, s.Paused
			if s.LeaseHolder != "" {
				c.LeaseHolder = s.LeaseHolder
			}
			if s.Role == reconcilerv1.Role_ROLE_ACTIVE {
				c.Reconciler = s.Name
				c.LeaseHolder = s.LeaseHolder
				c.LeaseExpires = clock(s.LeaseExpires)
				c.Fence = nil
				for _, f := range s.Fence.GetConditions() {
					c.Fence = append(c.Fence, fmt.Sprintf("%s@%d", f.Key, f.CreateRevision))
				}
				if e := s.Fence.GetMembershipEpoch(); e != 0 {
					c.Fence = append(c.Fence, fmt.Sprintf("epoch %d", e))
				}
			}
		}
		c.Reconcilers = append(c.Reconcilers, row)
	}
	c.Pending = pendingOf(st.Audit)
	if info := st.Info; info != nil {
		for _, k := range slices.Sorted(maps.Keys(info.NodesByState)) {
			c.NodesByState = append(c.NodesByState, fmt.Sprintf("%d %s", info.NodesByState[k], trimEnum(k)))
		}
	}
	if cfg := st.Config.GetConfig(); cfg != nil {
		c.ControlPlaneSize = fmt.Sprint(cfg.ControlPlaneSize)
		if cfg.ControlPlaneSize == 0 {
			c.ControlPlaneSize = "0 (manual)"
		}
	}
	return c
}

// pendingOf is the membership changes whose intent the audit log records
// and whose outcome it does not (yet): the change in flight, if any.
func pendingOf(newestFirst []auditEntry) []auditRow {
	done := map[string]bool{}
	var out []auditRow
	for _, e := range newestFirst {
		id := e.Event.GetChangeId()
		if id == "" {
			continue
		}
		if e.Event.Outcome != auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED {
			done[id] = true
		} else if !done[id] {
			out = append(out, auditRowOf(e))
		}
	}
	return out
}

func rowOf(n *curatorv1.Node, beat *curatorv1.Node, m *curatorv1.ConsensusMemberStatus) nodeRow {
	if n == nil {
		n = &curatorv1.Node{}
	}
	r := nodeRow{
		ID: n.Id, Address: n.Status.GetAddress(), State: trimEnum(n.State.String()),
		Unreadable: n.Unreadable,
		CanApprove: n.State == curatorv1.NodeState_NODE_STATE_NEW,
	}
	health, last := n.Health, n.LastHeartbeat
	if beat != nil {
		health, last = beat.Health, beat.LastHeartbeat
	}
	r.Health = trimEnum(health.String())
	r.Heartbeat, r.HeartbeatTime = ago(last), clock(last)
	if mt := n.GetMaintenance(); mt != nil && time.Now().Before(mt.GetUntil().AsTime()) {
		r.Maintenance = fmt.Sprintf("in maintenance until %s, by %s: %s", clock(mt.GetUntil()), mt.GetBy(), mt.GetReason())
	}
	if roles := n.Roles; roles != nil {
		if roles.ConsensusMember != nil {
			r.Roles, r.HasCM = append(r.Roles, "ConsensusMember"), true
		}
		if roles.KubernetesController != nil {
			r.Roles = append(r.Roles, "KubernetesController")
		}
		if roles.KubernetesWorker != nil {
			r.Roles = append(r.Roles, "KubernetesWorker")
		}
	}
	if m != nil {
		r.Member = fmt.Sprintf("%x", m.MemberId)
		r.Membership = "voter"
		if m.Learner {
			r.Membership = "learner"
		}
		r.Leader, r.Started, r.Healthy = m.Leader, m.Started, m.Healthy
		r.Lag = fmt.Sprint(m.Lag)
		if m.RaftIndex == 0 {
			r.Lag = "no answer"
		}
	}
	return r
}

func planOf(st state) planData {
	p := planData{From: st.PlanFrom}
	if st.Plan == nil {
		if st.PlanErr != nil {
			p.Error = errText(st.PlanErr)
		}
		return p
	}
	p.Next = actionWords(st.Plan.Action)
	for _, s := range st.Plan.Steps {
		p.Steps = append(p.Steps, fmt.Sprintf("%s — then %d voters, %d healthy, survives %s", actionWords(s.Action), s.Voters, s.HealthyVoters, failures(s.FailureTolerance)))
	}
	return p
}

// actionWords says an action in words: what, on which node or member, why.
func actionWords(a *reconcilerv1.Action) string {
	if a == nil {
		return "nothing"
	}
	var what string
	switch a.Kind {
	case reconcilerv1.ActionKind_ACTION_KIND_NONE:
		what = "nothing to do"
	case reconcilerv1.ActionKind_ACTION_KIND_REFUSE:
		what = "refuse to act"
	case reconcilerv1.ActionKind_ACTION_KIND_REMOVE_MEMBER:
		what = fmt.Sprintf("remove etcd member %x", a.MemberId)
	case reconcilerv1.ActionKind_ACTION_KIND_ADD_ROLE:
		what = "give ConsensusMember"
	case reconcilerv1.ActionKind_ACTION_KIND_REMOVE_ROLE:
		what = "take ConsensusMember"
	case reconcilerv1.ActionKind_ACTION_KIND_PROMOTE:
		what = fmt.Sprintf("promote learner %x to voter", a.MemberId)
	case reconcilerv1.ActionKind_ACTION_KIND_ADD_MEMBER:
		what = "add as a learner"
	default:
		what = trimEnum(a.Kind.String())
	}
	if a.NodeId != "" {
		what += " (" + a.NodeId + ")"
	}
	if a.Reason != "" {
		what += ": " + a.Reason
	}
	return what
}

func failures(n int32) string {
	switch {
	case n < 0:
		return "no failure: no quorum"
	case n == 1:
		return "1 voter failure"
	}
	return fmt.Sprintf("%d voter failures", n)
}

func auditRowOf(e auditEntry) auditRow {
	ev := e.Event
	r := auditRow{
		Time: clock(ev.Time), Ago: ago(ev.Time), Actor: ev.Actor, Action: trimEnum(ev.Action.String()),
		Node: ev.NodeId, Reason: ev.Reason, ChangeID: ev.ChangeId, Fence: ev.Fence, Revision: e.Revision,
	}
	if ev.MemberId != 0 {
		r.Member = fmt.Sprintf("%x", ev.MemberId)
	}
	switch {
	case ev.Outcome != auditv1.ChangeOutcome_CHANGE_OUTCOME_UNSPECIFIED:
		r.Outcome = trimEnum(ev.Outcome.String())
	case ev.ChangeId != "":
		r.Outcome = "intent"
	}
	return r
}

// trimEnum shortens an enum value name: NODE_STATE_UP → UP.
func trimEnum(s string) string {
	for _, p := range []string{"NODE_STATE_", "NODE_HEALTH_", "ROLE_", "PASS_RESULT_", "ACTION_KIND_", "AUDIT_ACTION_", "CHANGE_OUTCOME_"} {
		if strings.HasPrefix(s, p) {
			return strings.TrimPrefix(s, p)
		}
	}
	return s
}

func ago(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "never"
	}
	return agoTime(ts.AsTime())
}

// agoTime is how long ago t was, roughly.
func agoTime(t time.Time) string {
	d := time.Since(t)
	switch {
	case d < time.Second:
		return "now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	}
	return fmt.Sprintf("%dh ago", int(d.Hours()))
}

func clock(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().Local().Format("2006-01-02 15:04:05")
}

// errText is an API error as the API said it: its code and its message,
// as is.
func errText(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Code().String() + ": " + st.Message()
	}
	return err.Error()
}

// render executes a template into a string.
func (p *pages) render(name string, data any) (string, error) {
	var b bytes.Buffer
	if err := p.tmpl.ExecuteTemplate(&b, name, data); err != nil {
		return "", err
	}
	return b.String(), nil
}
