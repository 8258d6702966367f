package roleserve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/backoff"
	"curia.dev/platform/run"
	"curia.dev/platform/version"
)

// heartbeat keeps one Heartbeat stream open to a curator replica (followers
// forward it to the leader) and sends at the interval the curator names,
// reconnecting when the stream breaks.
func (s *Service) heartbeat(ctx context.Context) error {
	if !waitFor(ctx, s.enrolled) {
		return nil
	}
	log := s.log.With("part", "heartbeat")
	bo := backoff.New(retryMin, s.cfg.RetryMax)
	for ctx.Err() == nil {
		acked, err := s.heartbeatStream(ctx)
		s.mu.Lock()
		was := s.st.connected
		s.st.connected = false
		s.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if acked {
			bo.Reset()
		}
		if was {
			log.Warn("heartbeat stream lost; reconnecting", "err", err)
		} else {
			log.Debug("heartbeat stream failed; reconnecting", "err", err)
		}
		if !run.Sleep(ctx, bo.Next()) {
			return nil
		}
	}
	return nil
}

// heartbeatStream runs one stream until it breaks; it reports whether the
// curator acknowledged any heartbeat.
func (s *Service) heartbeatStream(ctx context.Context) (bool, error) {
	cur, err := s.curatorClient()
	if err != nil {
		return false, err
	}
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cur.Heartbeat(hctx)
	if err != nil {
		return false, fmt.Errorf("open heartbeat stream: %w", err)
	}
	var interval atomic.Int64
	interval.Store(int64(s.cfg.HeartbeatInterval))
	var acked atomic.Bool
	recvErr := make(chan error, 1)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if ms := resp.GetIntervalMillis(); ms > 0 {
				interval.Store(int64(time.Duration(ms) * time.Millisecond))
			}
			now := time.Now()
			s.mu.Lock()
			was := s.st.connected
			s.st.connected, s.st.lastHeartbeat = true, now
			s.mu.Unlock()
			if !was {
				s.log.Info("heartbeats acknowledged by the curator", "interval", time.Duration(interval.Load()).String())
			}
			acked.Store(true)
		}
	}()
	for {
		if err := stream.Send(&curatorv1.HeartbeatRequest{}); err != nil {
			// The stream's real error comes from Recv.
			if errors.Is(err, io.EOF) {
				err = <-recvErr
			}
			return acked.Load(), fmt.Errorf("heartbeat: %w", err)
		}
		t := time.NewTimer(time.Duration(interval.Load()))
		select {
		case <-ctx.Done():
			t.Stop()
			return acked.Load(), nil
		case err := <-recvErr:
			t.Stop()
			return acked.Load(), fmt.Errorf("heartbeat: %w", err)
		case <-t.C:
		}
	}
}

// reportStatus reports the node's status to the curator whenever it
// changes: the address, the agent's version, the local consensus's API and
// URLs, and "consensus" among the running services while it runs.
func (s *Service) reportStatus(ctx context.Context) error {
	if !waitFor(ctx, s.enrolled) {
		return nil
	}
	log := s.log.With("part", "status")
	var (
		reported *curatorv1.NodeStatus
		known    *consensusv1.StatusResponse
		failing  bool
	)
	t := time.NewTicker(s.cfg.StatusInterval)
	defer t.Stop()
	for {
		if s.cfg.Consensus != "" {
			if st, err := s.localConsensusStatus(ctx); err == nil {
				known = st
			} else if ctx.Err() == nil {
				log.Debug("local consensus did not answer", "err", err)
				// Its URLs stay as last seen; whether it runs is unknown.
				if known != nil {
					known = proto.Clone(known).(*consensusv1.StatusResponse)
					known.State = consensusv1.LifecycleState_LIFECYCLE_STATE_UNSPECIFIED
				}
			}
		}
		st := s.statusFrom(known)
		if !proto.Equal(st, reported) {
			if err := s.updateStatus(ctx, st); err != nil {
				if !failing && ctx.Err() == nil {
					log.Warn("status report failed; retrying", "err", err)
				}
				failing = true
			} else {
				failing = false
				reported = st
				s.mu.Lock()
				s.st.reported = st
				s.mu.Unlock()
				log.Info("status reported", "address", st.GetAddress(), "running_services", st.GetRunningServices(), "consensus_peer_url", st.GetConsensusPeerUrl())
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.statusKick:
		}
	}
}

func (s *Service) updateStatus(ctx context.Context, st *curatorv1.NodeStatus) error {
	cur, err := s.curatorClient()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if _, err := cur.UpdateNodeStatus(cctx, &curatorv1.UpdateNodeStatusRequest{NodeId: s.id, Status: st}); err != nil {
		return fmt.Errorf("update node status: %w", err)
	}
	return nil
}

// statusFrom is the node's status given the local consensus's (nil when
// it never answered).
func (s *Service) statusFrom(cs *consensusv1.StatusResponse) *curatorv1.NodeStatus {
	st := &curatorv1.NodeStatus{Address: s.cfg.Address, Version: version.String()}
	if s.cfg.Consensus == "" {
		return st
	}
	st.ConsensusApi = s.cfg.Consensus
	if cs == nil {
		return st
	}
	if len(cs.GetPeerUrls()) > 0 {
		st.ConsensusPeerUrl = cs.GetPeerUrls()[0]
	}
	if len(cs.GetClientUrls()) > 0 {
		st.ConsensusClientUrl = cs.GetClientUrls()[0]
	}
	st.ConsensusPublicKey = cs.GetPublicKey()
	if cs.GetState() == consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING {
		st.RunningServices = []string{"consensus"}
	}
	return st
}
