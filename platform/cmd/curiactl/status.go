package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/pki"
)

// clusterStatus is what curiactl status shows: the answers of
// GetClusterInfo, GetConsensusStatus and GetClusterConfig, and of the
// reconcilers' GetStatus, on one screen.
type clusterStatus struct {
	Cluster          string `json:"cluster"`
	CuratorLeader    string `json:"curatorLeader"`
	CuratorTerm      int64  `json:"curatorTerm"`
	EtcdLeader       string `json:"etcdLeader"`
	EtcdLeaderMember string `json:"etcdLeaderMemberId"`
	// Voters and Learners are node ids.
	Voters            []string `json:"voters"`
	Learners          []string `json:"learners"`
	HealthyVoters     uint32   `json:"healthyVoters"`
	Quorum            uint32   `json:"quorum"`
	FailureTolerance  int32    `json:"failureTolerance"`
	MembershipEpoch   int64    `json:"membershipEpoch"`
	RoleWithoutMember []string `json:"roleWithoutMember,omitempty"`
	// PendingChange is the membership change in flight, nil for none.
	PendingChange    *pendingChange `json:"pendingChange"`
	ActiveReconciler string         `json:"activeReconciler"`
	ReconcilerNote   string         `json:"reconcilerNote,omitempty"`
	// ReconcilerLastResult and ReconcilerLastRun are the active
	// reconciler's last pass: how it ended (CONVERGED, WAITING, ACTED...)
	// and when; ReconcilerPaused its own Pause (Reconciler/Pause).
	ReconcilerLastResult string           `json:"reconcilerLastResult,omitempty"`
	ReconcilerLastDetail string           `json:"reconcilerLastDetail,omitempty"`
	ReconcilerLastRun    string           `json:"reconcilerLastRun,omitempty"`
	ReconcilerPaused     string           `json:"reconcilerPaused,omitempty"`
	Paused               bool             `json:"paused"`
	PauseReason          string           `json:"pauseReason,omitempty"`
	ControlPlaneSize     uint32           `json:"controlPlaneSize"`
	ConfigRevision       int64            `json:"configRevision"`
	NodesByState         map[string]int64 `json:"nodesByState"`
	Alarms               []string         `json:"alarms,omitempty"`
	LastSnapshot         string           `json:"lastSnapshot,omitempty"`
	// LearnerLag is each learner's raft lag behind the leader.
	LearnerLag map[string]uint64 `json:"learnerLag,omitempty"`
}

// pendingChange is the one membership change in flight, cluster-wide.
type pendingChange struct {
	ID         string   `json:"id"`
	Operation  string   `json:"operation"`
	NodeID     string   `json:"nodeId"`
	MemberID   string   `json:"memberId,omitempty"`
	Actor      string   `json:"actor"`
	Fence      []string `json:"fence"`
	RecordedBy string   `json:"recordedBy"`
	Since      string   `json:"since"`
	// Deadline is how long the recorder may still make the etcd call;
	// another process resolves a record left behind after twice that.
	Deadline string `json:"deadline"`
}

func (a *app) statusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the cluster on one screen: leaders, voters, failure tolerance, pending change, autopilot",
		Long: `Show the cluster on one screen: the curator leader, the etcd leader, the
voters and learners, how many more voter failures the cluster survives,
the membership change in flight, the active reconciler and whether
autopilot is paused.

From Management/GetClusterInfo, GetConsensusStatus and GetClusterConfig,
and each reconciler's GetStatus (--reconciler, $CURIA_RECONCILERS) for the
active one and its last pass. PENDING CHANGE is the one membership change
in flight (while it is, every other is refused): what, to which node, who
asked, since when, under which fence.`,
		Example: `  curiactl status
  curiactl status -o json | jq .failureTolerance`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.status(cmd.Context())
			if err != nil {
				return err
			}
			if a.output != "table" {
				return printValue(a.stdout, a.output, s)
			}
			tw := newTable(a.stdout)
			statusTable(tw, s, time.Now())
			return tw.Flush()
		},
	}
}

func (a *app) status(ctx context.Context) (*clusterStatus, error) {
	m, err := a.mgmt()
	if err != nil {
		return nil, err
	}
	ctx, cancel := a.call(ctx)
	defer cancel()
	info, err := m.GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
	if err != nil {
		return nil, err
	}
	cs, err := m.GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		return nil, err
	}
	cfg, err := m.GetClusterConfig(ctx, &curatorv1.GetClusterConfigRequest{})
	if err != nil {
		return nil, err
	}
	s := &clusterStatus{
		Cluster:           info.GetClusterName(),
		CuratorLeader:     info.GetLeaderName(),
		CuratorTerm:       info.GetTerm(),
		HealthyVoters:     cs.GetHealthyVoters(),
		Quorum:            cs.GetQuorum(),
		FailureTolerance:  cs.GetFailureTolerance(),
		MembershipEpoch:   cs.GetMembershipEpoch(),
		RoleWithoutMember: cs.GetRoleWithoutMember(),
		Paused:            cfg.GetConfig().GetPaused(),
		PauseReason:       cfg.GetConfig().GetPauseReason(),
		ControlPlaneSize:  cfg.GetConfig().GetControlPlaneSize(),
		ConfigRevision:    cfg.GetRevision(),
		NodesByState:      info.GetNodesByState(),
		Alarms:            info.GetEtcdMaintenance().GetAlarms(),
		LastSnapshot:      info.GetSnapshots().GetLastGood().GetName(),
		Voters:            []string{},
		Learners:          []string{},
	}
	if p := cs.GetPending(); p != nil {
		s.PendingChange = &pendingChange{ID: p.GetId(), Operation: enumName(p.GetOperation().String(), "MEMBERSHIP_OPERATION_"), NodeID: p.GetNodeId(),
			Actor: p.GetActor(), Fence: p.GetFence(), RecordedBy: p.GetRecordedBy(), Since: timestamp(p.GetStarted()), Deadline: p.GetDeadline().AsDuration().String()}
		if s.PendingChange.Fence == nil {
			s.PendingChange.Fence = []string{}
		}
		if p.GetMemberId() != 0 {
			s.PendingChange.MemberID = fmt.Sprintf("%016x", p.GetMemberId())
		}
	}
	for _, mem := range cs.GetMembers() {
		id := mem.GetNodeId()
		if id == "" {
			id = fmt.Sprintf("member %016x", mem.GetMemberId())
		}
		if mem.GetLearner() {
			if s.LearnerLag == nil {
				s.LearnerLag = map[string]uint64{}
			}
			s.LearnerLag[id] = mem.GetLag()
			s.Learners = append(s.Learners, id)
		} else {
			s.Voters = append(s.Voters, id)
		}
		if mem.GetLeader() {
			s.EtcdLeader, s.EtcdLeaderMember = mem.GetNodeId(), fmt.Sprintf("%016x", mem.GetMemberId())
		}
	}
	var rs *reconcilerv1.GetStatusResponse
	rs, s.ReconcilerNote = a.activeReconciler(ctx)
	if rs != nil {
		s.ActiveReconciler = rs.GetName()
		s.ReconcilerLastResult = enumName(rs.GetLastResult().String(), "PASS_RESULT_")
		s.ReconcilerLastDetail = rs.GetLastResultDetail()
		s.ReconcilerLastRun = timestamp(rs.GetLastPass())
		if rs.GetPaused() {
			s.ReconcilerPaused = orDash(rs.GetPauseReason())
		}
	}
	return s, nil
}

// activeReconciler asks each reconciler replica which one is active, and
// returns its status; the note says why there is none.
func (a *app) activeReconciler(ctx context.Context) (*reconcilerv1.GetStatusResponse, string) {
	addrs, _, err := a.setting(setReconcilers, a.reconcilers)
	if err != nil {
		return nil, "unknown: " + err.Error()
	}
	if addrs == "" {
		return nil, "unknown: pass --reconciler or set " + envReconcilers
	}
	var errs []string
	standby := ""
	for _, addr := range strings.Split(addrs, ",") {
		cc, err := a.dial(addr, pki.KindReconciler)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		st, err := reconcilerv1.NewReconcilerClient(cc).GetStatus(cctx, &reconcilerv1.GetStatusRequest{})
		cancel()
		if err != nil {
			errs = append(errs, addr+": "+err.Error())
			continue
		}
		if st.GetRole() == reconcilerv1.Role_ROLE_ACTIVE {
			return st, ""
		}
		standby = st.GetName()
	}
	switch {
	case len(errs) > 0:
		return nil, "unknown: " + strings.Join(errs, "; ")
	case standby != "":
		return nil, "none active (" + standby + " is standby)"
	}
	return nil, "none active"
}

func statusTable(w io.Writer, s *clusterStatus, now time.Time) {
	row(w, "CLUSTER:", s.Cluster)
	row(w, "CURATOR LEADER:", fmt.Sprintf("%s (term %d)", orDash(s.CuratorLeader), s.CuratorTerm))
	etcdLeader := "none"
	if s.EtcdLeaderMember != "" {
		etcdLeader = fmt.Sprintf("%s (member %s)", orDash(s.EtcdLeader), s.EtcdLeaderMember)
	}
	row(w, "ETCD LEADER:", etcdLeader)
	row(w, "VOTERS:", fmt.Sprintf("%d, %d healthy, quorum %d: %s", len(s.Voters), s.HealthyVoters, s.Quorum, orDash(strings.Join(s.Voters, " "))))
	var learners []string
	for _, l := range s.Learners {
		learners = append(learners, fmt.Sprintf("%s (lag %d)", l, s.LearnerLag[l]))
	}
	row(w, "LEARNERS:", strings.TrimSpace(fmt.Sprintf("%d %s", len(s.Learners), strings.Join(learners, " "))))
	tolerance := fmt.Sprintf("%d", s.FailureTolerance)
	if s.FailureTolerance < 0 {
		tolerance += " (no quorum: no membership change is possible)"
	}
	row(w, "FAILURE TOLERANCE:", tolerance)
	row(w, "MEMBERSHIP EPOCH:", fmt.Sprintf("%d", s.MembershipEpoch))
	if len(s.RoleWithoutMember) > 0 {
		row(w, "ROLE WITHOUT MEMBER:", strings.Join(s.RoleWithoutMember, " "))
	}
	row(w, "PENDING CHANGE:", pendingLine(s.PendingChange, now))
	active := s.ActiveReconciler
	if active == "" {
		active = s.ReconcilerNote
	} else if s.ReconcilerLastResult != "" {
		active += fmt.Sprintf(" (last pass %s at %s)", s.ReconcilerLastResult, s.ReconcilerLastRun)
	}
	row(w, "ACTIVE RECONCILER:", active)
	if s.ReconcilerLastDetail != "" && s.ReconcilerLastResult != "CONVERGED" {
		row(w, "RECONCILER SAYS:", oneLine(s.ReconcilerLastDetail))
	}
	paused := "no"
	if s.Paused {
		paused = "yes: " + orDash(s.PauseReason)
	}
	if s.ReconcilerPaused != "" {
		paused += "; the active reconciler is paused (Reconciler/Pause): " + s.ReconcilerPaused
	}
	row(w, "PAUSED:", paused)
	row(w, "CONTROL PLANE SIZE:", fmt.Sprintf("%d (config revision %d)", s.ControlPlaneSize, s.ConfigRevision))
	var states []string
	for _, k := range slices.Sorted(maps.Keys(s.NodesByState)) {
		states = append(states, fmt.Sprintf("%s=%d", strings.TrimPrefix(k, "NODE_STATE_"), s.NodesByState[k]))
	}
	row(w, "NODES:", orDash(strings.Join(states, " ")))
	if len(s.Alarms) > 0 {
		row(w, "ETCD ALARMS:", strings.Join(s.Alarms, "; "))
	}
	row(w, "LAST SNAPSHOT:", orDash(s.LastSnapshot))
}

// pendingLine is the pending membership change in one line.
func pendingLine(p *pendingChange, now time.Time) string {
	if p == nil {
		return "none"
	}
	what := p.Operation + " " + orDash(p.NodeID)
	if p.MemberID != "" {
		what += " (member " + p.MemberID + ")"
	}
	since := p.Since
	if t, err := time.Parse(time.RFC3339, p.Since); err == nil {
		since += ", " + humanDuration(now.Sub(t)) + " ago"
	}
	return fmt.Sprintf("%s by %s since %s; fence %s; change %s, recorded by %s", what, orDash(p.Actor), since, orDash(strings.Join(p.Fence, " ")), p.ID, orDash(p.RecordedBy))
}
