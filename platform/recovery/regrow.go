package recovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// lostRevisions compares the recovered data with the other survivors and
// the latest snapshot (Cluster.Snapshots).
func (r *recovery) lostRevisions(ctx context.Context, rep *Report, cr *consensusv1.RecoveryReport) []string {
	var out []string
	if cr.GetAppliedIndex() > 0 {
		ahead := false
		for _, s := range rep.Survey {
			if s.Node != rep.Chosen && s.Answered && s.RaftIndex > cr.GetAppliedIndex() {
				ahead = true
				out = append(out, fmt.Sprintf("%s had applied %d raft entries more: their writes are lost", s.Node, s.RaftIndex-cr.GetAppliedIndex()))
			}
		}
		if !ahead {
			out = append(out, "no surviving member that answered had applied more than the recovered data")
		}
		for _, d := range cr.GetDroppedMembers() {
			if i := slices.IndexFunc(rep.Survey, func(s Survivor) bool { return s.member == d.GetId() && s.Answered }); i < 0 {
				out = append(out, fmt.Sprintf("member %s (%s) was lost: what it alone had committed is unknown (at most the writes the lost majority acknowledged after this member last applied)", types.ID(d.GetId()), r.nodeName(d.GetNodeId())))
			}
		}
	}
	if cr.GetAppliedIndex() == 0 {
		out = append(out, fmt.Sprintf("restored %s at revision %d: every write after it is lost", cr.GetSource(), cr.GetRevision()))
		return out
	}
	if r.c.Snapshots == nil {
		return append(out, "no snapshot list to compare with")
	}
	list, where, err := r.c.Snapshots(ctx)
	switch {
	case err != nil || len(list) == 0:
		out = append(out, "no snapshot "+where+" to compare with")
	case list[0].Revision > cr.GetRevision():
		out = append(out, fmt.Sprintf("the latest snapshot %s is at revision %d, past the recovered data's %d: its %d newer revisions are not in the cluster; restore it instead (--snapshot) if they matter", list[0].Name, list[0].Revision, cr.GetRevision(), list[0].Revision-cr.GetRevision()))
	default:
		out = append(out, fmt.Sprintf("the latest snapshot %s is at revision %d, not past the recovered data's %d: it holds nothing newer", list[0].Name, list[0].Revision, cr.GetRevision()))
	}
	return out
}

// waitRegrown waits until roles and membership agree with as many voters
// as the cluster configuration's control_plane_size (else
// Cluster.ControlPlane, else the number of nodes surveyed), and notes which
// nodes came back.
func (r *recovery) waitRegrown(ctx context.Context, rep *Report, wait time.Duration) error {
	if len(r.c.Curators) == 0 {
		return errors.New("no curator address to follow the regrowth with")
	}
	cc, err := rpc.DialAny(r.c.Curators, rpc.ClientConfig{Credentials: r.c.Credentials, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		return err
	}
	defer cc.Close()
	m := curatorv1.NewManagementClient(cc)
	want := r.c.ControlPlane
	if want == 0 {
		want = len(r.c.Nodes)
	}
	r.printf("waiting (up to %v) while the reconciler and autopilot grow the control plane back\n", wait)
	deadline := time.Now().Add(wait)
	last := errors.New("not asked yet")
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if cfg, err := m.GetClusterConfig(cctx, &curatorv1.GetClusterConfigRequest{}); err == nil && cfg.GetConfig().GetControlPlaneSize() > 0 {
			want = int(cfg.GetConfig().GetControlPlaneSize())
		}
		st, err := m.GetConsensusStatus(cctx, &curatorv1.GetConsensusStatusRequest{})
		cancel()
		switch {
		case err != nil:
			last = err
		case !Agree(st) || int(st.GetVoters()) != want:
			last = fmt.Errorf("%d voters of %d, agreeing: %v", st.GetVoters(), want, Agree(st))
		default:
			rep.Voters, rep.VotersAt = want, time.Now().UTC()
			var names []string
			for _, mem := range st.GetMembers() {
				name := r.nodeName(mem.GetNodeId())
				names = append(names, name)
				if name != rep.Chosen {
					rep.Readded = append(rep.Readded, name)
				}
			}
			slices.Sort(rep.Readded)
			slices.Sort(names)
			rep.VotersAfter = rep.VotersAt.Sub(rep.StartedAt).Round(100 * time.Millisecond).String()
			r.printf("%d voters (%s) %s after the recovery began; re-added: %s\n", want, strings.Join(names, ", "), rep.VotersAfter, strings.Join(rep.Readded, ", "))
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return fmt.Errorf("the control plane did not grow back to %d voters within %v: %w", want, wait, last)
}

// Agree says whether roles and membership agree: every member is a voter
// whose node exists and carries ConsensusMember, one leads, and no node
// has the role without a member.
func Agree(st *curatorv1.GetConsensusStatusResponse) bool {
	leader := false
	for _, m := range st.GetMembers() {
		if !m.GetNodeExists() || !m.GetHasRole() || m.GetLearner() {
			return false
		}
		leader = leader || m.GetLeader()
	}
	return leader && len(st.GetRoleWithoutMember()) == 0
}
