package curator

import (
	"context"
	"slices"
	"sync"
	"time"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// memberStatusTimeout bounds how long GetConsensusStatus waits for one
// member's Status: a member that does not answer in time is shown without
// a raft index.
const memberStatusTimeout = 2 * time.Second

func (x *managementServer) GetConsensusStatus(ctx context.Context, _ *curatorv1.GetConsensusStatusRequest) (*curatorv1.GetConsensusStatusResponse, error) {
	resp, err := x.s.consensusStatus(ctx)
	return resp, err
}

// consensusStatus maps etcd members to nodes, as the reconciler would see
// them: the member list (with its membership epoch) first, then the nodes.
// Raft indexes come from the members' own consensus services, found at the
// configured addresses and at the consensus_api their nodes report; a
// member none of them speaks for has raft_index 0 and lag 0.
func (s *Service) consensusStatus(ctx context.Context) (*curatorv1.GetConsensusStatusResponse, error) {
	members, err := s.consensus.ListMembers(ctx)
	if err != nil {
		return nil, err
	}
	list, _, err := s.watch.NodesAt(ctx, members.GetRevision())
	if err != nil {
		return nil, err
	}
	nodes := make(map[string]*curatorv1.Node, len(list))
	for _, n := range list {
		nodes[n.Id] = n
	}
	statuses := s.memberStatuses(ctx, members.GetMembers(), nodes)
	// The etcd leader: the member that says it leads, else the leader the
	// others name.
	var leaderID uint64
	for _, st := range statuses {
		if st.GetLeader() {
			leaderID = st.GetMemberId()
		}
	}
	for _, st := range statuses {
		if leaderID == 0 && st.GetLeaderId() != 0 {
			leaderID = st.GetLeaderId()
		}
	}
	leaderIndex := statuses[leaderID].GetRaftIndex()

	resp := &curatorv1.GetConsensusStatusResponse{MembershipEpoch: members.GetMembershipEpoch(), Pending: members.GetPending()}
	isMember := map[string]bool{}
	for _, m := range members.GetMembers() {
		n := nodes[m.GetNodeId()]
		ms := &curatorv1.ConsensusMemberStatus{
			MemberId:   m.GetId(),
			NodeId:     m.GetNodeId(),
			NodeExists: n != nil,
			HasRole:    n.GetRoles().GetConsensusMember() != nil,
			Learner:    m.GetLearner(),
			Started:    m.GetStarted(),
			PeerUrls:   m.GetPeerUrls(),
			Leader:     leaderID != 0 && m.GetId() == leaderID,
			NodeHealth: n.GetHealth(),
		}
		ms.LastHeartbeat = n.GetLastHeartbeat()
		st, answered := statuses[m.GetId()]
		ms.Healthy = answered && st.GetState() == consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING && (st.GetLeader() || st.GetLeaderId() != 0)
		if !m.GetLearner() {
			resp.Voters++
			if ms.Healthy {
				resp.HealthyVoters++
			}
		}
		if st, ok := statuses[m.GetId()]; ok {
			ms.RaftIndex = st.GetRaftIndex()
			if leaderIndex > ms.RaftIndex {
				ms.Lag = leaderIndex - ms.RaftIndex
			}
		}
		resp.Members = append(resp.Members, ms)
		isMember[m.GetNodeId()] = true
	}
	for id, n := range nodes {
		if n.GetRoles().GetConsensusMember() != nil && !isMember[id] {
			resp.RoleWithoutMember = append(resp.RoleWithoutMember, id)
		}
	}
	slices.Sort(resp.RoleWithoutMember)
	resp.Quorum = resp.Voters/2 + 1
	resp.FailureTolerance = int32(resp.HealthyVoters) - int32(resp.Quorum) //nolint:gosec // G115: both are at most the number of etcd voters
	return resp, nil
}

// memberStatuses asks every consensus service the curator knows of for its
// member's Status, at once, and keeps the answers of listed members by
// member id.
func (s *Service) memberStatuses(ctx context.Context, members []*consensusv1.Member, nodes map[string]*curatorv1.Node) map[uint64]*consensusv1.StatusResponse {
	listed := map[uint64]bool{}
	addrs := slices.Clone(s.cfg.Consensus)
	for _, m := range members {
		listed[m.GetId()] = true
		if a := nodes[m.GetNodeId()].GetStatus().GetConsensusApi(); a != "" && !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[uint64]*consensusv1.StatusResponse{}
	for _, a := range addrs {
		wg.Go(func() {
			c, err := s.consensus.conn(a)
			if err != nil {
				return
			}
			cctx, cancel := context.WithTimeout(ctx, memberStatusTimeout)
			defer cancel()
			st, err := c.Status(cctx, &consensusv1.StatusRequest{})
			if err != nil || !listed[st.GetMemberId()] {
				s.log.Debug("member status", "address", a, "err", err)
				return
			}
			mu.Lock()
			out[st.GetMemberId()] = st
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}
