package kubernetes

import (
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The NetworkPolicies' invariant: who may open a connection to which port
// of which pod, worked out from the policies as a network plugin would
// (NetworkPolicy semantics: a pod selected by no policy takes everything;
// one selected by some takes what one of their rules admits), for every
// pod here and for pods of other namespaces, and compared with what each
// process needs, port by port (base/network.yaml's table).

// source is where a connection comes from: a pod of a workload here, or a
// pod of another namespace.
type source struct {
	name      string
	namespace map[string]string // the namespace's labels
	pod       map[string]string // the pod's labels
}

// namespaceName is the label Kubernetes gives every namespace, its name.
const namespaceName = "kubernetes.io/metadata.name"

// monitoringNamespace is where the metrics are scraped from.
const monitoringNamespace = "monitoring"

// Who needs which port, by the workload serving it and the port's name:
// "nodes" (both node StatefulSets), "curator", "reconciler", "namespace"
// (every pod here, the Job's too) and "monitoring" (any pod of the
// monitoring namespace). A port not listed here fails the check, so that a
// new port is a decision.
var needs = map[string]map[string][]string{
	"nodes": {
		"etcd-peer":     {"nodes"},
		"etcd-client":   {"nodes", "curator"},
		"consensus":     {"nodes", "curator", "reconciler"},
		"roleserve":     nil, // operators: kubectl port-forward
		"metrics-cons":  {"monitoring"},
		"metrics-agent": {"monitoring"},
	},
	"curator": {
		"grpc":    {"namespace"},
		"connect": {"namespace"},
		"metrics": {"monitoring"},
	},
	"reconciler": {
		"grpc":    nil, // operators: kubectl port-forward
		"metrics": {"monitoring"},
	},
}

// group is the group of needs a workload belongs to ("" for the Job).
func group(w workload) string {
	switch {
	case w.kind == "StatefulSet" && slices.Contains(nodeSets, w.name):
		return "nodes"
	case w.kind == "Deployment" && w.name == "curia-curator":
		return "curator"
	case w.kind == "Deployment" && w.name == "curia-reconciler":
		return "reconciler"
	}
	return ""
}

func checkNetworkPolicies(m *manifests) []error {
	var errs []error
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	ns := m.namespace
	if ns == "" {
		ns = "default" // the base, applied as is
	}
	here := map[string]string{namespaceName: ns}
	var sources []source
	for _, w := range ws {
		sources = append(sources, source{name: w.String(), namespace: here, pod: w.pod.Labels})
	}
	// Pods elsewhere: Prometheus, anything in another namespace, and a
	// pod there that wears curia's labels (a selector of pods without a
	// namespace selector must not take it).
	sources = append(sources,
		source{name: "a pod of namespace " + monitoringNamespace, namespace: map[string]string{namespaceName: monitoringNamespace}, pod: map[string]string{"app.kubernetes.io/name": "prometheus"}},
		source{name: "a pod of namespace other", namespace: map[string]string{namespaceName: "other"}, pod: map[string]string{}},
		source{name: "a curator-labelled pod of namespace other", namespace: map[string]string{namespaceName: "other"}, pod: map[string]string{"app.kubernetes.io/name": "curia", "app.kubernetes.io/component": "curator"}},
	)
	needed := func(who []string, src source, srcGroup string) bool {
		for _, g := range who {
			switch {
			case g == "namespace" && maps.Equal(src.namespace, here):
				return true
			case g == monitoringNamespace && src.namespace[namespaceName] == monitoringNamespace:
				return true
			case g == srcGroup && maps.Equal(src.namespace, here):
				return true
			}
		}
		return false
	}

	// Every pod is isolated: a policy selects all of them and admits
	// nothing, so that a pod no other policy names takes nothing.
	defaultDeny := false
	for _, name := range slices.Sorted(maps.Keys(m.networkPolicies)) {
		p := m.networkPolicies[name]
		if len(p.Spec.PodSelector.MatchLabels)+len(p.Spec.PodSelector.MatchExpressions) == 0 && isolatesIngress(p) && len(p.Spec.Ingress) == 0 {
			defaultDeny = true
		}
		for _, r := range p.Spec.Ingress {
			for _, peer := range r.From {
				if peer.IPBlock != nil {
					errs = append(errs, fmt.Errorf("NetworkPolicy/%s admits ipBlock %s: addresses of pods change; name pods and namespaces", name, peer.IPBlock.CIDR))
				}
			}
		}
	}
	if !defaultDeny {
		errs = append(errs, fmt.Errorf("no default deny: want a NetworkPolicy selecting every pod (podSelector {}) with policyTypes [Ingress] and no rules"))
	}

	srcGroups := map[string]string{}
	for _, w := range ws {
		srcGroups[w.String()] = group(w)
	}
	for _, dst := range ws {
		g := group(dst)
		for _, c := range dst.pod.Spec.Containers {
			for _, port := range c.Ports {
				who, known := needs[g][port.Name]
				if !known {
					errs = append(errs, fmt.Errorf("%s port %s (%d): the check does not say who needs it: add it to needs", dst, port.Name, port.ContainerPort))
					continue
				}
				for _, src := range sources {
					got := admits(m, ns, dst, port, src)
					want := needed(who, src, srcGroups[src.name])
					switch {
					case got && !want:
						errs = append(errs, fmt.Errorf("%s can reach %s port %s (%d), which it has no business with (it is for %v)", src.name, dst, port.Name, port.ContainerPort, who))
					case !got && want:
						errs = append(errs, fmt.Errorf("%s cannot reach %s port %s (%d), which it needs", src.name, dst, port.Name, port.ContainerPort))
					}
				}
			}
		}
	}
	return errs
}

// isolatesIngress: the policy is about ingress (policyTypes empty means
// Ingress, and Egress only with egress rules).
func isolatesIngress(p *networkingv1.NetworkPolicy) bool {
	return len(p.Spec.PolicyTypes) == 0 || slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
}

// admits: a connection from src to port of dst's pods (in namespace ns) is
// let through by the policies.
func admits(m *manifests, ns string, dst workload, port corev1.ContainerPort, src source) bool {
	selected := false
	for _, p := range m.networkPolicies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil || !isolatesIngress(p) || !sel.Matches(labels.Set(dst.pod.Labels)) {
			continue
		}
		selected = true
		for _, r := range p.Spec.Ingress {
			if ruleHasPort(r, port) && ruleHasPeer(r, ns, src) {
				return true
			}
		}
	}
	return !selected
}

func ruleHasPort(r networkingv1.NetworkPolicyIngressRule, port corev1.ContainerPort) bool {
	if len(r.Ports) == 0 {
		return true
	}
	for _, p := range r.Ports {
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.Type == intstr.String:
			if p.Port.StrVal == port.Name {
				return true
			}
		case p.EndPort != nil:
			if port.ContainerPort >= p.Port.IntVal && port.ContainerPort <= *p.EndPort {
				return true
			}
		case p.Port.IntVal == port.ContainerPort:
			return true
		}
	}
	return false
}

func ruleHasPeer(r networkingv1.NetworkPolicyIngressRule, ns string, src source) bool {
	if len(r.From) == 0 {
		return true // from anywhere
	}
	for _, peer := range r.From {
		if peer.IPBlock != nil {
			continue // reported by the check
		}
		if peer.NamespaceSelector == nil {
			// Pods of the policy's own namespace.
			if src.namespace[namespaceName] != ns {
				continue
			}
		} else if nsSel, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector); err != nil || !nsSel.Matches(labels.Set(src.namespace)) {
			continue
		}
		if peer.PodSelector == nil {
			return true
		}
		if podSel, err := metav1.LabelSelectorAsSelector(peer.PodSelector); err == nil && podSel.Matches(labels.Set(src.pod)) {
			return true
		}
	}
	return false
}
