package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

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
	// PendingChange: the Management API does not expose the pending
	// membership change (Consensus/ListMembers does, on the nodes).
	PendingChange    *string          `json:"pendingChange"`
	ActiveReconciler string           `json:"activeReconciler"`
	ReconcilerNote   string           `json:"reconcilerNote,omitempty"`
	Paused           bool             `json:"paused"`
	PauseReason      string           `json:"pauseReason,omitempty"`
	ControlPlaneSize uint32           `json:"controlPlaneSize"`
	ConfigRevision   int64            `json:"configRevision"`
	NodesByState     map[string]int64 `json:"nodesByState"`
	Alarms           []string         `json:"alarms,omitempty"`
	LastSnapshot     string           `json:"lastSnapshot,omitempty"`
}

func (a *app) statusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the cluster on one screen: leaders, voters, failure tolerance, autopilot",
		Long: `Show the cluster on one screen: the curator leader, the etcd leader, the
voters and learners, how many more voter failures the cluster survives,
the active reconciler and whether autopilot is paused.

From Management/GetClusterInfo, GetConsensusStatus and GetClusterConfig,
and each reconciler's GetStatus (--reconciler, $CURIA_RECONCILERS) for the
active one. The pending membership change is not shown: the Management
API does not expose it.`,
		Example: `  curiactl status
  curiactl status -o json | jq .failureTolerance`,
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := a.status(cmd.Context())
			if err != nil {
				return err
			}
			switch a.output {
			case "json":
				b, err := json.MarshalIndent(s, "", "  ")
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(a.stdout, "%s\n", b)
				return err
			case "yaml":
				b, err := yaml.Marshal(s)
				if err != nil {
					return err
				}
				_, err = a.stdout.Write(b)
				return err
			}
			tw := newTable(a.stdout)
			statusTable(tw, s)
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
	for _, mem := range cs.GetMembers() {
		id := mem.GetNodeId()
		if id == "" {
			id = fmt.Sprintf("member %016x", mem.GetMemberId())
		}
		if mem.GetLearner() {
			s.Learners = append(s.Learners, id)
		} else {
			s.Voters = append(s.Voters, id)
		}
		if mem.GetLeader() {
			s.EtcdLeader, s.EtcdLeaderMember = mem.GetNodeId(), fmt.Sprintf("%016x", mem.GetMemberId())
		}
	}
	s.ActiveReconciler, s.ReconcilerNote = a.activeReconciler(ctx)
	return s, nil
}

// activeReconciler asks each reconciler replica which one is active; the
// note says why none is named.
func (a *app) activeReconciler(ctx context.Context) (string, string) {
	addrs, _ := a.setting(a.reconcilers, envReconcilers)
	if addrs == "" {
		return "", "unknown: pass --reconciler or set " + envReconcilers
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
			return st.GetName(), ""
		}
		standby = st.GetName()
	}
	switch {
	case len(errs) > 0:
		return "", "unknown: " + strings.Join(errs, "; ")
	case standby != "":
		return "", "none active (" + standby + " is standby)"
	}
	return "", "none active"
}

func statusTable(w io.Writer, s *clusterStatus) {
	row(w, "CLUSTER:", s.Cluster)
	row(w, "CURATOR LEADER:", fmt.Sprintf("%s (term %d)", orDash(s.CuratorLeader), s.CuratorTerm))
	etcdLeader := "none"
	if s.EtcdLeaderMember != "" {
		etcdLeader = fmt.Sprintf("%s (member %s)", orDash(s.EtcdLeader), s.EtcdLeaderMember)
	}
	row(w, "ETCD LEADER:", etcdLeader)
	row(w, "VOTERS:", fmt.Sprintf("%d, %d healthy, quorum %d: %s", len(s.Voters), s.HealthyVoters, s.Quorum, orDash(strings.Join(s.Voters, " "))))
	row(w, "LEARNERS:", strings.TrimSpace(fmt.Sprintf("%d %s", len(s.Learners), strings.Join(s.Learners, " "))))
	tolerance := fmt.Sprintf("%d", s.FailureTolerance)
	if s.FailureTolerance < 0 {
		tolerance += " (no quorum: no membership change is possible)"
	}
	row(w, "FAILURE TOLERANCE:", tolerance)
	row(w, "MEMBERSHIP EPOCH:", fmt.Sprintf("%d", s.MembershipEpoch))
	if len(s.RoleWithoutMember) > 0 {
		row(w, "ROLE WITHOUT MEMBER:", strings.Join(s.RoleWithoutMember, " "))
	}
	row(w, "PENDING CHANGE:", "not available (the Management API does not expose it)")
	active := s.ActiveReconciler
	if active == "" {
		active = s.ReconcilerNote
	}
	row(w, "ACTIVE RECONCILER:", active)
	paused := "no"
	if s.Paused {
		paused = "yes: " + orDash(s.PauseReason)
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
