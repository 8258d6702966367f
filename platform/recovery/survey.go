package recovery

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// Survivor is one node's consensus process, as the recovery found it.
type Survivor struct {
	Node      string `json:"node"`
	NodeID    string `json:"node_id,omitempty"`
	Answered  bool   `json:"answered"`
	Error     string `json:"error,omitempty"`
	State     string `json:"state,omitempty"`
	MemberID  string `json:"member_id,omitempty"`
	ClusterID string `json:"cluster_id,omitempty"`
	LeaderID  string `json:"leader_id,omitempty"`
	RaftIndex uint64 `json:"raft_index,omitempty"`
	RaftTerm  uint64 `json:"raft_term,omitempty"`

	addr   string
	member uint64
	leader uint64
	code   codes.Code
}

// Clock is time for AwaitLoss (a test's is driven by its looks).
type Clock struct {
	Now   func() time.Time
	Sleep func(context.Context, time.Duration) error
}

// RealClock is the wall clock.
var RealClock = Clock{Now: time.Now, Sleep: func(ctx context.Context, d time.Duration) error {
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

// AwaitLoss looks for a quorum (look says how one shows, or "") until a
// loss is established: a look that began settle or more after the last
// quorum seen (or after the first look began) sees none, and neither did
// any look in between. A loss is a quorum nobody reaches for settle on
// end; right after a loss a survivor may still name its old leader for an
// election timeout or so, and right after a partition the majority may
// still be electing, so one look is not enough either way; and a look is
// taken when it begins, not when it ends: a look that waits seconds for a
// curator says nothing about those seconds. It refuses (ErrQuorumReachable)
// once a quorum is still seen after twice settle.
func AwaitLoss(ctx context.Context, settle time.Duration, clk Clock, look func(context.Context) string) error {
	begun := clk.Now()
	quiet := begun
	for {
		at := clk.Now()
		seen := look(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		switch {
		case seen == "" && at.Sub(quiet) >= settle:
			return nil
		case seen != "" && clk.Now().Sub(begun) > 2*settle:
			return fmt.Errorf("%w: %s, so this is a partition or a slow election, not a loss; recovery would fork the cluster. Find out why the nodes without a leader are cut off, or wait for the election; recover only once a majority of the voters is gone for good", ErrQuorumReachable, seen)
		case seen != "":
			quiet = clk.Now()
		}
		if err := clk.Sleep(ctx, lookInterval); err != nil {
			return err
		}
	}
}

// quorumSeen says how a quorum shows from here, or "": a curator answers
// for a cluster with a leader (the curators read the member list with a
// quorum), or a surveyed member follows a leader. It also says what the
// curators answered.
func (r *recovery) quorumSeen(ctx context.Context, all []Survivor) (seen, curators string) {
	if i := slices.IndexFunc(all, func(s Survivor) bool { return s.leader != 0 }); i >= 0 {
		s := all[i]
		return fmt.Sprintf("%s's member %s follows leader %s (term %d)", s.Node, s.MemberID, s.LeaderID, s.RaftTerm), "not asked"
	}
	if len(r.c.Curators) == 0 {
		return "", "none named"
	}
	cc, err := rpc.DialAny(r.c.Curators, rpc.ClientConfig{Credentials: r.c.Credentials, ServerKinds: []pki.Kind{pki.KindCurator}})
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
			return fmt.Sprintf("the curators answer for a cluster of %d voters led by %s's member %s", st.GetVoters(), r.nodeName(m.GetNodeId()), types.ID(m.GetMemberId())), "answered"
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

// survey asks every node's consensus process for its status. A node is
// named as its Target names it, else by the node id its process reports
// (remembered for later looks), else by its address.
func (r *recovery) survey(ctx context.Context) []Survivor {
	out := make([]Survivor, len(r.c.Nodes))
	done := make(chan struct{})
	for i, n := range r.c.Nodes {
		go func() {
			defer func() { done <- struct{}{} }()
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			s := Survivor{Node: n.Name, NodeID: n.NodeID, addr: n.Addr}
			st, err := consensusv1.NewConsensusClient(r.conns[n.Addr]).Status(sctx, &consensusv1.StatusRequest{})
			if err != nil {
				s.Error, s.code = err.Error(), status.Code(err)
			} else {
				s.Answered = true
				s.NodeID = cmp.Or(st.GetNodeId(), s.NodeID)
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
	for range r.c.Nodes {
		<-done
	}
	for i := range out {
		s := &out[i]
		if s.Node == "" && s.NodeID != "" {
			r.c.Nodes[i].Name = s.NodeID
			s.Node = s.NodeID
		}
		s.Node = cmp.Or(s.Node, s.addr)
		if s.NodeID != "" {
			r.names[s.NodeID] = s.Node
		}
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
	if len(cands) == 0 && len(silent) == len(all) {
		return Survivor{}, "", fmt.Errorf("%w: no consensus process answered (%v): check the addresses (--consensus) and that they are reachable from here; then restore a snapshot (--snapshot FILE --confirm NODE) if no node's data survived", ErrNoSurvivor, silent)
	}
	if len(cands) == 0 {
		return Survivor{}, "", fmt.Errorf("%w (no answer from %v): restore a snapshot (--snapshot FILE --confirm NODE), or bring a node with member data back", ErrNoSurvivor, silent)
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
