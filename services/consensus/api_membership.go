package consensus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/types"
	clientv3 "go.etcd.io/etcd/client/v3"

	auditv1 "curia.dev/gen/curia/audit/v1"
	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/fence"
	"curia.dev/platform/keys"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// change is one fenced membership change in progress: who asks, under which
// fence, against which snapshot.
type change struct {
	x      *server
	cli    *clientv3.Client
	actor  pki.Principal
	fence  fence.Fence
	action string
	snap   *membership
}

// begin validates the caller's fence, takes the change lock and reads
// membership. The caller must call end.
func (x *server) begin(ctx context.Context, pf *consensusv1.Fence, action string) (*change, error) {
	actor, _ := rpc.PrincipalFromContext(ctx)
	f := fence.FromProto(pf)
	if err := checkFence(actor, f); err != nil {
		return nil, err
	}
	_, cli, err := x.s.member.running()
	if err != nil {
		return nil, err
	}
	x.s.member.changeMu.Lock()
	snap, err := readMembership(ctx, cli)
	if err != nil {
		x.s.member.changeMu.Unlock()
		return nil, err
	}
	x.s.member.rememberEndpoints(snap.members)
	c := &change{x: x, cli: cli, actor: actor, fence: f, action: action, snap: snap}
	// A stale caller learns that first, before any other answer, and even
	// when the call would change nothing (an idempotent repeat).
	if _, err := fence.Apply(ctx, cli, f, nil); err != nil {
		x.s.member.changeMu.Unlock()
		return nil, fmt.Errorf("%s: %w", action, err)
	}
	return c, nil
}

func (c *change) end() { c.x.s.member.changeMu.Unlock() }

// checkFence enforces the shape of a fence per caller (DESIGN §4): the
// curator fences on its leader key; the reconciler on the leader key that
// granted its lease and on its lease. Keys elsewhere are refused: a fence on
// a key that never goes away would fence nothing.
func checkFence(actor pki.Principal, f fence.Fence) error {
	if err := f.Validate(keys.LeaderElection, keys.LeasesPrefix); err != nil {
		return fmt.Errorf("%w: %v", errBadRequest, err)
	}
	switch actor.Kind {
	case pki.KindCurator:
		if !f.HasKeyUnder(keys.LeaderElection) {
			return fmt.Errorf("%w: the curator's fence must include its leader key (under %s)", errBadRequest, keys.LeaderElection)
		}
	case pki.KindReconciler:
		if !f.HasKeyUnder(keys.LeaderElection) || !f.HasKey(keys.Lease("reconciler")) {
			return fmt.Errorf("%w: the reconciler's fence must include the leader key that granted its lease (under %s) and the lease %s", errBadRequest, keys.LeaderElection, keys.Lease("reconciler"))
		}
	}
	return nil
}

// commit is the fenced transaction before a real change: it checks the
// fence (and the caller's epoch), bumps the epoch, records the intent in the
// audit log and applies extra ops, all or nothing. It returns the new epoch.
func (c *change) commit(ctx context.Context, nodeID string, memberID uint64, reason string, ops ...clientv3.Op) (int64, error) {
	recorder := "consensus/" + c.x.s.cfg.nodeID
	ops = append(ops, fence.BumpEpoch(recorder), audit.Put(&auditv1.Event{
		Actor:      c.actor.String(),
		RecordedBy: recorder,
		Action:     c.action,
		NodeId:     nodeID,
		MemberId:   memberID,
		Fence:      c.fence.Strings(),
		Reason:     reason,
	}))
	resp, err := fence.Apply(ctx, c.cli, c.fence, nil, ops...)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", c.action, err)
	}
	c.x.s.log.Info("membership change", "action", c.action, "node", nodeID, "member", types.ID(memberID).String(), "actor", c.actor.String(), "fence", c.fence.String(), "reason", reason)
	return fence.EpochAfter(resp), nil
}

func (x *server) AddNode(ctx context.Context, req *consensusv1.AddNodeRequest) (*consensusv1.AddNodeResponse, error) {
	resp, err := x.addNode(ctx, req)
	return resp, toStatus(err)
}

func (x *server) addNode(ctx context.Context, req *consensusv1.AddNodeRequest) (*consensusv1.AddNodeResponse, error) {
	if err := (pki.Principal{Kind: pki.KindNode, Name: req.GetNodeId()}).Validate(); err != nil {
		return nil, fmt.Errorf("%w: node_id: %v", errBadRequest, err)
	}
	if err := validatePeerURL(req.GetPeerUrl()); err != nil {
		return nil, fmt.Errorf("%w: peer_url: %v", errBadRequest, err)
	}
	c, err := x.begin(ctx, req.GetFence(), "member.add")
	if err != nil {
		return nil, err
	}
	defer c.end()

	if resp, err := c.existing(ctx, req.GetNodeId()); resp != nil || err != nil {
		return resp, err
	}
	for _, m := range c.snap.members {
		if slices.Contains(m.PeerURLs, req.GetPeerUrl()) {
			return nil, fmt.Errorf("%w: peer URL %s is already used by member %s (node %q); pick another address or remove that member", errConflict, req.GetPeerUrl(), types.ID(m.ID), c.snap.nodeID(m))
		}
	}
	if learners := learners(c.snap.members); len(learners) > 0 {
		return nil, fmt.Errorf("%w: add %s: member %s (node %q) is still a learner and etcd allows one learner at a time: wait until it is promoted, or remove it", errRefused, req.GetNodeId(), types.ID(learners[0].ID), c.snap.nodeID(learners[0]))
	}

	// The epoch bump, the joining record that names the learner and the
	// audit entry land together, fenced; the member call follows at once.
	// This is the one unfenced step etcd leaves us: if we die here, the
	// epoch moved without a change, which costs a re-read and nothing more.
	epoch, err := c.commit(ctx, req.GetNodeId(), 0, "add node as learner with peer URL "+req.GetPeerUrl(),
		clientv3.OpPut(keys.Joining(req.GetPeerUrl()), req.GetNodeId()))
	if err != nil {
		return nil, err
	}
	added, err := c.cli.MemberAddAsLearner(ctx, []string{req.GetPeerUrl()})
	if errors.Is(err, rpctypes.ErrPeerURLExist) {
		// Someone added it between our read and our call; answer as for
		// an existing member if it is this node's.
		if resp, rerr := c.reread(ctx, req.GetNodeId()); resp != nil || rerr != nil {
			return resp, rerr
		}
	}
	if err != nil {
		return nil, explain(err, "add learner "+req.GetNodeId())
	}
	snap := &membership{members: added.Members, joining: map[string]string{req.GetPeerUrl(): req.GetNodeId()}}
	crl, err := x.crl(ctx, c.cli)
	if err != nil {
		return nil, err
	}
	return &consensusv1.AddNodeResponse{
		Join:            snap.joinParameters(added.Member.ID, req.GetPeerUrl(), x.s.creds.CAPEM, crl),
		MembershipEpoch: epoch,
	}, nil
}

// existing answers AddNode for a node that is a member already: the same
// join parameters, no second member, no epoch bump.
func (c *change) existing(ctx context.Context, nodeID string) (*consensusv1.AddNodeResponse, error) {
	m := c.snap.byNode(nodeID)
	if m == nil {
		return nil, nil
	}
	crl, err := c.x.crl(ctx, c.cli)
	if err != nil {
		return nil, err
	}
	peerURL := ""
	if len(m.PeerURLs) > 0 {
		peerURL = m.PeerURLs[0]
	}
	return &consensusv1.AddNodeResponse{
		Join:            c.snap.joinParameters(m.ID, peerURL, c.x.s.creds.CAPEM, crl),
		AlreadyMember:   true,
		MembershipEpoch: c.snap.epoch,
	}, nil
}

func (c *change) reread(ctx context.Context, nodeID string) (*consensusv1.AddNodeResponse, error) {
	snap, err := readMembership(ctx, c.cli)
	if err != nil {
		return nil, err
	}
	c.snap = snap
	return c.existing(ctx, nodeID)
}

// crl is the cluster's current revocation list, handed to joining members.
func (x *server) crl(ctx context.Context, cli *clientv3.Client) ([]byte, error) {
	resp, err := cli.Get(ctx, keys.CRL)
	if err != nil {
		return nil, fmt.Errorf("read CRL: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return resp.Kvs[0].Value, nil
}

func learners(ms []*etcdMember) []*etcdMember {
	var out []*etcdMember
	for _, m := range ms {
		if m.IsLearner {
			out = append(out, m)
		}
	}
	return out
}

func (x *server) PromoteMember(ctx context.Context, req *consensusv1.PromoteMemberRequest) (*consensusv1.PromoteMemberResponse, error) {
	resp, err := x.promote(ctx, req)
	return resp, toStatus(err)
}

func (x *server) promote(ctx context.Context, req *consensusv1.PromoteMemberRequest) (*consensusv1.PromoteMemberResponse, error) {
	if req.GetMemberId() == 0 {
		return nil, fmt.Errorf("%w: member_id is required", errBadRequest)
	}
	c, err := x.begin(ctx, req.GetFence(), "member.promote")
	if err != nil {
		return nil, err
	}
	defer c.end()

	m := c.snap.byID(req.GetMemberId())
	if m == nil {
		return nil, fmt.Errorf("%w: promote: member %s is not in the cluster", errNotFound, types.ID(req.GetMemberId()))
	}
	node := c.snap.nodeID(m)
	if !m.IsLearner {
		return &consensusv1.PromoteMemberResponse{AlreadyVoter: true, MembershipEpoch: c.snap.epoch}, nil
	}
	// Ask before bumping the epoch, so that polling a learner that is not
	// ready yet does not invalidate everyone's snapshot. etcd checks again.
	if err := c.learnerReady(ctx, m); err != nil {
		return nil, err
	}
	epoch, err := c.commit(ctx, node, m.ID, "promote learner to voter")
	if err != nil {
		return nil, err
	}
	if _, err := c.cli.MemberPromote(ctx, m.ID); err != nil {
		return nil, explain(err, fmt.Sprintf("promote member %s (node %q)", types.ID(m.ID), node))
	}
	return &consensusv1.PromoteMemberResponse{MembershipEpoch: epoch}, nil
}

// learnerReady approximates etcd's own readiness rule (the learner's log is
// within 10% of the leader's) from the members' status.
func (c *change) learnerReady(ctx context.Context, m *etcdMember) error {
	return learnerCaughtUp(ctx, c.cli, c.snap, m, c.x.s.cfg.HealthTimeout)
}

func learnerCaughtUp(ctx context.Context, cli *clientv3.Client, snap *membership, m *etcdMember, timeout time.Duration) error {
	node := snap.nodeID(m)
	if m.Name == "" || len(m.ClientURLs) == 0 {
		return fmt.Errorf("%w: learner %s (node %q) has not started yet: start its consensus service with the join parameters, then promote", errRefused, types.ID(m.ID), node)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ls, err := cli.Status(pctx, m.ClientURLs[0])
	if err != nil {
		return fmt.Errorf("%w: learner %s (node %q) does not answer (%v): it cannot be promoted until it runs", errRefused, types.ID(m.ID), node, err)
	}
	leader := snap.byID(ls.Leader)
	if leader == nil || len(leader.ClientURLs) == 0 {
		return fmt.Errorf("%w: learner %s (node %q) knows no leader yet", errRefused, types.ID(m.ID), node)
	}
	lead, err := cli.Status(pctx, leader.ClientURLs[0])
	if err != nil {
		return fmt.Errorf("ask leader %s for its raft index: %w", types.ID(leader.ID), err)
	}
	if float64(ls.RaftIndex) < 0.9*float64(lead.RaftIndex) {
		return fmt.Errorf("%w: learner %s (node %q) is at raft index %d of the leader's %d: not caught up yet, retry later", errRefused, types.ID(m.ID), node, ls.RaftIndex, lead.RaftIndex)
	}
	return nil
}

func (x *server) RemoveMember(ctx context.Context, req *consensusv1.RemoveMemberRequest) (*consensusv1.RemoveMemberResponse, error) {
	resp, err := x.remove(ctx, req)
	return resp, toStatus(err)
}

func (x *server) remove(ctx context.Context, req *consensusv1.RemoveMemberRequest) (*consensusv1.RemoveMemberResponse, error) {
	switch t := req.GetTarget().(type) {
	case *consensusv1.RemoveMemberRequest_MemberId:
		if t.MemberId == 0 {
			return nil, fmt.Errorf("%w: member_id must not be 0", errBadRequest)
		}
	case *consensusv1.RemoveMemberRequest_NodeId:
		if err := (pki.Principal{Kind: pki.KindNode, Name: t.NodeId}).Validate(); err != nil {
			return nil, fmt.Errorf("%w: node_id: %v", errBadRequest, err)
		}
	default:
		return nil, fmt.Errorf("%w: set member_id or node_id", errBadRequest)
	}
	c, err := x.begin(ctx, req.GetFence(), "member.remove")
	if err != nil {
		return nil, err
	}
	defer c.end()

	var m *etcdMember
	if id := req.GetMemberId(); id != 0 {
		m = c.snap.byID(id)
	} else {
		m = c.snap.byNode(req.GetNodeId())
	}
	if m == nil {
		// Already gone: a retry after a crash must finish, not fail.
		return &consensusv1.RemoveMemberResponse{AlreadyAbsent: true, MembershipEpoch: c.snap.epoch}, nil
	}
	node := c.snap.nodeID(m)
	moved := false
	if !m.IsLearner {
		transferee, isLeader, err := c.quorumGuard(ctx, m)
		if err != nil {
			return nil, err
		}
		if isLeader {
			if err := c.moveLeader(ctx, m, transferee); err != nil {
				return nil, err
			}
			moved = true
		}
	}
	ops := make([]clientv3.Op, 0, len(m.PeerURLs))
	for _, u := range m.PeerURLs {
		ops = append(ops, clientv3.OpDelete(keys.Joining(u)))
	}
	epoch, err := c.commit(ctx, node, m.ID, "remove member", ops...)
	if err != nil {
		return nil, err
	}
	if _, err := c.cli.MemberRemove(ctx, m.ID); err != nil {
		if errors.Is(err, rpctypes.ErrMemberNotFound) {
			return &consensusv1.RemoveMemberResponse{AlreadyAbsent: true, MembershipEpoch: epoch}, nil
		}
		return nil, explain(err, fmt.Sprintf("remove member %s (node %q)", types.ID(m.ID), node))
	}
	return &consensusv1.RemoveMemberResponse{MemberId: m.ID, MovedLeadership: moved, MembershipEpoch: epoch}, nil
}

// quorumGuard refuses to remove the last voter, or a voter whose removal
// leaves fewer healthy voters than a quorum of the smaller cluster. It
// returns the healthiest other voter (to hand leadership to) and whether the
// target leads.
func (c *change) quorumGuard(ctx context.Context, target *etcdMember) (*etcdMember, bool, error) {
	node := c.snap.nodeID(target)
	voters := c.snap.voters()
	if len(voters) <= 1 {
		return nil, false, fmt.Errorf("%w: member %s (node %q) is the last voter: removing it would destroy the cluster", errRefused, types.ID(target.ID), node)
	}
	var (
		healthy, unhealthy []string
		best               *etcdMember
		bestIndex          uint64
		leader             uint64
	)
	for _, v := range voters {
		st, err := c.probe(ctx, v)
		if v.ID == target.ID {
			if err == nil {
				leader = st.Leader
			}
			continue
		}
		if err != nil {
			unhealthy = append(unhealthy, fmt.Sprintf("%s (node %q: %v)", types.ID(v.ID), c.snap.nodeID(v), err))
			continue
		}
		healthy = append(healthy, types.ID(v.ID).String())
		if leader == 0 {
			leader = st.Leader
		}
		if best == nil || st.RaftIndex > bestIndex {
			best, bestIndex = v, st.RaftIndex
		}
	}
	remaining := len(voters) - 1
	quorum := remaining/2 + 1
	if len(healthy) < quorum {
		return nil, false, fmt.Errorf("%w: removing member %s (node %q) would leave %d healthy voters of %d, below the quorum of %d; bring these voters back first: %s",
			errRefused, types.ID(target.ID), node, len(healthy), remaining, quorum, strings.Join(unhealthy, "; "))
	}
	return best, leader == target.ID, nil
}

// probe asks one voter for its status within the health timeout. A voter is
// healthy when it answers, knows a leader and raises no alarm.
func (c *change) probe(ctx context.Context, m *etcdMember) (*clientv3.StatusResponse, error) {
	if len(m.ClientURLs) == 0 {
		return nil, errors.New("never started")
	}
	pctx, cancel := context.WithTimeout(ctx, c.x.s.cfg.HealthTimeout)
	defer cancel()
	st, err := c.cli.Status(pctx, m.ClientURLs[0])
	if err != nil {
		return nil, err
	}
	if st.Leader == 0 {
		return nil, errors.New("knows no leader")
	}
	if len(st.Errors) > 0 {
		return nil, fmt.Errorf("reports %s", strings.Join(st.Errors, ", "))
	}
	return st, nil
}

// moveLeader hands etcd leadership from the target to the transferee before
// the target is removed, so the cluster does not sit through an election.
// MoveLeader must be sent to the leader itself.
func (c *change) moveLeader(ctx context.Context, leader, transferee *etcdMember) error {
	cli, err := c.x.s.member.dial(leader.ClientURLs)
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.MoveLeader(ctx, transferee.ID); err != nil {
		return explain(err, fmt.Sprintf("move leadership from %s to %s before removing it", types.ID(leader.ID), types.ID(transferee.ID)))
	}
	c.x.s.log.Info("moved etcd leadership", "from", types.ID(leader.ID).String(), "to", types.ID(transferee.ID).String())
	return nil
}
