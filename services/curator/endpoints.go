package curator

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/client/pkg/v3/types"

	"curia.dev/platform/etcdpin"
)

// The etcd client's endpoints. clientv3 spreads requests over its endpoints
// round robin. A member that is frozen (SIGSTOP, a stalled VM, a
// half-open network) keeps its TCP connection, so the requests sent to it
// hang to their deadlines — the leader's session keep-alive and the watch
// hub's stream among them — until gRPC's keepalive gives up on the
// connection, 12 s later. So the curator chooses the endpoints itself
// (instead of clientv3's AutoSync): every endpointProbeInterval it lists
// the members and asks each voter for its status on a connection of its
// own, within endpointProbeTimeout, and keeps the voters that answered.
// Dropping an endpoint closes its connection, which fails what hangs on
// it; clientv3 retries reads there, and opens the keep-alive and watch
// streams again on the endpoints left. Learners are never endpoints: they
// refuse linearizable requests. With no voter answering, the list stays
// as it is: there is nothing better to choose.
//
// Both clients are pinned to one etcd cluster (platform/etcdpin): after a
// quorum-loss recovery, old members that come back (thawed, restarted)
// can hold the old cluster's quorum and acknowledge writes that the
// recovered cluster never sees. An answer of another cluster fails as
// Unavailable, and a voter answering for one is never an endpoint. The
// probe follows a recovery: a member answering for a cluster whose
// recovery records name the pinned one as superseded moves the pin to it.
// The pin is learnt on the first round, before the curator reads or
// writes anything; if only members of a superseded cluster answer then,
// it pins that one until a member of the new cluster answers a probe
// (trust on first use: a curator that starts while only old members are
// reachable cannot tell them from the current cluster).
const (
	endpointProbeInterval = time.Second
	endpointProbeTimeout  = time.Second
)

// probeEndpoints keeps the etcd client's endpoints to the voters that
// answer, until ctx ends.
func (s *Service) probeEndpoints(ctx context.Context) error {
	t := time.NewTicker(endpointProbeInterval)
	defer t.Stop()
	for {
		s.chooseEndpoints(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// chooseEndpoints probes the voters once and sets the endpoints to those
// that answered for the pinned cluster, if that changes them. The voters
// are those of the member list the pinned cluster gives: through the
// client's endpoints, or, when none of them gives one (all of them removed
// from the cluster), from a member that answered the probe for the pinned
// cluster (linearizable: from the current quorum). The members of
// --etcd and the current endpoints are probed too, though never made
// endpoints on their own: one of them may answer for a cluster that a
// recovery made of the pinned one, which is then followed
// (platform/etcdpin); in that round, the voters that answered for the new
// cluster are the endpoints.
func (s *Service) chooseEndpoints(ctx context.Context) {
	if s.pin.ID() == 0 {
		lctx, cancel := context.WithTimeout(ctx, endpointProbeTimeout)
		if err := s.pin.Learn(lctx, s.etcd); err != nil {
			s.log.Debug("learn the etcd cluster id", "err", err)
		}
		cancel()
	}
	voters := map[string]bool{}
	lctx, cancel := context.WithTimeout(ctx, endpointProbeTimeout)
	list, err := s.etcd.MemberList(lctx)
	cancel()
	if err != nil {
		s.log.Debug("list etcd members for the endpoints", "err", err)
	} else {
		for _, m := range list.Members {
			if !m.IsLearner && len(m.ClientURLs) > 0 {
				voters[m.ClientURLs[0]] = true
			}
		}
	}
	candidates := slices.Concat(slices.Collect(maps.Keys(voters)), s.cfg.Etcd, s.etcd.Endpoints())
	slices.Sort(candidates)
	was := s.pin.ID()
	answers := s.probeVoters(ctx, slices.Compact(candidates))
	s.followRecoveries(ctx, answers)
	moved := s.pin.ID() != was
	if err != nil && !moved {
		// No member list through the client's endpoints: they may all
		// be gone from the cluster (a removed member stops), and the
		// client would stay on them for good. Ask the members that
		// answered for the pinned cluster themselves, for a
		// linearizable list: only a member of the current quorum gives
		// one.
		for _, a := range answers {
			if !s.pin.Accepts(a.cluster) || a.learner {
				continue
			}
			if l, err := s.memberListOf(ctx, a.url); err == nil {
				for _, m := range l.Members {
					if !m.IsLearner && len(m.ClientURLs) > 0 {
						voters[m.ClientURLs[0]] = true
					}
				}
				break
			}
		}
	}
	var answered []string
	for _, a := range answers {
		switch {
		case !s.pin.Accepts(a.cluster):
			s.log.Warn("etcd endpoint answers for another cluster than the pinned one: not used",
				"endpoint", a.url, "cluster", types.ID(a.cluster), "pinned", types.ID(s.pin.ID()))
		case a.learner:
		case voters[a.url] || moved:
			answered = append(answered, a.url)
		}
	}
	if len(answered) == 0 {
		return
	}
	slices.Sort(answered)
	current := slices.Sorted(slices.Values(s.etcd.Endpoints()))
	if slices.Equal(answered, current) {
		return
	}
	s.log.Info("etcd endpoints changed", "endpoints", answered, "were", current, "cluster", types.ID(s.pin.ID()))
	s.etcd.SetEndpoints(answered...)
	s.sessionEtcd.SetEndpoints(answered...)
}

// memberListOf asks the member at url alone for the member list,
// linearizable.
func (s *Service) memberListOf(ctx context.Context, url string) (*etcdserverpb.MemberListResponse, error) {
	cc, err := s.memberEtcd.Dial(url)
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	lctx, cancel := context.WithTimeout(ctx, endpointProbeTimeout)
	defer cancel()
	return etcdserverpb.NewClusterClient(cc).MemberList(lctx, &etcdserverpb.MemberListRequest{Linearizable: true})
}

// followRecoveries asks each endpoint that answered for another cluster
// than the pinned one whether its cluster superseded the pinned one, and
// moves the pin forward if it did.
func (s *Service) followRecoveries(ctx context.Context, answers []voterAnswer) {
	asked := map[uint64]bool{}
	for _, a := range answers {
		if s.pin.Accepts(a.cluster) || asked[a.cluster] || s.pin.Superseded(a.cluster) {
			continue
		}
		asked[a.cluster] = true
		was := s.pin.ID()
		fctx, cancel := context.WithTimeout(ctx, endpointProbeTimeout)
		moved, err := s.pin.Follow(fctx, s.memberEtcd, a.url)
		cancel()
		if err != nil {
			s.log.Debug("read the recovery records of another cluster", "endpoint", a.url, "err", err)
			continue
		}
		if moved {
			s.log.Warn("etcd cluster superseded by a recovery: following the new cluster",
				"was", types.ID(was), "now", types.ID(s.pin.ID()), "via", a.url)
		}
	}
}

// voterAnswer is a voter that answered a status probe, and the cluster it
// answered for.
type voterAnswer struct {
	url     string
	cluster uint64
	learner bool
}

// probeVoters asks every client URL for its status, at once, and returns
// those that answered in time. The probe passes the pin unchecked: it
// judges the cluster of each answer itself.
func (s *Service) probeVoters(ctx context.Context, urls []string) []voterAnswer {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var out []voterAnswer
	for _, url := range urls {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(etcdpin.Unchecked(ctx), endpointProbeTimeout)
			defer cancel()
			st, err := s.memberEtcd.Status(pctx, url)
			if err != nil {
				s.log.Debug("etcd endpoint does not answer", "endpoint", url, "err", err)
				return
			}
			mu.Lock()
			out = append(out, voterAnswer{url: url, cluster: st.Header.GetClusterId(), learner: st.IsLearner})
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}
