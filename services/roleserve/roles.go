package roleserve

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/backoff"
	"curia.dev/platform/run"
)

// watchRoles follows this node's record on the curator (Watch node_id=self:
// a snapshot, then every change), resuming after a broken stream from the
// last revision seen, on whichever replica answers. Each record is
// persisted before the control loop sees it, so that a restart without a
// curator acts on the last roles seen.
func (s *Service) watchRoles(ctx context.Context) error {
	if !waitFor(ctx, s.enrolled) {
		return nil
	}
	log := s.log.With("part", "roles")
	bo := backoff.New(retryMin, s.cfg.RetryMax)
	var rev int64
	for ctx.Err() == nil {
		got, err := s.watchOnce(ctx, &rev)
		if ctx.Err() != nil {
			return nil
		}
		if got {
			bo.Reset()
			log.Info("role watch ended; watching again", "revision", rev, "err", err)
		} else {
			log.Debug("role watch failed; watching again", "revision", rev, "err", err)
		}
		if !run.Sleep(ctx, bo.Next()) {
			return nil
		}
	}
	return nil
}

// watchOnce runs one Watch stream until it breaks; it reports whether it
// received anything.
func (s *Service) watchOnce(ctx context.Context, rev *int64) (bool, error) {
	cur, err := s.curatorClient()
	if err != nil {
		return false, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cur.Watch(wctx, &curatorv1.WatchRequest{Kind: &curatorv1.WatchRequest_NodeId{NodeId: s.id}, StartRevision: *rev})
	if err != nil {
		return false, fmt.Errorf("watch this node: %w", err)
	}
	got := false
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, fmt.Errorf("watch this node: %w", err)
		}
		got = true
		seen := false
		for _, n := range resp.GetNodes() {
			if n.GetId() == s.id {
				seen = true
				if err := s.setNode(n); err != nil {
					return got, err
				}
			}
		}
		for _, id := range resp.GetDeleted() {
			if id == s.id {
				seen = true
				if err := s.setNode(&curatorv1.Node{Id: s.id}); err != nil {
					return got, err
				}
				s.log.Warn("this node was deleted from the cluster: it has no roles any more")
			}
		}
		if resp.GetSnapshot() && !seen && resp.GetRevision() != 0 {
			// Not a deletion (that comes as one): a replica whose view
			// trails the node's creation. Nothing to conclude.
			s.log.Warn("the curator's snapshot lacks this node; keeping the roles known", "revision", resp.GetRevision())
		}
		if resp.GetRevision() != 0 {
			*rev = resp.GetRevision()
		}
	}
}

// setNode takes a record of this node from the curator: it persists it
// (from now on the curator has confirmed the node's roles) and has the
// control loop decide again.
func (s *Service) setNode(n *curatorv1.Node) error {
	if err := storeNodeRecord(s.files.nodeRecord, n); err != nil {
		return err
	}
	s.mu.Lock()
	old := s.st.node
	first := s.st.rolesSource != "curator"
	s.st.node, s.st.rolesKnown, s.st.rolesSource = n, true, "curator"
	s.mu.Unlock()
	if first || !proto.Equal(old.GetRoles(), n.GetRoles()) {
		s.log.Info("roles from the curator", "roles", roleNames(n.GetRoles()), "state", n.GetState().String(), "revision", n.GetRevision())
		signal(s.certKick)
	}
	signal(s.kick)
	return nil
}
