// Package kubernetes runs curia's services on an existing Kubernetes
// cluster: the kustomize base in base/ (overlays/local puts it in the
// namespace curia) and curia-kube, the command of its one-shot bootstrap
// Job, of the node pods' init container, and of the operator's rolling
// restart (curia-kube roll: Roll, a platform/rolling Fleet over kubectl).
//
//	curia-seed (StatefulSet, 1)      consensus + roleserve: the bootstrap node
//	curia-node (StatefulSet, N)      consensus + roleserve, each node's key made in its pod
//	     └── curia-node (headless Service): stable peer names <pod>.curia-node
//	curia-curator (Deployment, N)    ── curia-curator (headless Service: every ready replica)
//	curia-reconciler (Deployment, N) ── curia-reconciler (headless Service)
//	curia-bootstrap (Job)            PKI into Secrets, then the cluster's first shape (deleted 5 min after it finished)
//	NetworkPolicies (network.yaml)   ingress denied but what each process needs
//	curia-control-plane (PriorityClass, priority.yaml)  every pod above but the Job's
//
// Restarts and upgrades (docs/operating/upgrading.md): the node
// StatefulSets are OnDelete, so a new image restarts no node pod; curia-kube
// roll deletes them one at a time, in platform/rolling's order, each node
// in maintenance, then the curators' and reconcilers' pods (the
// Deployments replace one replica at a time themselves on a new template:
// maxUnavailable 0, maxSurge 1, minReadySeconds).
//
//	roll.go        RollConfig, Roll: the refusals (no kubectl, no curia StatefulSets, not healthy), pod <-> node
//	roll_fleet.go  kubeFleet: rolling.Fleet over kubectl (delete a pod, wait for its successor Ready)
//
// One identity, one Secret (DESIGN §2), each mounted only by the container
// that is that identity:
//
//	Secret                 keys                                  mounted by
//	curia-admin            tls.crt tls.key                       nobody: the operator's (kubectl get secret)
//	curia-curator          tls.crt tls.key ca.key                curia-curator/curator
//	curia-reconciler       tls.crt tls.key                       curia-reconciler/reconciler
//	curia-seed             node.key bootstrap.crt                curia-seed/roleserve
//	curia-seed-consensus   tls.key tls.crt member.crt            curia-seed/consensus
//	curia-register-ticket  ticket                                curia-node/roleserve (a ticket, no key)
//	ConfigMap curia-public ca.crt crl.pem seed.id                everyone
//
// Why the bootstrap node is a StatefulSet of its own: every pod of a
// StatefulSet has the same template, so per-pod Secrets cannot be mounted
// without mounting all of them in every pod. Only the bootstrap node needs
// key material from the deployment (etcd's first member starts before any
// curator could certify it), so it is the one-replica curia-seed with its
// two Secrets. Every pod of curia-node makes its node key on its own
// volume at its first start (curia-kube node-key, an init container) and
// registers with the ticket, as a newly installed machine does; its
// consensus process makes its key in its data, and the curators certify
// both. Neither node StatefulSet can be given another node's key.
//
// Monitoring is optional: components/monitoring adds headless Services over
// the metrics ports and a prometheus-operator ServiceMonitor (/metrics of
// every process, /metrics/etcd of the consensus processes), which needs
// that operator's CRD; overlays/local-monitoring is overlays/local with it
// (docs/metrics.md; the alerts are in deploy/observability).
//
// Off-site snapshots are optional too: components/offsite gives the
// curators --snapshot-offsite and the object storage's endpoint and keys
// from the Secret curia-s3 (overlays/local-offsite is overlays/local with
// it), so that snapshots outlive the curators' emptyDir.
package kubernetes

// The names the bootstrap Job writes and the manifests mount. The
// manifests test checks that both agree.
//
//nolint:gosec // G101: the names of Secrets, not their contents
const (
	SecretAdmin          = "curia-admin"
	SecretCurator        = "curia-curator"
	SecretReconciler     = "curia-reconciler"
	SecretSeed           = "curia-seed"
	SecretSeedConsensus  = "curia-seed-consensus"
	SecretRegisterTicket = "curia-register-ticket"
	ConfigMapPublic      = "curia-public"

	// Keys of the Secrets and the ConfigMap: the files their volumes
	// show.
	KeyTLSCert    = "tls.crt"
	KeyTLSKey     = "tls.key"
	KeyCAKey      = "ca.key"
	KeyNodeKey    = "node.key"
	KeyBootCert   = "bootstrap.crt"
	KeyMemberCert = "member.crt"
	KeyTicket     = "ticket"
	KeyCACert     = "ca.crt"
	KeyCRL        = "crl.pem"
	KeySeedID     = "seed.id"
)
