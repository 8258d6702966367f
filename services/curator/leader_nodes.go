package curator

import (
	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// getNodesBatch is how many nodes one GetNodes message carries.
const getNodesBatch = 100

func (x *managementServer) GetNodes(req *curatorv1.GetNodesRequest, stream curatorv1.Management_GetNodesServer) error {
	s := x.s
	match, err := compileFilter(req.GetFilter())
	if err != nil {
		return toStatus(err)
	}
	ctx := stream.Context()
	batch := make([]*curatorv1.Node, 0, getNodesBatch)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := stream.Send(&curatorv1.GetNodesResponse{Nodes: batch})
		batch = make([]*curatorv1.Node, 0, getNodesBatch)
		return err
	}
	err = s.eachNode(ctx, func(n *curatorv1.Node) error {
		ok, err := match(n)
		if err != nil || !ok {
			return err
		}
		batch = append(batch, n)
		if len(batch) == getNodesBatch {
			return flush()
		}
		return nil
	})
	if err != nil {
		return toStatus(err)
	}
	return toStatus(flush())
}
