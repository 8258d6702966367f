package curator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/services/curator/internal/nodewatch"
)

// Watch streams nodes from this replica's watch hub
// (internal/nodewatch): every replica serves it itself.
func (x *curatorServer) Watch(req *curatorv1.WatchRequest, stream curatorv1.Curator_WatchServer) error {
	return x.s.watch.Watch(req, stream)
}

// Heartbeat serves one node's heartbeat stream.
func (x *curatorServer) Heartbeat(stream curatorv1.Curator_HeartbeatServer) error {
	return x.s.heartbeat(stream)
}

func (s *Service) heartbeat(stream curatorv1.Curator_HeartbeatServer) error {
	ctx := stream.Context()
	p := rpc.Caller(ctx)
	if p.Kind != pki.KindNode {
		return fmt.Errorf("%w: only nodes send heartbeats, not %s", errDenied, p)
	}
	_, term, ok := s.lead.Ours()
	if !ok {
		return errNotLeader
	}
	n, err := s.nodes.Get(ctx, p.Name)
	if errors.Is(err, errNotFound) {
		return fmt.Errorf("%w: node %s does not exist", errRefused, p.Name)
	}
	if err != nil {
		return err
	}
	if n.State != curatorv1.NodeState_NODE_STATE_UP {
		return fmt.Errorf("%w: node %s is %s: only UP nodes send heartbeats", errRefused, n.Id, n.State)
	}
	resp := &curatorv1.HeartbeatResponse{IntervalMillis: s.cfg.HeartbeatInterval.Milliseconds()}
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		t := s.beats.Load()
		if _, cur, ok := s.lead.Ours(); !ok || cur != term {
			return fmt.Errorf("%w: curator leadership moved; send heartbeats again (any replica forwards to the leader)", errNotLeader)
		}
		if t == nil || t.Term() != term {
			return fmt.Errorf("%w: the curator leader is loading the heartbeats; send them again", errUnavailable)
		}
		t.Beat(n.Id, time.Now())
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// beatsLead starts the term's tracker when this replica became leader; it
// writes the shards until the term ends.
func (s *Service) beatsLead(ctx context.Context, term int64) error {
	if old := s.beats.Swap(nil); old != nil {
		old.Stop()
	}
	t, err := nodewatch.Track(ctx, nodewatch.Tracking{
		Etcd: s.etcd, Lead: s.lead, Log: s.log, Registered: s.watch.Exists,
		Term: term, Timeout: s.cfg.HeartbeatTimeout,
	})
	if err != nil {
		return err
	}
	s.beats.Store(t)
	return nil
}
