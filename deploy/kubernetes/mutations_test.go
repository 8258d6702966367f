package kubernetes

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// setArg replaces (or, with no such flag, appends) --name=value in args.
func setArg(args []string, name, value string) []string {
	for i, a := range args {
		if a == "--"+name || strings.HasPrefix(a, "--"+name+"=") {
			args[i] = "--" + name + "=" + value
			return args
		}
	}
	return append(args, "--"+name+"="+value)
}

// TestChecksCatchMutations: each invariant fails on a manifest broken the
// way it guards against, so that none of them passes by default.
func TestChecksCatchMutations(t *testing.T) {
	for name, tc := range map[string]struct {
		check  string
		mutate func(m *manifests)
		want   string
	}{
		"a reconciler mounts the curators' secret (and its CA key)": {
			check: "one identity, one secret",
			mutate: func(m *manifests) {
				pod := &m.deployments["curia-reconciler"].Spec.Template
				pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "stolen", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: SecretCurator}}})
				pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "stolen", MountPath: "/stolen"})
			},
			want: "Deployment/curia-reconciler/reconciler can read secret curia-curator",
		},
		"every node pod gets the bootstrap node's key": {
			check: "one identity, one secret",
			mutate: func(m *manifests) {
				pod := &m.statefulSets["curia-node"].Spec.Template
				pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "seed", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: SecretSeed}}}}}}})
			},
			want: "StatefulSet/curia-node: volume seed shows secret curia-seed",
		},
		"the seed's consensus reads the agent's key from the environment": {
			check: "one identity, one secret",
			mutate: func(m *manifests) {
				c := container(&m.statefulSets["curia-seed"].Spec.Template, "consensus")
				c.Env = append(c.Env, corev1.EnvVar{Name: "KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: SecretSeed}, Key: KeyNodeKey}}})
			},
			want: "StatefulSet/curia-seed/consensus can read secret curia-seed",
		},
		"the curator lost its secret": {
			check: "one identity, one secret",
			mutate: func(m *manifests) {
				c := &m.deployments["curia-curator"].Spec.Template.Spec.Containers[0]
				c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.MountPath == "/secrets" })
			},
			want: "does not mount its secret curia-curator",
		},
		"the curators' snapshots on a read-only mount": {
			check: "files on volumes",
			mutate: func(m *manifests) {
				c := &m.deployments["curia-curator"].Spec.Template.Spec.Containers[0]
				for i := range c.VolumeMounts {
					if c.VolumeMounts[i].MountPath == "/snapshots" {
						c.VolumeMounts[i].ReadOnly = true
					}
				}
			},
			want: "--snapshot-dir=/snapshots is on a read-only mount",
		},
		"two node budgets of one each": {
			check: "disruption budgets",
			mutate: func(m *manifests) {
				m.pdbs["curia-node"].Spec.Selector.MatchLabels["curia.dev/node-set"] = "node"
			},
			want: "the nodes' budget must cover exactly",
		},
		"two nodes may go at once": {
			check: "disruption budgets",
			mutate: func(m *manifests) {
				two := intstr.FromInt32(2)
				m.pdbs["curia-node"].Spec.MaxUnavailable = &two
			},
			want: "keep their quorum",
		},
		"the curators' budget lets a drain take them all": {
			check: "disruption budgets",
			mutate: func(m *manifests) {
				two := intstr.FromInt32(2)
				m.pdbs["curia-curator"].Spec.MaxUnavailable = &two
			},
			want: "lets a drain take all 2 replicas",
		},
		"a budget selects nothing": {
			check: "disruption budgets",
			mutate: func(m *manifests) {
				m.pdbs["curia-reconciler"].Spec.Selector.MatchLabels["app.kubernetes.io/component"] = "reconcilers"
			},
			want: "PodDisruptionBudget/curia-reconciler selects no pods",
		},
		"the curator has no readiness probe": {
			check: "readiness",
			mutate: func(m *manifests) {
				m.deployments["curia-curator"].Spec.Template.Spec.Containers[0].ReadinessProbe = nil
			},
			want: "Deployment/curia-curator/curator has no readiness probe",
		},
		"the kubelet's plaintext gRPC probe": {
			check: "readiness",
			mutate: func(m *manifests) {
				p := m.deployments["curia-reconciler"].Spec.Template.Spec.Containers[0].ReadinessProbe
				p.Exec, p.GRPC = nil, &corev1.GRPCAction{Port: 7300}
			},
			want: "want gRPC health over mTLS",
		},
		"the reconciler's probe asks the curator's port": {
			check: "readiness",
			mutate: func(m *manifests) {
				p := m.deployments["curia-reconciler"].Spec.Template.Spec.Containers[0].ReadinessProbe
				p.Exec.Command = setArg(p.Exec.Command, "addr", "127.0.0.1:7200")
			},
			want: "want 127.0.0.1 and the --listen port 7300",
		},
		"a probe timeout shorter than curia-probe's": {
			check: "readiness",
			mutate: func(m *manifests) {
				container(&m.statefulSets["curia-node"].Spec.Template, "consensus").ReadinessProbe.TimeoutSeconds = 1
			},
			want: "the kubelet kills curia-probe",
		},
		"ready when merely alive": {
			check: "readiness",
			mutate: func(m *manifests) {
				p := m.deployments["curia-reconciler"].Spec.Template.Spec.Containers[0].ReadinessProbe
				p.Exec.Command = append(p.Exec.Command, "--live")
			},
			want: "Deployment/curia-reconciler/reconciler: readiness probe with --live",
		},
		"the seed's consensus has no startup probe": {
			check: "liveness",
			mutate: func(m *manifests) {
				container(&m.statefulSets["curia-seed"].Spec.Template, "consensus").StartupProbe = nil
			},
			want: "StatefulSet/curia-seed/consensus has no startup probe",
		},
		"a liveness probe that restarts a member waiting for its quorum": {
			check: "liveness",
			mutate: func(m *manifests) {
				p := container(&m.statefulSets["curia-node"].Spec.Template, "consensus").LivenessProbe
				p.Exec.Command = slices.DeleteFunc(p.Exec.Command, func(a string) bool { return a == "--live" })
			},
			want: "StatefulSet/curia-node/consensus: liveness probe without --live",
		},
		"the kubelet's HTTP liveness probe, for which 503 is dead": {
			check: "liveness",
			mutate: func(m *manifests) {
				p := container(&m.statefulSets["curia-node"].Spec.Template, "roleserve").LivenessProbe
				p.Exec, p.HTTPGet = nil, &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(9400)}
			},
			want: "StatefulSet/curia-node/roleserve: liveness by",
		},
		"a startup probe that gives a start 15 s": {
			check: "liveness",
			mutate: func(m *manifests) {
				p := m.deployments["curia-curator"].Spec.Template.Spec.Containers[0].StartupProbe
				p.FailureThreshold = 3
			},
			want: "Deployment/curia-curator/curator: startup probe gives up after 15s",
		},
		"the agent's liveness asks with the certificate of its enrolment": {
			check: "liveness",
			mutate: func(m *manifests) {
				p := container(&m.statefulSets["curia-node"].Spec.Template, "roleserve").LivenessProbe
				p.Exec.Command = []string{"/bin/curia-probe", "--quiet", "--live", "--addr=127.0.0.1:7400", "--ca=/public/ca.crt", "--cert=/data/agent/node.crt", "--key=/data/agent/node.key"}
			},
			want: "liveness probe --cert=/data/agent/node.crt is on no Secret volume",
		},
		"consensus requests no memory": {
			check: "resource requests",
			mutate: func(m *manifests) {
				delete(container(&m.statefulSets["curia-node"].Spec.Template, "consensus").Resources.Requests, corev1.ResourceMemory)
			},
			want: "StatefulSet/curia-node/consensus requests no memory",
		},
		"the init container requests zero CPU": {
			check: "resource requests",
			mutate: func(m *manifests) {
				container(&m.statefulSets["curia-node"].Spec.Template, "node-key").Resources.Requests[corev1.ResourceCPU] = resource.MustParse("0")
			},
			want: "StatefulSet/curia-node/node-key requests no cpu",
		},
		"consensus without a memory limit": {
			check: "resource limits",
			mutate: func(m *manifests) {
				delete(container(&m.statefulSets["curia-seed"].Spec.Template, "consensus").Resources.Limits, corev1.ResourceMemory)
			},
			want: "StatefulSet/curia-seed/consensus has no memory limit",
		},
		"a memory limit below the request": {
			check: "resource limits",
			mutate: func(m *manifests) {
				m.deployments["curia-curator"].Spec.Template.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory] = resource.MustParse("64Mi")
			},
			want: "Deployment/curia-curator/curator: memory limit 64Mi below its request 128Mi",
		},
		"a CPU limit on consensus": {
			check: "resource limits",
			mutate: func(m *manifests) {
				container(&m.statefulSets["curia-node"].Spec.Template, "consensus").Resources.Limits[corev1.ResourceCPU] = resource.MustParse("500m")
			},
			want: "StatefulSet/curia-node/consensus: CPU limit 500m: CFS throttling",
		},
		"an image from a registry that does not exist": {
			check: "images",
			mutate: func(m *manifests) {
				m.deployments["curia-curator"].Spec.Template.Spec.Containers[0].Image = "curia:latest"
			},
			want: "runs image curia:latest, want curia:dev",
		},
		"always pulled": {
			check: "images",
			mutate: func(m *manifests) {
				m.jobs["curia-bootstrap"].Spec.Template.Spec.Containers[0].ImagePullPolicy = corev1.PullAlways
			},
			want: "there is no registry",
		},
		"a binary the image lacks": {
			check: "images",
			mutate: func(m *manifests) {
				m.deployments["curia-curator"].Spec.Template.Spec.Containers[0].Command = []string{"/bin/etcd"}
			},
			want: "runs [/bin/etcd]",
		},
		"the node Service is not headless": {
			check:  "headless service",
			mutate: func(m *manifests) { m.services[ServiceNodes].Spec.ClusterIP = "" },
			want:   "is not headless",
		},
		"a StatefulSet names another Service": {
			check:  "headless service",
			mutate: func(m *manifests) { m.statefulSets["curia-node"].Spec.ServiceName = "curia-nodes" },
			want:   `serviceName "curia-nodes" is no Service here`,
		},
		"peers cannot resolve a member before it is ready": {
			check:  "headless service",
			mutate: func(m *manifests) { m.services[ServiceNodes].Spec.PublishNotReadyAddresses = false },
			want:   "publishNotReadyAddresses false",
		},
		"the curator reads a CA key file its secret does not have": {
			check: "files on volumes",
			mutate: func(m *manifests) {
				c := &m.deployments["curia-curator"].Spec.Template.Spec.Containers[0]
				c.Args = setArg(c.Args, "ca-key", "/secrets/ca.pem")
			},
			want: `Secret/curia-curator has no key "ca.pem"`,
		},
		"consensus keeps its data on the image": {
			check: "files on volumes",
			mutate: func(m *manifests) {
				c := container(&m.statefulSets["curia-node"].Spec.Template, "consensus")
				c.Args = setArg(c.Args, "data-dir", "/var/lib/consensus")
			},
			want: "is on no volume",
		},
		"consensus and the agent share a volume": {
			check: "files on volumes",
			mutate: func(m *manifests) {
				c := container(&m.statefulSets["curia-node"].Spec.Template, "consensus")
				c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "agent-data", MountPath: "/agent"})
			},
			want: "share the volume agent-data",
		},
		"the node key on a read-only mount": {
			check: "files on volumes",
			mutate: func(m *manifests) {
				container(&m.statefulSets["curia-node"].Spec.Template, "node-key").VolumeMounts[1].ReadOnly = true
			},
			want: "--id-file=/node-id/node.id is on a read-only mount",
		},
		"the curator can call the Kubernetes API": {
			check: "service account tokens",
			mutate: func(m *manifests) {
				m.deployments["curia-curator"].Spec.Template.Spec.AutomountServiceAccountToken = nil
			},
			want: "Deployment/curia-curator mounts a service account token",
		},
		"two bootstrap nodes": {
			check: "objects",
			mutate: func(m *manifests) {
				two := int32(2)
				m.statefulSets["curia-seed"].Spec.Replicas = &two
			},
			want: "StatefulSet/curia-seed has 2 replicas, want 1",
		},
		"a Service port nobody serves": {
			check:  "services",
			mutate: func(m *manifests) { m.services[ServiceCurator].Spec.Ports[1].TargetPort = intstr.FromString("http") },
			want:   "targetPort http is no port Deployment/curia-curator serves",
		},
		"a declared port nobody listens on": {
			check: "services",
			mutate: func(m *manifests) {
				c := &m.deployments["curia-curator"].Spec.Template.Spec.Containers[0]
				c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--listen-http=") })
			},
			want: "declares ports [7200 7201 9200] but listens on [7200 9200]",
		},
		"the curators look for etcd on a node that does not exist": {
			check: "addresses",
			mutate: func(m *manifests) {
				c := &m.deployments["curia-curator"].Spec.Template.Spec.Containers[0]
				c.Args = setArg(c.Args, "etcd", "https://curia-seed-0.curia-node:2379,https://curia-node-5.curia-node:2379")
			},
			want: "https://curia-node-5.curia-node:2379 is no node pod's 2379 port",
		},
		"a node advertises its pod IP": {
			check: "addresses",
			mutate: func(m *manifests) {
				c := container(&m.statefulSets["curia-node"].Spec.Template, "consensus")
				c.Args = setArg(c.Args, "advertise-peer-url", "https://$(POD_IP):2380")
			},
			want: "consensus --advertise-peer-url=https://$(POD_IP):2380",
		},
		"an agent asks a curator by another name": {
			check: "addresses",
			mutate: func(m *manifests) {
				c := container(&m.statefulSets["curia-node"].Spec.Template, "roleserve")
				c.Args = setArg(c.Args, "curator", "curator:7200")
			},
			want: "--curator=curator:7200, want curia-curator:7200",
		},
		"the Job waits for fewer nodes than run": {
			check: "bootstrap job",
			mutate: func(m *manifests) {
				c := &m.jobs["curia-bootstrap"].Spec.Template.Spec.Containers[0]
				c.Args = setArg(c.Args, "nodes", "3")
			},
			want: "curia-bootstrap --nodes=3, but the node StatefulSets have 4 replicas",
		},
		"the Job may list every secret": {
			check: "bootstrap job",
			mutate: func(m *manifests) {
				r := &m.roles["curia-bootstrap"].Rules[0]
				r.Verbs = append(r.Verbs, "list")
			},
			want: "verb list on secrets",
		},
		"the Job may read a secret it does not make": {
			check: "bootstrap job",
			mutate: func(m *manifests) {
				r := &m.roles["curia-bootstrap"].Rules[1]
				r.ResourceNames = append(r.ResourceNames, "some-tls")
			},
			want: "Role curia-bootstrap names secrets",
		},
		"secrets unreadable to the non-root processes": {
			check:  "security context",
			mutate: func(m *manifests) { m.statefulSets["curia-seed"].Spec.Template.Spec.SecurityContext.FSGroup = nil },
			want:   "StatefulSet/curia-seed has volumes but no fsGroup",
		},
		"a writable image": {
			check: "security context",
			mutate: func(m *manifests) {
				f := false
				m.deployments["curia-reconciler"].Spec.Template.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem = &f
			},
			want: "Deployment/curia-reconciler/reconciler: want a read-only root filesystem",
		},
		"every node pod claims one zone": {
			check: "zones",
			mutate: func(m *manifests) {
				c := container(&m.statefulSets["curia-node"].Spec.Template, "roleserve")
				c.Args = setArg(c.Args, "labels", "zone=zone-a")
			},
			want: "StatefulSet/curia-node roleserve --labels=zone=zone-a: want zone=$(VAR)",
		},
		"the agent's zone from another field": {
			check: "zones",
			mutate: func(m *manifests) {
				e := envVar(container(&m.statefulSets["curia-seed"].Spec.Template, "roleserve"), "NODE_ZONE")
				e.ValueFrom.FieldRef.FieldPath = "spec.nodeName"
			},
			want: "StatefulSet/curia-seed roleserve: $(NODE_ZONE) is",
		},
		"node pods not spread across zones": {
			check: "zones",
			mutate: func(m *manifests) {
				spec := &m.statefulSets["curia-node"].Spec.Template.Spec
				spec.TopologySpreadConstraints = slices.DeleteFunc(spec.TopologySpreadConstraints, func(c corev1.TopologySpreadConstraint) bool { return c.TopologyKey == zoneKey })
			},
			want: "StatefulSet/curia-node: no topologySpreadConstraint on topology.kubernetes.io/zone",
		},
		"the zone spread counts one StatefulSet only": {
			check: "zones",
			mutate: func(m *manifests) {
				for i, c := range m.statefulSets["curia-seed"].Spec.Template.Spec.TopologySpreadConstraints {
					if c.TopologyKey == zoneKey {
						sel := c.LabelSelector.DeepCopy()
						sel.MatchLabels["curia.dev/node-set"] = "seed"
						m.statefulSets["curia-seed"].Spec.Template.Spec.TopologySpreadConstraints[i].LabelSelector = sel
					}
				}
			},
			want: "matches StatefulSet/curia-node: false, want every node pod",
		},
		"the curators may join etcd's peers": {
			check: "network policies",
			mutate: func(m *manifests) {
				r := &m.networkPolicies["curia-node"].Spec.Ingress[0]
				r.From = append(r.From, networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/component": "curator"}}})
			},
			want: "Deployment/curia-curator can reach StatefulSet/curia-node port etcd-peer (2380), which it has no business with",
		},
		"the reconcilers cannot reach the consensus API": {
			check: "network policies",
			mutate: func(m *manifests) {
				for i, r := range m.networkPolicies["curia-node"].Spec.Ingress {
					if r.Ports[0].Port.StrVal == "consensus" {
						m.networkPolicies["curia-node"].Spec.Ingress[i].From = r.From[:2]
					}
				}
			},
			want: "Deployment/curia-reconciler cannot reach StatefulSet/curia-seed port consensus (7100), which it needs",
		},
		"metrics open to every namespace": {
			check: "network policies",
			mutate: func(m *manifests) {
				for _, r := range m.networkPolicies["curia-reconciler"].Spec.Ingress {
					r.From[0].NamespaceSelector = &metav1.LabelSelector{}
				}
			},
			want: "a pod of namespace other can reach Deployment/curia-reconciler port metrics (9300)",
		},
		"etcd's clients from any namespace that has curator pods": {
			check: "network policies",
			mutate: func(m *manifests) {
				r := &m.networkPolicies["curia-node"].Spec.Ingress[1]
				r.From[1].NamespaceSelector = &metav1.LabelSelector{}
			},
			want: "a curator-labelled pod of namespace other can reach StatefulSet/curia-node port etcd-client (2379)",
		},
		"the agents cannot reach the curators": {
			check: "network policies",
			mutate: func(m *manifests) {
				r := &m.networkPolicies["curia-curator"].Spec.Ingress[0]
				r.From[0].PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/component": "curator"}}
			},
			want: "StatefulSet/curia-node cannot reach Deployment/curia-curator port grpc (7200), which it needs",
		},
		"no default deny": {
			check:  "network policies",
			mutate: func(m *manifests) { delete(m.networkPolicies, "curia-default-deny") },
			want:   "no default deny",
		},
		"a port the policies were not told about": {
			check: "network policies",
			mutate: func(m *manifests) {
				c := &m.deployments["curia-reconciler"].Spec.Template.Spec.Containers[0]
				c.Ports = append(c.Ports, corev1.ContainerPort{Name: "debug", ContainerPort: 6060})
			},
			want: "Deployment/curia-reconciler port debug (6060): the check does not say who needs it",
		},
		"a rule for every port of the node pods": {
			check: "network policies",
			mutate: func(m *manifests) {
				m.networkPolicies["curia-node"].Spec.Ingress[0].Ports = nil
			},
			want: "StatefulSet/curia-node can reach StatefulSet/curia-seed port roleserve (7400)",
		},
		"curia-node rolls by itself on a new image": {
			check: "update strategy",
			mutate: func(m *manifests) {
				m.statefulSets["curia-node"].Spec.UpdateStrategy = appsv1.StatefulSetUpdateStrategy{Type: appsv1.RollingUpdateStatefulSetStrategyType}
			},
			want: "StatefulSet/curia-node: updateStrategy \"RollingUpdate\", want OnDelete",
		},
		"the curators' rollout takes one down before its successor is up": {
			check: "update strategy",
			mutate: func(m *manifests) {
				one := intstr.FromInt32(1)
				m.deployments["curia-curator"].Spec.Strategy.RollingUpdate.MaxUnavailable = &one
			},
			want: "Deployment/curia-curator: strategy",
		},
		"a reconciler counts as available the moment it is ready": {
			check:  "update strategy",
			mutate: func(m *manifests) { m.deployments["curia-reconciler"].Spec.MinReadySeconds = 0 },
			want:   "Deployment/curia-reconciler: minReadySeconds 0",
		},
		"the seed pod without the control plane's priority": {
			check:  "priority",
			mutate: func(m *manifests) { m.statefulSets["curia-seed"].Spec.Template.Spec.PriorityClassName = "" },
			want:   "StatefulSet/curia-seed: priorityClassName \"\", want curia-control-plane",
		},
		"the control plane above Kubernetes's own": {
			check:  "priority",
			mutate: func(m *manifests) { m.priorityClasses[priorityClass].Value = systemClusterCritical },
			want:   "below system-cluster-critical",
		},
		"no PriorityClass": {
			check:  "priority",
			mutate: func(m *manifests) { delete(m.priorityClasses, priorityClass) },
			want:   "no PriorityClass curia-control-plane",
		},
		"a crash-looping node pod blocks drains": {
			check:  "disruption budgets",
			mutate: func(m *manifests) { m.pdbs["curia-node"].Spec.UnhealthyPodEvictionPolicy = nil },
			want:   "PodDisruptionBudget/curia-node: unhealthyPodEvictionPolicy",
		},
		"etcd's quota raised, its volume not": {
			check: "consensus volume",
			mutate: func(m *manifests) {
				c := container(&m.statefulSets["curia-node"].Spec.Template, "consensus")
				c.Args = setArg(c.Args, quotaFlag, "4294967296")
			},
			want: "StatefulSet/curia-node: claim consensus-data asks for 5Gi, want at least 2 x --etcd-quota-backend-bytes (4294967296) + 1Gi = 9Gi",
		},
		"the seed's volume shrunk below its quota's room": {
			check: "consensus volume",
			mutate: func(m *manifests) {
				for i, c := range m.statefulSets["curia-seed"].Spec.VolumeClaimTemplates {
					if c.Name == "consensus-data" {
						m.statefulSets["curia-seed"].Spec.VolumeClaimTemplates[i].Spec.Resources.Requests["storage"] = resource.MustParse("4Gi")
					}
				}
			},
			want: "StatefulSet/curia-seed: claim consensus-data asks for 4Gi",
		},
		"etcd's quota left to its default": {
			check: "consensus volume",
			mutate: func(m *manifests) {
				c := container(&m.statefulSets["curia-seed"].Spec.Template, "consensus")
				c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--"+quotaFlag+"=") })
			},
			want: "StatefulSet/curia-seed consensus: --etcd-quota-backend-bytes=\"\": say etcd's backend quota",
		},
		"the finished bootstrap Job stays": {
			check:  "bootstrap job ttl",
			mutate: func(m *manifests) { m.jobs["curia-bootstrap"].Spec.TTLSecondsAfterFinished = nil },
			want:   "the next apply with another image would fail on it",
		},
		"an unresolved $(POD_NAME)": {
			check: "env references",
			mutate: func(m *manifests) {
				container(&m.statefulSets["curia-seed"].Spec.Template, "roleserve").Env = nil
			},
			want: "refers to $(POD_NAME), which its env does not define",
		},
	} {
		t.Run(name, func(t *testing.T) {
			m := render(t, "overlays/local")
			var fn func(*manifests) []error
			for _, c := range checks {
				if c.name == tc.check {
					fn = c.fn
				}
			}
			if fn == nil {
				t.Fatalf("no check %q", tc.check)
			}
			if errs := fn(m); len(errs) > 0 {
				t.Fatalf("check %q fails before the mutation: %s", tc.check, errorsText(errs))
			}
			tc.mutate(m)
			errs := fn(m)
			if !contains(errs, tc.want) {
				t.Fatalf("check %q after the mutation: %v, want an error saying %q", tc.check, errs, tc.want)
			}
		})
	}
}

// TestStrictDecoding: a field the k8s.io/api types do not have — here a
// misspelt readinessProbe, which the API server would drop with a warning
// and the pod would never be probed — fails the rendering.
func TestStrictDecoding(t *testing.T) {
	fs := filesys.MakeFsInMemory()
	for _, dir := range []string{"base", "overlays/local"} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if e.Name() == "curator.yaml" {
				b = []byte(strings.Replace(string(b), "readinessProbe:", "readinesProbe:", 1))
			}
			if err := fs.WriteFile(filepath.Join("/", dir, e.Name()), b); err != nil {
				t.Fatal(err)
			}
		}
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, "/overlays/local")
	if err != nil {
		t.Fatal(err)
	}
	_, err = decodeAll(res.Resources())
	if err == nil || !strings.Contains(err.Error(), `Deployment curia-curator: error unmarshaling JSON: while decoding JSON: json: unknown field "readinesProbe"`) {
		t.Fatalf("decoding a Deployment with readinesProbe: %v, want an unknown field error", err)
	}
}
