package curator

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/rpcerr"
)

// UpdateNodeStatus stores what an enrolled node's agent reports about
// itself: its address, its version, and the API, URLs and key of its
// consensus process. Heartbeats (heartbeat.go) say that it is alive; this
// says what it runs. An unchanged status writes nothing.
func (x *curatorServer) UpdateNodeStatus(ctx context.Context, req *curatorv1.UpdateNodeStatusRequest) (*curatorv1.UpdateNodeStatusResponse, error) {
	err := x.s.updateStatus(ctx, req)
	return &curatorv1.UpdateNodeStatusResponse{}, err
}

// updateStatus writes a node's status, guarded by the record's revision
// (a role write may land in between: read again and retry).
func (s *Service) updateStatus(ctx context.Context, req *curatorv1.UpdateNodeStatusRequest) error {
	_, err := rpcerr.RetryConflicts(ctx, "update the status of node "+req.GetNodeId(), func() (struct{}, error) {
		n, err := s.getNode(ctx, req.GetNodeId())
		if err != nil || protoEqual(n.Status, req.GetStatus()) {
			return struct{}{}, err
		}
		n.Status = req.GetStatus()
		_, err = s.lead.Txn(ctx, []clientv3.Cmp{unchanged(n)}, putNode(n))
		return struct{}{}, err
	})
	return err
}
