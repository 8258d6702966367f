package local

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/snapshots"
)

// RecoverOptions say how to recover a cluster that lost its quorum.
type RecoverOptions struct {
	// Confirm is the operator's consent: the node whose data becomes the
	// cluster (the survivor Recover chose, or the node to restore the
	// snapshot on). Without it, Recover only says what it would do.
	Confirm string
	// Snapshot is a snapshot file (Management/GetSnapshot's) to restore
	// instead of a survivor's data.
	Snapshot string
	// Reason goes into the report and the audit log.
	Reason string
	// Wait is how long to wait for the control plane to grow back to its
	// size (0: do not wait).
	Wait time.Duration
	// Settle is how long the survivors may take to notice the loss (no
	// leader anywhere) before a reachable leader means "refused".
	Settle time.Duration
	// Out, if set, gets the progress instead of the cluster's output.
	Out io.Writer
}

// Survivor is one node's consensus process, as the recovery found it.
type Survivor struct {
	Node      string `json:"node"`
	Answered  bool   `json:"answered"`
	Error     string `json:"error,omitempty"`
	State     string `json:"state,omitempty"`
	MemberID  string `json:"member_id,omitempty"`
	ClusterID string `json:"cluster_id,omitempty"`
	LeaderID  string `json:"leader_id,omitempty"`
	RaftIndex uint64 `json:"raft_index,omitempty"`
	RaftTerm  uint64 `json:"raft_term,omitempty"`

	member uint64
	leader uint64
	code   codes.Code
}

// RecoveryReport is what curia-local recover did, written to
// <state>/recovery-<time>.json.
type RecoveryReport struct {
	StartedAt time.Time  `json:"started_at"`
	Survey    []Survivor `json:"survey"`
	Chosen    string     `json:"chosen"`
	Why       string     `json:"why"`
	// Consensus is the consensus process's own report (as stored in etcd).
	Consensus json.RawMessage `json:"consensus,omitempty"`
	// LostRevisions says what may be lost, against the other survivors and
	// the latest snapshot.
	LostRevisions []string  `json:"lost_revisions"`
	RecoveredAt   time.Time `json:"recovered_at"`
	Readded       []string  `json:"readded,omitempty"`
	Voters        int       `json:"voters,omitempty"`
	VotersAt      time.Time `json:"voters_at,omitzero"`
	VotersAfter   string    `json:"voters_after,omitempty"`
	ReportFile    string    `json:"-"`
}

// ErrNoConsent: Recover said what it would do and changed nothing.
var ErrNoConsent = errors.New("nothing changed: run again with --confirm to proceed")

// Recover rebuilds a cluster whose majority of voters is gone for good, from
// the most up-to-date survivor (or a snapshot), through the consensus
// processes' Recover (RestoreSnapshot) call, then waits while the reconciler
// and autopilot grow the control plane back. It refuses when a quorum is
// reachable: it goes on only once, for Settle on end, no curator answers
// for a cluster with a leader and no member follows one, and refuses when
// that has not happened within twice Settle.
func (c *Cluster) Recover(ctx context.Context, opts RecoverOptions) (*RecoveryReport, error) {
	out := cmp.Or[io.Writer](opts.Out, c.cfg.Out)
	rep := &RecoveryReport{StartedAt: time.Now().UTC()}
	creds, err := rpc.LoadCredentials(c.cfg.Cluster, c.AdminFiles())
	if err != nil {
		return nil, err
	}
	conns := map[string]*grpc.ClientConn{}
	defer func() {
		for _, cc := range conns {
			cc.Close()
		}
	}()
	for _, n := range c.Nodes {
		cc, err := rpc.Dial(n.ConsensusAPI(), rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindConsensus}})
		if err != nil {
			return nil, err
		}
		conns[n.Name] = cc
	}
	begun := time.Now()
	fmt.Fprintf(out, "curia-local: recovering only once no quorum is seen for %v on end (refused if one is still seen after %v)\n", opts.Settle, 2*opts.Settle)
	last := ""
	err = awaitLoss(ctx, opts.Settle, realClock, func(ctx context.Context) string {
		rep.Survey = survey(ctx, c.Nodes, conns)
		seen, curators := c.quorumSeen(ctx, creds, rep.Survey)
		// Say what changed, so a refusal (or a recovery) can be traced
		// to what was seen when.
		if now := settleLine(seen, curators, rep.Survey); now != last {
			fmt.Fprintf(out, "  +%.1fs %s\n", time.Since(begun).Seconds(), now)
			last = now
		}
		return seen
	})
	if err != nil {
		return nil, err
	}
	for _, s := range rep.Survey {
		fmt.Fprintf(out, "  %-8s %s\n", s.Node, s.describe())
	}

	if opts.Snapshot != "" {
		if opts.Confirm == "" {
			fmt.Fprintf(out, "curia-local: would restore snapshot %s as a new cluster on the node you name\n", opts.Snapshot)
			return rep, fmt.Errorf("%w: name the node to restore on (--confirm node-1)", ErrNoConsent)
		}
		rep.Chosen = opts.Confirm
		rep.Why = "the operator named it to restore snapshot " + filepath.Base(opts.Snapshot) + " on"
	} else {
		best, why, err := chooseSurvivor(rep.Survey)
		if err != nil {
			return nil, err
		}
		rep.Chosen, rep.Why = best.Node, why
		fmt.Fprintf(out, "curia-local: the most up-to-date survivor is %s: %s\n", best.Node, why)
		if opts.Confirm != best.Node {
			return rep, fmt.Errorf("%w: to make %s's data the cluster (members of the lost majority are dropped, and may hold writes it lacks), run again with --confirm %s", ErrNoConsent, best.Node, best.Node)
		}
	}
	cc, ok := conns[rep.Chosen]
	if !ok {
		return nil, fmt.Errorf("no node %s in this cluster", rep.Chosen)
	}
	reason := cmp.Or(opts.Reason, "curia-local recover: a majority of voters is lost")
	var cr *consensusv1.RecoveryReport
	if opts.Snapshot != "" {
		cr, err = restoreSnapshot(ctx, consensusv1.NewConsensusClient(cc), c.nodeID(rep.Chosen), opts.Snapshot, reason)
	} else {
		var resp *consensusv1.RecoverResponse
		i := slices.IndexFunc(rep.Survey, func(s Survivor) bool { return s.Node == rep.Chosen })
		resp, err = consensusv1.NewConsensusClient(cc).Recover(ctx, &consensusv1.RecoverRequest{MemberId: rep.Survey[i].member, Reason: reason})
		cr = resp.GetReport()
	}
	if err != nil {
		return nil, fmt.Errorf("recover on %s: %w", rep.Chosen, err)
	}
	rep.RecoveredAt = time.Now().UTC()
	rep.Consensus, _ = protojson.Marshal(cr)
	rep.LostRevisions = c.lostRevisions(rep, cr)
	fmt.Fprintf(out, "curia-local: %s is cluster %s (member %s) from revision %d, revisions moved to %d; old data kept in %s\n",
		rep.Chosen, types.ID(cr.GetNewClusterId()), types.ID(cr.GetNewMemberId()), cr.GetRevision(), cr.GetNewRevision(), cmp.Or(cr.GetKeptDataDir(), "(none)"))
	for _, l := range rep.LostRevisions {
		fmt.Fprintln(out, "  "+l)
	}
	if opts.Wait > 0 {
		if err := c.waitRegrown(ctx, out, creds, rep, opts.Wait); err != nil {
			_ = c.writeRecoveryReport(out, rep)
			return rep, err
		}
	}
	return rep, c.writeRecoveryReport(out, rep)
}

// clock is time for awaitLoss (a test's is driven by its looks).
type clock struct {
	now   func() time.Time
	sleep func(context.Context, time.Duration) error
}

var realClock = clock{now: time.Now, sleep: func(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}}

// lookInterval is the pause between two looks for a quorum.
const lookInterval = 500 * time.Millisecond

// awaitLoss looks for a quorum (look says how one shows, or "") until a
// loss is established: a look that began settle or more after the last
// quorum seen (or after the first look began) sees none, and neither did
// any look in between. A loss is a quorum nobody reaches for settle on
// end; right after a loss a survivor may still name its old leader for an
// election timeout or so, and right after a partition the majority may
// still be electing, so one look is not enough either way; and a look is
// taken when it begins, not when it ends: a look that waits seconds for a
// curator says nothing about those seconds. It refuses once a quorum is
// still seen after twice settle.
func awaitLoss(ctx context.Context, settle time.Duration, clk clock, look func(context.Context) string) error {
	begun := clk.now()
	quiet := begun
	for {
		at := clk.now()
		seen := look(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		switch {
		case seen == "" && at.Sub(quiet) >= settle:
			return nil
		case seen != "" && clk.now().Sub(begun) > 2*settle:
			return fmt.Errorf("refused: %s: a quorum is reachable, so this is a partition or a slow election, not a loss; recovery would fork the cluster", seen)
		case seen != "":
			quiet = clk.now()
		}
		if err := clk.sleep(ctx, lookInterval); err != nil {
			return err
		}
	}
}

// quorumSeen says how a quorum shows from here, or "": a curator answers
// for a cluster with a leader (the curators read the member list with a
// quorum), or a surveyed member follows a leader. It also says what the
// curators answered.
func (c *Cluster) quorumSeen(ctx context.Context, creds *rpc.Credentials, all []Survivor) (seen, curators string) {
	if i := slices.IndexFunc(all, func(s Survivor) bool { return s.leader != 0 }); i >= 0 {
		s := all[i]
		return fmt.Sprintf("%s's member %s follows leader %s (term %d)", s.Node, s.MemberID, s.LeaderID, s.RaftTerm), "not asked"
	}
	cc, err := rpc.DialAny(c.Curators, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		return "", err.Error()
	}
	defer cc.Close()
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := curatorv1.NewManagementClient(cc).GetConsensusStatus(cctx, &curatorv1.GetConsensusStatusRequest{})
	if err != nil {
		// No curator reads the cluster: no quorum seen from here.
		return "", status.Code(err).String()
	}
	for _, m := range st.GetMembers() {
		if m.GetLeader() {
			return fmt.Sprintf("the curators answer for a cluster of %d voters led by %s's member %s", st.GetVoters(), c.nodeName(m.GetNodeId()), types.ID(m.GetMemberId())), "answered"
		}
	}
	return "", fmt.Sprintf("answered for %d members, none the leader", len(st.GetMembers()))
}

// settleLine is one line on what a look for a quorum saw.
func settleLine(seen, curators string, all []Survivor) string {
	var ns []string
	for _, s := range all {
		switch {
		case !s.Answered:
			ns = append(ns, s.Node+": no answer ("+s.code.String()+")")
		case s.leader != 0:
			ns = append(ns, fmt.Sprintf("%s: %s, leader %s", s.Node, s.State, s.LeaderID))
		default:
			ns = append(ns, fmt.Sprintf("%s: %s, no leader", s.Node, s.State))
		}
	}
	return cmp.Or(seen, "no quorum seen") + " [" + strings.Join(ns, "; ") + "; curators: " + curators + "]"
}

// survey asks every node's consensus process for its status.
func survey(ctx context.Context, ns []Node, conns map[string]*grpc.ClientConn) []Survivor {
	out := make([]Survivor, len(ns))
	done := make(chan struct{})
	for i, n := range ns {
		go func() {
			defer func() { done <- struct{}{} }()
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			s := Survivor{Node: n.Name}
			st, err := consensusv1.NewConsensusClient(conns[n.Name]).Status(sctx, &consensusv1.StatusRequest{})
			if err != nil {
				s.Error, s.code = err.Error(), status.Code(err)
			} else {
				s.Answered = true
				s.State = strings.ToLower(strings.TrimPrefix(st.GetState().String(), "LIFECYCLE_STATE_"))
				s.member, s.leader = st.GetMemberId(), st.GetLeaderId()
				s.RaftIndex, s.RaftTerm = st.GetRaftIndex(), st.GetRaftTerm()
				if s.member != 0 {
					s.MemberID = types.ID(s.member).String()
				}
				if s.leader != 0 {
					s.LeaderID = types.ID(s.leader).String()
				}
				if st.GetClusterId() != 0 {
					s.ClusterID = types.ID(st.GetClusterId()).String()
				}
			}
			out[i] = s
		}()
	}
	for range ns {
		<-done
	}
	return out
}

func (s Survivor) describe() string {
	switch {
	case !s.Answered:
		return "no answer: " + s.Error
	case s.member == 0 || s.RaftIndex == 0:
		return s.State + ", no member data to recover from"
	}
	return fmt.Sprintf("%s, member %s, applied raft index %d, term %d", s.State, s.MemberID, s.RaftIndex, s.RaftTerm)
}

// chooseSurvivor picks the member that applied the most (raft index, then
// term): the recovery restores what a member applied, so the highest
// applied index loses the least.
func chooseSurvivor(all []Survivor) (Survivor, string, error) {
	var cands []Survivor
	var silent []string
	for _, s := range all {
		switch {
		case !s.Answered:
			silent = append(silent, s.Node)
		case s.member != 0 && s.RaftIndex > 0:
			cands = append(cands, s)
		}
	}
	if len(cands) == 0 {
		return Survivor{}, "", fmt.Errorf("no surviving member holds data that runs (no answer from %v): restore a snapshot (--snapshot FILE --confirm NODE)", silent)
	}
	slices.SortStableFunc(cands, func(a, b Survivor) int {
		return cmp.Or(cmp.Compare(b.RaftIndex, a.RaftIndex), cmp.Compare(b.RaftTerm, a.RaftTerm), cmp.Compare(a.Node, b.Node))
	})
	best := cands[0]
	why := fmt.Sprintf("it applied raft index %d (term %d), the highest", best.RaftIndex, best.RaftTerm)
	for _, o := range cands[1:] {
		why += fmt.Sprintf("; %s applied %d (term %d)", o.Node, o.RaftIndex, o.RaftTerm)
	}
	if len(silent) > 0 {
		why += fmt.Sprintf("; no answer from %s, whose data (if any) is not compared", strings.Join(silent, ", "))
	}
	return best, why, nil
}

// lostRevisions compares the recovered data with the other survivors and
// the latest snapshot in <state>/snapshots.
func (c *Cluster) lostRevisions(rep *RecoveryReport, cr *consensusv1.RecoveryReport) []string {
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
				out = append(out, fmt.Sprintf("member %s (%s) was lost: what it alone had committed is unknown (at most the writes the lost majority acknowledged after this member last applied)", types.ID(d.GetId()), c.nodeName(d.GetNodeId())))
			}
		}
	}
	if cr.GetAppliedIndex() == 0 {
		out = append(out, fmt.Sprintf("restored %s at revision %d: every write after it is lost", cr.GetSource(), cr.GetRevision()))
		return out
	}
	list, err := snapshots.Dir(c.path(snapshotsDir)).List()
	switch {
	case err != nil || len(list) == 0:
		out = append(out, "no snapshot in "+c.path(snapshotsDir)+" to compare with")
	case list[0].Revision > cr.GetRevision():
		out = append(out, fmt.Sprintf("the latest snapshot %s is at revision %d, past the recovered data's %d: its %d newer revisions are not in the cluster; restore it instead (--snapshot) if they matter", list[0].Name, list[0].Revision, cr.GetRevision(), list[0].Revision-cr.GetRevision()))
	default:
		out = append(out, fmt.Sprintf("the latest snapshot %s is at revision %d, not past the recovered data's %d: it holds nothing newer", list[0].Name, list[0].Revision, cr.GetRevision()))
	}
	return out
}

// restoreSnapshot streams the file to the node's RestoreSnapshot.
func restoreSnapshot(ctx context.Context, cli consensusv1.ConsensusClient, nodeID, path, reason string) (*consensusv1.RecoveryReport, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	stream, err := cli.RestoreSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	name := strings.TrimSuffix(filepath.Base(path), ".db")
	if err := stream.Send(&consensusv1.RestoreSnapshotRequest{Msg: &consensusv1.RestoreSnapshotRequest_Header{Header: &consensusv1.RestoreSnapshotHeader{
		NodeId: nodeID, Reason: reason, SnapshotName: name,
	}}}); err != nil {
		return nil, err
	}
	buf := make([]byte, 1<<20)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if err := stream.Send(&consensusv1.RestoreSnapshotRequest{Msg: &consensusv1.RestoreSnapshotRequest_Chunk{Chunk: buf[:n]}}); err != nil {
				break // the server's answer says why
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return resp.GetReport(), nil
}

// waitRegrown waits until roles and membership agree with as many voters
// as the cluster configuration's control_plane_size (else the
// control-plane node count), and notes which nodes came back.
func (c *Cluster) waitRegrown(ctx context.Context, out io.Writer, creds *rpc.Credentials, rep *RecoveryReport, wait time.Duration) error {
	cc, err := rpc.DialAny(c.Curators, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		return err
	}
	defer cc.Close()
	m := curatorv1.NewManagementClient(cc)
	want := c.cfg.ControlPlane
	fmt.Fprintf(out, "curia-local: waiting (up to %v) while the reconciler and autopilot grow the control plane back\n", wait)
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
		case !agree(st) || int(st.GetVoters()) != want:
			last = fmt.Errorf("%d voters of %d, agreeing: %v", st.GetVoters(), want, agree(st))
		default:
			rep.Voters, rep.VotersAt = want, time.Now().UTC()
			var names []string
			for _, mem := range st.GetMembers() {
				name := c.nodeName(mem.GetNodeId())
				names = append(names, name)
				if name != rep.Chosen {
					rep.Readded = append(rep.Readded, name)
				}
			}
			slices.Sort(rep.Readded)
			slices.Sort(names)
			rep.VotersAfter = rep.VotersAt.Sub(rep.StartedAt).Round(100 * time.Millisecond).String()
			fmt.Fprintf(out, "curia-local: %d voters (%s) %s after the recovery began; re-added: %s\n", want, strings.Join(names, ", "), rep.VotersAfter, strings.Join(rep.Readded, ", "))
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

func (c *Cluster) writeRecoveryReport(out io.Writer, rep *RecoveryReport) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	rep.ReportFile = c.path("recovery-" + rep.StartedAt.Format("20060102T150405Z") + ".json")
	if err := os.WriteFile(rep.ReportFile, append(b, '\n'), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(out, "curia-local: report in %s\n", rep.ReportFile)
	return nil
}

// nodeID and nodeName map between the layout's names and node ids.
func (c *Cluster) nodeID(name string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.Nodes {
		if n.Name == name {
			return n.ID
		}
	}
	return ""
}

func (c *Cluster) nodeName(id string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.Nodes {
		if n.ID == id {
			return n.Name
		}
	}
	return id
}
