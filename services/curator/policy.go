package curator

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"slices"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// policy is who may call what on the curator (DESIGN §2), in one table,
// with the per-request rules: a node acts only on itself (selfOnly), an
// enrolling node only with its own key. They run before the request's
// contract is checked, so a node learns nothing about requests it may not
// make anyway.
//
//	Curator     BootstrapCluster   admin, or the bootstrap node itself
//	            RegisterNode, CommitNode   enrolling nodes (self-signed key)
//	            Watch              nodes and enrolling nodes (only themselves),
//	                               curator, reconciler, admin
//	            UpdateNodeStatus, Heartbeat   nodes, only themselves
//	            GetCurrentLeader   every cluster identity
//	            WatchCRL           every cluster identity and enrolling nodes:
//	                               the list is public, signed by the CA
//	            IssueCertificates  nodes, for themselves
//	            GetMembership      consensus processes
//	Management  everything         admin
//	            GetClusterConfig,  admin, reconciler (it follows the config)
//	            WatchClusterConfig
//	            TakeSnapshot       admin, reconciler (before a membership change)
//	Leases      everything         reconciler
//	Reconciliation  ReconcileNodeRoles  reconciler
func policy() rpc.Policy {
	every := []pki.Kind{pki.KindAdmin, pki.KindCurator, pki.KindReconciler, pki.KindNode, pki.KindConsensus}
	p := rpc.Policy{
		curatorv1.Curator_BootstrapCluster_FullMethodName:  {Allow: []pki.Kind{pki.KindAdmin, pki.KindNode}, Check: ownKey},
		curatorv1.Curator_RegisterNode_FullMethodName:      {Allow: []pki.Kind{pki.KindEnrolling}, Check: ownKey},
		curatorv1.Curator_CommitNode_FullMethodName:        {Allow: []pki.Kind{pki.KindEnrolling}},
		curatorv1.Curator_Watch_FullMethodName:             {Allow: []pki.Kind{pki.KindNode, pki.KindEnrolling, pki.KindCurator, pki.KindReconciler, pki.KindAdmin}, Check: watchesItself},
		curatorv1.Curator_UpdateNodeStatus_FullMethodName:  {Allow: []pki.Kind{pki.KindNode}, Check: ownStatus},
		curatorv1.Curator_Heartbeat_FullMethodName:         {Allow: []pki.Kind{pki.KindNode}},
		curatorv1.Curator_GetCurrentLeader_FullMethodName:  {Allow: every},
		curatorv1.Curator_IssueCertificates_FullMethodName: {Allow: []pki.Kind{pki.KindNode}},
		curatorv1.Curator_GetMembership_FullMethodName:     {Allow: []pki.Kind{pki.KindConsensus}},
		curatorv1.Curator_WatchCRL_FullMethodName:          {Allow: append(slices.Clone(every), pki.KindEnrolling)},

		curatorv1.Reconciliation_ReconcileNodeRoles_FullMethodName: {Allow: []pki.Kind{pki.KindReconciler}},
	}
	method := func(service, name string) string { return "/" + service + "/" + name }
	for _, m := range curatorv1.Management_ServiceDesc.Methods {
		p[method(curatorv1.Management_ServiceDesc.ServiceName, m.MethodName)] = rpc.Rule{Allow: []pki.Kind{pki.KindAdmin}}
	}
	for _, m := range curatorv1.Management_ServiceDesc.Streams {
		p[method(curatorv1.Management_ServiceDesc.ServiceName, m.StreamName)] = rpc.Rule{Allow: []pki.Kind{pki.KindAdmin}}
	}
	p[curatorv1.Management_GetClusterConfig_FullMethodName] = rpc.Rule{Allow: []pki.Kind{pki.KindAdmin, pki.KindReconciler}}
	p[curatorv1.Management_WatchClusterConfig_FullMethodName] = rpc.Rule{Allow: []pki.Kind{pki.KindAdmin, pki.KindReconciler}}
	p[curatorv1.Management_TakeSnapshot_FullMethodName] = rpc.Rule{Allow: []pki.Kind{pki.KindAdmin, pki.KindReconciler}}
	for _, m := range curatorv1.Leases_ServiceDesc.Methods {
		p[method(curatorv1.Leases_ServiceDesc.ServiceName, m.MethodName)] = rpc.Rule{Allow: []pki.Kind{pki.KindReconciler}}
	}
	return p
}

// selfOnly: nodes and enrolling nodes (an agent waits for approval by
// watching its own record) may act only on themselves.
func selfOnly(who pki.Principal) bool {
	return who.Kind == pki.KindNode || who.Kind == pki.KindEnrolling
}

// ownKey: a node bootstraps, an enrolling node registers, only itself —
// the request's public key is the one of the call's certificate.
func ownKey(_ context.Context, who pki.Principal, req any) error {
	if !selfOnly(who) {
		return nil
	}
	pub := req.(interface{ GetPublicKey() []byte }).GetPublicKey()
	if len(pub) != ed25519.PublicKeySize || pki.NodeID(pub) != who.Name {
		return fmt.Errorf("%w: %s may act only with its own key: public_key is not the key of the call's certificate", errDenied, who)
	}
	return nil
}

// ownStatus: a node updates only its own status.
func ownStatus(_ context.Context, who pki.Principal, req any) error {
	if id := req.(*curatorv1.UpdateNodeStatusRequest).GetNodeId(); id != who.Name {
		return fmt.Errorf("%w: %s may update only its own status, not %s's", errDenied, who, id)
	}
	return nil
}

// watchesItself: a node (or an enrolling one) watches only itself.
func watchesItself(_ context.Context, who pki.Principal, req any) error {
	if !selfOnly(who) {
		return nil
	}
	r := req.(*curatorv1.WatchRequest)
	if k, ok := r.GetKind().(*curatorv1.WatchRequest_NodeId); ok {
		if k.NodeId != who.Name {
			return fmt.Errorf("%w: %s may watch only itself (node_id=%s), not %s", errDenied, who, who.Name, k.NodeId)
		}
		return nil
	}
	return fmt.Errorf("%w: %s may watch only itself: set node_id=%s instead of all_nodes", errDenied, who, who.Name)
}
