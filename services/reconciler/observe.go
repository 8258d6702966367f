package reconciler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/failpoint"
	"curia.dev/services/reconciler/internal/plan"
)

// zoneLabel is the node label autopilot spreads voters across.
const zoneLabel = "zone"

// snapshot is one observation with what act needs beyond the plan.
type snapshot struct {
	observed plan.Observed
	// config is the cluster configuration the pass plans under.
	config *curatorv1.ClusterConfig
	// peerURLs of members, for AddNode when a role is added.
	peerURLs map[uint64]string
}

// listMembersTimeout bounds one consensus service's answer to ListMembers.
const listMembersTimeout = 4 * time.Second

// observe reads, in this order, the member list (with its epoch, the
// change in flight and the etcd revision it was read at), then the nodes,
// from a snapshot at least as new as the member list: members before
// nodes, and never an older node view, so that a node that existed when the
// members were listed cannot look missing.
func (r *Reconciler) observe(ctx context.Context) (*snapshot, error) {
	var members *consensusv1.ListMembersResponse
	var err error
	for range r.cfg.Consensus {
		// Bounded per service, so that the next one is asked within this
		// pass: a frozen one (SIGSTOP, a stalled VM) would hold it whole.
		actx, cancel := context.WithTimeout(ctx, listMembersTimeout)
		members, err = r.members().ListMembers(actx, &consensusv1.ListMembersRequest{})
		cancel()
		if err == nil {
			break
		}
		r.nextConsensus()
	}
	if err != nil {
		return nil, fmt.Errorf("list etcd members: %w", err)
	}
	minRev := members.GetRevision()
	if failpoint.Mutated(failpoint.NoSnapshotFreshness) {
		minRev = 0
	}
	nodes, err := r.nodesAt(ctx, minRev)
	if err != nil {
		return nil, fmt.Errorf("read nodes: %w", err)
	}
	cc, err := curatorv1.NewManagementClient(r.curator).GetClusterConfig(ctx, &curatorv1.GetClusterConfigRequest{})
	if err != nil {
		return nil, fmt.Errorf("read the cluster configuration: %w", err)
	}
	now := time.Now()
	watched := r.lease.watchedSince()
	s := &snapshot{peerURLs: map[uint64]string{}, config: cc.GetConfig()}
	o := plan.Observed{Epoch: members.GetMembershipEpoch(), AnsweredBy: members.GetAnsweredByMemberId(), Leader: members.GetLeaderId(), Now: now}
	if p := members.GetPending(); p != nil {
		o.Pending = fmt.Sprintf("%s of node %s (member %x) by %s, change %s", p.GetOperation(), p.GetNodeId(), p.GetMemberId(), p.GetActor(), p.GetId())
	}
	for _, m := range members.GetMembers() {
		o.Members = append(o.Members, plan.Member{ID: m.GetId(), NodeID: m.GetNodeId(), Learner: m.GetLearner(), Started: m.GetStarted(), CaughtUp: m.GetCaughtUp()})
		if len(m.GetPeerUrls()) > 0 {
			s.peerURLs[m.GetId()] = m.GetPeerUrls()[0]
		}
	}
	for _, n := range nodes {
		if n.GetUnreadable() != "" && failpoint.Mutated(failpoint.NoSnapshotFreshness) {
			continue // the mutation: an unreadable record looks deleted
		}
		pn := plan.Node{
			ID: n.GetId(), Revision: n.GetRevision(),
			ConsensusMember:      n.GetRoles().GetConsensusMember() != nil,
			KubernetesController: n.GetRoles().GetKubernetesController() != nil,
			Unreadable:           n.GetUnreadable() != "",
			Up:                   n.GetState() == curatorv1.NodeState_NODE_STATE_UP,
			Healthy:              n.GetHealth() == curatorv1.NodeHealth_NODE_HEALTH_HEALTHY,
			PeerURL:              n.GetStatus().GetConsensusPeerUrl(),
			Zone:                 n.GetLabels()[zoneLabel],
		}
		if hb := n.GetLastHeartbeat(); hb != nil {
			pn.LastHeartbeat = hb.AsTime()
		}
		if m := n.GetMaintenance(); m != nil {
			pn.MaintenanceUntil = m.GetUntil().AsTime()
		}
		pn.WatchedSince = watched
		o.Nodes = append(o.Nodes, pn)
	}
	o.LearnerSince, o.ReadySince = r.learnerClocks(o.Members, now)
	s.observed = o
	return s, nil
}

// nodesAt returns every node, as of revision minRev or later: from the
// replica's view (view.go) when it gets there within viewWait, else from
// a snapshot read for this pass.
func (r *Reconciler) nodesAt(ctx context.Context, minRev int64) ([]*curatorv1.Node, error) {
	if nodes, _, ok := r.view.at(ctx, minRev, viewWait); ok {
		return nodes, nil
	}
	r.log.Debug("the node view did not reach the member list's revision in time; reading a snapshot", "view_revision", r.view.revision(), "min_revision", minRev)
	return r.readNodes(ctx, minRev)
}

// readNodes takes a snapshot of every node from the curator's watch, at
// least at revision minRev: a replica whose view is older waits or refuses,
// it never answers from the past.
func (r *Reconciler) readNodes(ctx context.Context, minRev int64) ([]*curatorv1.Node, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := curatorv1.NewCuratorClient(r.curator).Watch(ctx, &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_AllNodes{AllNodes: true}, MinRevision: minRev})
	if err != nil {
		return nil, err
	}
	// A large snapshot comes in several messages; all but the last carry
	// revision 0. A partial node list would make members look node-less,
	// so read to the end of it.
	var nodes []*curatorv1.Node
	for first := true; ; first = false {
		resp, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		if first && !resp.GetSnapshot() {
			return nil, errors.New("the node watch did not start with a snapshot")
		}
		nodes = append(nodes, resp.GetNodes()...)
		if rev := resp.GetRevision(); rev != 0 {
			if rev < minRev {
				// The curator promises this; a check that costs nothing.
				return nil, fmt.Errorf("the node snapshot is at revision %d, older than the member list's %d", rev, minRev)
			}
			return nodes, nil
		}
	}
}

// learnerClocks remembers when each learner was first seen, and since when
// it has been caught up without a break; members that are gone (or caught
// up no more) are forgotten.
func (r *Reconciler) learnerClocks(members []plan.Member, now time.Time) (since, ready map[uint64]time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	since, ready = map[uint64]time.Time{}, map[uint64]time.Time{}
	for _, m := range members {
		if !m.Learner {
			continue
		}
		since[m.ID] = now
		if t, ok := r.learnerSince[m.ID]; ok {
			since[m.ID] = t
		}
		if m.CaughtUp {
			ready[m.ID] = now
			if t, ok := r.readySince[m.ID]; ok {
				ready[m.ID] = t
			}
		}
	}
	r.learnerSince, r.readySince = since, ready
	return since, ready
}

// watchConfig triggers a pass on every change of the cluster
// configuration, from whichever curator replica answers: a new
// control_plane_size, or paused, is acted on at once, not at the next tick.
// A stream (re)opened also triggers one: the configuration may have
// changed while none was open.
func (r *Reconciler) watchConfig(ctx context.Context) error {
	return kickOnEach(ctx, r, "cluster config", func(ctx context.Context) (grpc.ServerStreamingClient[curatorv1.WatchClusterConfigResponse], error) {
		return curatorv1.NewManagementClient(r.curator).WatchClusterConfig(ctx, &curatorv1.WatchClusterConfigRequest{})
	})
}

// watchMembership triggers a pass on every membership change made through
// curia (each bumps the epoch), from whichever consensus service answers.
func (r *Reconciler) watchMembership(ctx context.Context) error {
	return kickOnEach(ctx, r, "membership", func(ctx context.Context) (grpc.ServerStreamingClient[consensusv1.WatchMembershipResponse], error) {
		return r.members().WatchMembership(ctx, &consensusv1.WatchMembershipRequest{})
	})
}

// kickOnEach triggers one of r's passes at every message of the stream
// open opens, and opens it again a second after it ends, until ctx ends.
func kickOnEach[M any](ctx context.Context, r *Reconciler, what string, open func(context.Context) (grpc.ServerStreamingClient[M], error)) error {
	for ctx.Err() == nil {
		stream, err := open(ctx)
		if err == nil {
			for {
				if _, err = stream.Recv(); err != nil {
					break
				}
				r.kick()
			}
		}
		if ctx.Err() == nil {
			r.log.Debug(what+" watch ended", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}
