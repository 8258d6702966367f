package consensus

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/protobuf/proto"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/keys"
)

// server implements curia.consensus.v1.Consensus.
type server struct {
	consensusv1.UnimplementedConsensusServer
	s *Service
}

type etcdMember = etcdserverpb.Member

func (x *server) Status(ctx context.Context, _ *consensusv1.StatusRequest) (*consensusv1.StatusResponse, error) {
	return x.s.member.status(), nil
}

func (x *server) ListMembers(ctx context.Context, _ *consensusv1.ListMembersRequest) (*consensusv1.ListMembersResponse, error) {
	e, cli, err := x.s.member.running()
	if err != nil {
		return nil, err
	}
	snap, err := readMembership(ctx, cli)
	if err != nil {
		return nil, err
	}
	x.s.member.rememberEndpoints(snap.members)
	resp := &consensusv1.ListMembersResponse{
		AnsweredByMemberId: snap.answeredBy,
		MembershipEpoch:    snap.epoch,
		Revision:           snap.revision,
		LeaderId:           uint64(e.Server.Leader()),
	}
	if snap.pending != nil {
		resp.Pending = snap.pending.PendingChange
	}
	for _, m := range snap.members {
		pm := snap.toProto(m)
		pm.CaughtUp = !m.IsLearner || learnerCaughtUp(ctx, cli, snap, m, x.s.cfg.HealthTimeout) == nil
		if m.ID == snap.answeredBy {
			resp.AnsweredByNodeId = pm.NodeId
		}
		resp.Members = append(resp.Members, pm)
	}
	return resp, nil
}

// membersPoll is how often WatchMembership looks at the members its etcd
// server applied. That is a read of memory, not a request, so it is cheap;
// it is what brings a change made outside curia (which bumps no epoch) to
// the reconciler within this, not at its next tick.
const membersPoll = 50 * time.Millisecond

// WatchMembership sends the membership now, then after every change of the
// epoch or of the members this member applied.
func (x *server) WatchMembership(_ *consensusv1.WatchMembershipRequest, stream consensusv1.Consensus_WatchMembershipServer) error {
	e, cli, err := x.s.member.running()
	if err != nil {
		return err
	}
	ctx := stream.Context()
	resp, err := cli.Get(ctx, keys.MembershipEpoch, clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("read membership epoch: %w", err)
	}
	now := &consensusv1.WatchMembershipResponse{Members: memberViews(e)}
	if len(resp.Kvs) > 0 {
		now.MembershipEpoch = resp.Kvs[0].ModRevision
	}
	if err := stream.Send(now); err != nil {
		return err
	}
	watch := cli.Watch(clientv3.WithRequireLeader(ctx), keys.MembershipEpoch, clientv3.WithRev(resp.Header.Revision+1))
	poll := time.NewTicker(membersPoll)
	defer poll.Stop()
	for {
		next := proto.CloneOf(now)
		select {
		case <-ctx.Done():
			return nil
		case <-e.Server.StopNotify():
			return fmt.Errorf("%w: the member stopped; watch again", errNotRunning)
		case wr, ok := <-watch:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("%w: the membership watch ended (etcd stopping?); watch again", errNotRunning)
			}
			if err := wr.Err(); err != nil {
				return fmt.Errorf("watch membership epoch: %w", err)
			}
			for _, ev := range wr.Events {
				next.MembershipEpoch = ev.Kv.ModRevision
			}
		case <-poll.C:
			next.Members = memberViews(e)
		}
		if proto.Equal(next, now) {
			continue
		}
		if err := stream.Send(next); err != nil {
			return err
		}
		now = next
	}
}

// memberViews is the member list e applied, by id.
func memberViews(e *embed.Etcd) []*consensusv1.MemberView {
	var out []*consensusv1.MemberView
	for _, m := range e.Server.Cluster().Members() {
		out = append(out, &consensusv1.MemberView{Id: uint64(m.ID), Name: m.Name, Learner: m.IsLearner})
	}
	return out
}

// membership is one consistent read of etcd membership: the member list,
// and the membership records (epoch, pending change, joining records) read
// before and after it with the same epoch, so that no change made through
// curia landed in between.
type membership struct {
	epoch int64
	// revision is the etcd revision of the read after the member list.
	revision   int64
	members    []*etcdMember
	answeredBy uint64
	// pending is the change in flight, nil when none.
	pending *pendingChange
	// joining maps a peer URL to the node a learner was added for.
	joining map[string]string
}

// readMembershipAttempts bounds how often readMembership reads again when
// a change landed while it read.
const readMembershipAttempts = 3

func readMembership(ctx context.Context, cli *clientv3.Client) (*membership, error) {
	for range readMembershipAttempts {
		before, err := cli.Get(ctx, keys.MembershipEpoch, clientv3.WithKeysOnly())
		if err != nil {
			return nil, fmt.Errorf("read membership epoch: %w", err)
		}
		// Linearizable (etcd's default): the list is at least as new as
		// every change finished before this call.
		list, err := cli.MemberList(ctx)
		if err != nil {
			return nil, fmt.Errorf("list members: %w", err)
		}
		after, err := cli.Get(ctx, keys.MembershipPrefix, clientv3.WithPrefix())
		if err != nil {
			return nil, fmt.Errorf("read membership records: %w", err)
		}
		snap := &membership{
			revision:   after.Header.Revision,
			members:    list.Members,
			answeredBy: list.Header.MemberId,
			joining:    map[string]string{},
		}
		for _, kv := range after.Kvs {
			switch key := string(kv.Key); {
			case key == keys.MembershipEpoch:
				snap.epoch = kv.ModRevision
			case key == keys.MembershipPending:
				snap.pending = decodePending(kv.Value, kv.CreateRevision, kv.ModRevision)
			case strings.HasPrefix(key, keys.MembershipJoining):
				if u, err := keys.JoiningPeerURL(key); err == nil {
					snap.joining[u] = string(kv.Value)
				}
			}
		}
		var epochBefore int64
		if len(before.Kvs) > 0 {
			epochBefore = before.Kvs[0].ModRevision
		}
		if epochBefore == snap.epoch {
			return snap, nil
		}
	}
	return nil, fmt.Errorf("%w: membership changed while it was read, %d times in a row; retry", errChangePending, readMembershipAttempts)
}

// nodeID names the node of a member: its etcd name once it started; before
// that, the node it was added for (the joining record of its peer URL); as a
// last resort the host part of its peer URL (Metropolis'
// GetEtcdMemberNodeId, for members added outside curia).
func (s *membership) nodeID(m *etcdMember) string {
	if m.Name != "" {
		return m.Name
	}
	for _, u := range m.PeerURLs {
		if id, ok := s.joining[u]; ok {
			return id
		}
	}
	if len(m.PeerURLs) > 0 {
		if u, err := url.Parse(m.PeerURLs[0]); err == nil {
			if host, _, err := net.SplitHostPort(u.Host); err == nil {
				return host
			}
			return u.Host
		}
	}
	return ""
}

func (s *membership) toProto(m *etcdMember) *consensusv1.Member {
	return &consensusv1.Member{
		Id:         m.ID,
		NodeId:     s.nodeID(m),
		PeerUrls:   m.PeerURLs,
		ClientUrls: m.ClientURLs,
		Learner:    m.IsLearner,
		Started:    m.Name != "",
	}
}

// byNode finds the member of a node.
func (s *membership) byNode(nodeID string) *etcdMember {
	for _, m := range s.members {
		if s.nodeID(m) == nodeID {
			return m
		}
	}
	return nil
}

// byID finds a member by id.
func (s *membership) byID(id uint64) *etcdMember {
	for _, m := range s.members {
		if m.ID == id {
			return m
		}
	}
	return nil
}

// voters are the members that are not learners.
func (s *membership) voters() []*etcdMember {
	var out []*etcdMember
	for _, m := range s.members {
		if !m.IsLearner {
			out = append(out, m)
		}
	}
	return out
}

// joinParameters describes the cluster to a node joining as member id.
func (s *membership) joinParameters(id uint64, peerURL string, caPEM, crl []byte) *consensusv1.JoinParameters {
	jp := &consensusv1.JoinParameters{
		CaCertificate: caPEM,
		Crl:           crl,
		MemberId:      id,
		PeerUrl:       peerURL,
	}
	for _, m := range s.voters() {
		jp.Voters = append(jp.Voters, &consensusv1.Peer{Name: s.nodeID(m), PeerUrls: m.PeerURLs, ClientUrls: m.ClientURLs})
	}
	return jp
}
