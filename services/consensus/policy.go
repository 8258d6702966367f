package consensus

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// policy is who may call what on the consensus service of node nodeID
// (DESIGN §2), in one table.
//
//	Status         anyone in the cluster; a node only its own
//	ListMembers, WatchMembership   admin, curator, reconciler, consensus peers
//	AddNode, PromoteMember, RemoveMember
//	               curator and reconciler, each with its own fence (checkFence)
//	Start, Leave, SetCredentials   only this node's own agent (roleserve, node/<id>)
func policy(nodeID string) rpc.Policy {
	onlySelf := func(_ context.Context, p pki.Principal, _ any) error {
		if p.Kind == pki.KindNode && p.Name != nodeID {
			return status.Errorf(codes.PermissionDenied, "%s may act only on its own node's consensus, this is %s", p, nodeID)
		}
		return nil
	}
	m := func(name string) string { return "/" + consensusv1.Consensus_ServiceDesc.ServiceName + "/" + name }
	readers := []pki.Kind{pki.KindAdmin, pki.KindCurator, pki.KindReconciler, pki.KindConsensus}
	changers := []pki.Kind{pki.KindCurator, pki.KindReconciler}
	self := rpc.Rule{Allow: []pki.Kind{pki.KindNode}, Check: onlySelf}
	p := rpc.Policy{
		m("Status"):          {Allow: []pki.Kind{pki.KindAdmin, pki.KindCurator, pki.KindReconciler, pki.KindConsensus, pki.KindNode}, Check: onlySelf},
		m("ListMembers"):     {Allow: readers},
		m("WatchMembership"): {Allow: readers},
		m("AddNode"):         {Allow: changers},
		m("PromoteMember"):   {Allow: changers},
		m("RemoveMember"):    {Allow: changers},
		m("Start"):           self,
		m("Leave"):           self,
		m("SetCredentials"):  self,
	}
	if len(p) != len(consensusv1.Consensus_ServiceDesc.Methods)+len(consensusv1.Consensus_ServiceDesc.Streams) {
		panic(fmt.Sprintf("consensus policy lists %d methods, the service has more", len(p)))
	}
	return p
}
