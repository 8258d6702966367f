package curator

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/rpcerr"
	"curia.dev/services/curator/internal/nodestore"
)

// UpdateNodeStatus stores what an enrolled node's agent reports about
// itself: its address, its version, and the API, URLs and key of its
// consensus process. Heartbeats (internal/nodewatch) say that it is alive; this
// says what it runs. An unchanged status writes nothing.
func (x *curatorServer) UpdateNodeStatus(ctx context.Context, req *curatorv1.UpdateNodeStatusRequest) (*curatorv1.UpdateNodeStatusResponse, error) {
	err := x.s.updateStatus(ctx, req)
	return &curatorv1.UpdateNodeStatusResponse{}, err
}

// updateStatus writes a node's status, guarded by the record's revision
// (a role write may land in between: read again and retry).
func (s *Service) updateStatus(ctx context.Context, req *curatorv1.UpdateNodeStatusRequest) error {
	_, err := rpcerr.RetryConflicts(ctx, "update the status of node "+req.GetNodeId(), func() (struct{}, error) {
		n, err := s.nodes.Get(ctx, req.GetNodeId())
		if err != nil || proto.Equal(n.Status, req.GetStatus()) {
			return struct{}{}, err
		}
		n.Status = req.GetStatus()
		_, err = s.lead.Txn(ctx, []clientv3.Cmp{nodestore.Unchanged(n)}, nodestore.Put(n))
		return struct{}{}, err
	})
	return err
}
