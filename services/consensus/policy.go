package consensus

import (
	"context"
	"fmt"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
)

// policy is who may call what on the consensus service of node nodeID
// (DESIGN §2), in one table.
//
//	Status         anyone in the cluster; a node only its own
//	ListMembers, WatchMembership   admin, curator, reconciler, consensus peers
//	AddNode, PromoteMember, RemoveMember
//	               curator and reconciler, each with its own fence (checkFence)
//	Start, Leave, SetCredentials   only this node's own agent (roleserve, node/<id>)
//	Recover, RestoreSnapshot       only an admin (quorum-loss recovery)
func policy(nodeID string) rpc.Policy {
	onlySelf := func(_ context.Context, p pki.Principal, _ any) error {
		if p.Kind == pki.KindNode && p.Name != nodeID {
			return fmt.Errorf("%w: %s may act only on its own node's consensus, this is %s", rpcerr.Denied, p, nodeID)
		}
		return nil
	}
	readers := []pki.Kind{pki.KindAdmin, pki.KindCurator, pki.KindReconciler, pki.KindConsensus}
	changers := []pki.Kind{pki.KindCurator, pki.KindReconciler}
	self := rpc.Rule{Allow: []pki.Kind{pki.KindNode}, Check: onlySelf}
	p := rpc.Policy{
		consensusv1.Consensus_Status_FullMethodName:          {Allow: []pki.Kind{pki.KindAdmin, pki.KindCurator, pki.KindReconciler, pki.KindConsensus, pki.KindNode}, Check: onlySelf},
		consensusv1.Consensus_ListMembers_FullMethodName:     {Allow: readers},
		consensusv1.Consensus_WatchMembership_FullMethodName: {Allow: readers},
		consensusv1.Consensus_AddNode_FullMethodName:         {Allow: changers},
		consensusv1.Consensus_PromoteMember_FullMethodName:   {Allow: changers},
		consensusv1.Consensus_RemoveMember_FullMethodName:    {Allow: changers},
		consensusv1.Consensus_Start_FullMethodName:           self,
		consensusv1.Consensus_Leave_FullMethodName:           self,
		consensusv1.Consensus_SetCredentials_FullMethodName:  self,
		consensusv1.Consensus_Recover_FullMethodName:         {Allow: []pki.Kind{pki.KindAdmin}},
		consensusv1.Consensus_RestoreSnapshot_FullMethodName: {Allow: []pki.Kind{pki.KindAdmin}},
	}
	if len(p) != len(consensusv1.Consensus_ServiceDesc.Methods)+len(consensusv1.Consensus_ServiceDesc.Streams) {
		panic(fmt.Sprintf("consensus policy lists %d methods, the service has more", len(p)))
	}
	return p
}
