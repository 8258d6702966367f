package curator

import (
	"slices"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rpc"
)

// policy is who may call what on the curator (DESIGN §2), in one table.
// Handlers add the per-request rules: a node acts only on itself
// (selfOnly), an enrolling node only with its own key.
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
//	Leases      everything         reconciler
func policy() rpc.Policy {
	every := []pki.Kind{pki.KindAdmin, pki.KindCurator, pki.KindReconciler, pki.KindNode, pki.KindConsensus}
	p := rpc.Policy{
		curatorv1.Curator_BootstrapCluster_FullMethodName:  {Allow: []pki.Kind{pki.KindAdmin, pki.KindNode}},
		curatorv1.Curator_RegisterNode_FullMethodName:      {Allow: []pki.Kind{pki.KindEnrolling}},
		curatorv1.Curator_CommitNode_FullMethodName:        {Allow: []pki.Kind{pki.KindEnrolling}},
		curatorv1.Curator_Watch_FullMethodName:             {Allow: []pki.Kind{pki.KindNode, pki.KindEnrolling, pki.KindCurator, pki.KindReconciler, pki.KindAdmin}},
		curatorv1.Curator_UpdateNodeStatus_FullMethodName:  {Allow: []pki.Kind{pki.KindNode}},
		curatorv1.Curator_Heartbeat_FullMethodName:         {Allow: []pki.Kind{pki.KindNode}},
		curatorv1.Curator_GetCurrentLeader_FullMethodName:  {Allow: every},
		curatorv1.Curator_IssueCertificates_FullMethodName: {Allow: []pki.Kind{pki.KindNode}},
		curatorv1.Curator_GetMembership_FullMethodName:     {Allow: []pki.Kind{pki.KindConsensus}},
		curatorv1.Curator_WatchCRL_FullMethodName:          {Allow: append(slices.Clone(every), pki.KindEnrolling)},
	}
	method := func(service, name string) string { return "/" + service + "/" + name }
	for _, m := range curatorv1.Management_ServiceDesc.Methods {
		p[method(curatorv1.Management_ServiceDesc.ServiceName, m.MethodName)] = rpc.Rule{Allow: []pki.Kind{pki.KindAdmin}}
	}
	for _, m := range curatorv1.Management_ServiceDesc.Streams {
		p[method(curatorv1.Management_ServiceDesc.ServiceName, m.StreamName)] = rpc.Rule{Allow: []pki.Kind{pki.KindAdmin}}
	}
	for _, m := range curatorv1.Leases_ServiceDesc.Methods {
		p[method(curatorv1.Leases_ServiceDesc.ServiceName, m.MethodName)] = rpc.Rule{Allow: []pki.Kind{pki.KindReconciler}}
	}
	return p
}
