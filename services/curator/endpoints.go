package curator

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
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
// that answered, if that changes them.
func (s *Service) chooseEndpoints(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, endpointProbeTimeout)
	list, err := s.etcd.MemberList(lctx)
	cancel()
	if err != nil {
		s.log.Debug("list etcd members for the endpoints", "err", err)
		return
	}
	answered := s.answeringVoters(ctx, list.Members)
	if len(answered) == 0 {
		return
	}
	slices.Sort(answered)
	current := slices.Sorted(slices.Values(s.etcd.Endpoints()))
	if slices.Equal(answered, current) {
		return
	}
	s.log.Info("etcd endpoints changed", "endpoints", answered, "were", current)
	s.etcd.SetEndpoints(answered...)
	s.sessionEtcd.SetEndpoints(answered...)
}

// answeringVoters asks every voter's first client URL for its status, at
// once, and returns those that answered in time.
func (s *Service) answeringVoters(ctx context.Context, members []*etcdserverpb.Member) []string {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var out []string
	for _, m := range members {
		if m.IsLearner || len(m.ClientURLs) == 0 {
			continue
		}
		url := m.ClientURLs[0]
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, endpointProbeTimeout)
			defer cancel()
			if _, err := s.etcd.Status(pctx, url); err != nil {
				s.log.Debug("etcd endpoint does not answer", "endpoint", url, "err", err)
				return
			}
			mu.Lock()
			out = append(out, url)
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}
