package curator

import (
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
	p := rpc.Policy{}
	method := func(service, name string) string { return "/" + service + "/" + name }
	cur := curatorv1.Curator_ServiceDesc.ServiceName
	p[method(cur, "BootstrapCluster")] = rpc.Rule{Allow: []pki.Kind{pki.KindAdmin, pki.KindNode}}
	p[method(cur, "RegisterNode")] = rpc.Rule{Allow: []pki.Kind{pki.KindEnrolling}}
	p[method(cur, "CommitNode")] = rpc.Rule{Allow: []pki.Kind{pki.KindEnrolling}}
	p[method(cur, "Watch")] = rpc.Rule{Allow: []pki.Kind{pki.KindNode, pki.KindEnrolling, pki.KindCurator, pki.KindReconciler, pki.KindAdmin}}
	p[method(cur, "UpdateNodeStatus")] = rpc.Rule{Allow: []pki.Kind{pki.KindNode}}
	p[method(cur, "Heartbeat")] = rpc.Rule{Allow: []pki.Kind{pki.KindNode}}
	p[method(cur, "GetCurrentLeader")] = rpc.Rule{Allow: []pki.Kind{pki.KindAdmin, pki.KindCurator, pki.KindReconciler, pki.KindNode, pki.KindConsensus}}
	p[method(cur, "IssueCertificates")] = rpc.Rule{Allow: []pki.Kind{pki.KindNode}}
	p[method(cur, "GetMembership")] = rpc.Rule{Allow: []pki.Kind{pki.KindConsensus}}
	p[method(cur, "WatchCRL")] = rpc.Rule{Allow: []pki.Kind{pki.KindAdmin, pki.KindCurator, pki.KindReconciler, pki.KindNode, pki.KindConsensus, pki.KindEnrolling}}
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
