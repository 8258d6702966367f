package curator

import (
	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// getNodesBatch is how many nodes GetNodes reads, decorates and filters at
// a time, and so the most one GetNodes message carries.
const getNodesBatch = 1000

// GetNodes streams the nodes that match the filter, a batch at a time: each
// batch gets its health from one read of the heartbeats (decorate) before it
// is filtered, so that filters can use node.health.
func (x *managementServer) GetNodes(req *curatorv1.GetNodesRequest, stream curatorv1.Management_GetNodesServer) error {
	s := x.s
	match, err := compileFilter(req.GetFilter())
	if err != nil {
		return err
	}
	ctx := stream.Context()
	batch := make([]*curatorv1.Node, 0, getNodesBatch)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := s.decorate(ctx, batch); err != nil {
			return err
		}
		var out []*curatorv1.Node
		for _, n := range batch {
			ok, err := match(n)
			if err != nil {
				return err
			}
			if ok {
				out = append(out, n)
			}
		}
		batch = batch[:0]
		if len(out) == 0 {
			return nil
		}
		return stream.Send(&curatorv1.GetNodesResponse{Nodes: out})
	}
	err = s.eachNode(ctx, func(n *curatorv1.Node) error {
		batch = append(batch, n)
		if len(batch) == getNodesBatch {
			return flush()
		}
		return nil
	})
	if err != nil {
		return err
	}
	return flush()
}
