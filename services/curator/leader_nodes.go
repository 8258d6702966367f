package curator

import (
	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// getNodesBatch is the most nodes one GetNodes message carries.
const getNodesBatch = 1000

// GetNodes streams the nodes that match the filter, a batch at a time, from
// the watch hub's view at etcd's current revision or later (a linearizable
// read that reads no node from etcd): the nodes carry their health, so
// filters can use node.health.
func (x *managementServer) GetNodes(req *curatorv1.GetNodesRequest, stream curatorv1.Management_GetNodesServer) error {
	match, err := compileFilter(req.GetFilter())
	if err != nil {
		return err
	}
	nodes, err := x.s.watch.currentNodes(stream.Context())
	if err != nil {
		return err
	}
	out := make([]*curatorv1.Node, 0, min(len(nodes), getNodesBatch))
	for _, n := range nodes {
		ok, err := match(n)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if out = append(out, n); len(out) == getNodesBatch {
			if err := stream.Send(&curatorv1.GetNodesResponse{Nodes: out}); err != nil {
				return err
			}
			out = out[:0]
		}
	}
	if len(out) == 0 {
		return nil
	}
	return stream.Send(&curatorv1.GetNodesResponse{Nodes: out})
}
