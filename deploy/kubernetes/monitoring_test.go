package kubernetes

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// TestMonitoringComponent: components/monitoring (optional: its
// ServiceMonitor needs the prometheus-operator's CRD, so only
// overlays/local-monitoring has it) renders on top of the local overlay; each of
// its Services selects pods that name its target ports; its ServiceMonitor
// selects those Services and scrapes ports they have, /metrics/etcd of
// the consensus port among them.
func TestMonitoringComponent(t *testing.T) {
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "overlays/local-monitoring")
	if err != nil {
		t.Fatalf("kustomize build overlays/local-monitoring: %v", err)
	}
	var monitors []*resource.Resource
	rest := slices.DeleteFunc(res.Resources(), func(r *resource.Resource) bool {
		if r.GetKind() == "ServiceMonitor" {
			monitors = append(monitors, r)
			return true
		}
		return false
	})
	m, err := decodeAll(rest)
	if err != nil {
		t.Fatal(err)
	}
	if len(monitors) != 1 || monitors[0].GetNamespace() != "curia" {
		t.Fatalf("ServiceMonitors %v, want one in namespace curia", monitors)
	}
	// The pods' templates, with the names of their container ports.
	type pod struct {
		labels labels.Set
		ports  []string
	}
	var pods []pod
	add := func(tpl corev1.PodTemplateSpec) {
		p := pod{labels: tpl.Labels}
		for _, c := range tpl.Spec.Containers {
			for _, port := range c.Ports {
				p.ports = append(p.ports, port.Name)
			}
		}
		pods = append(pods, p)
	}
	for _, s := range m.statefulSets {
		add(s.Spec.Template)
	}
	for _, d := range m.deployments {
		add(d.Spec.Template)
	}
	ports := map[string]bool{} // of the Services the monitor selects
	sel := labels.SelectorFromSet(labels.Set{"app.kubernetes.io/name": "curia", "curia.dev/metrics": "true"})
	for name, svc := range m.services {
		if !sel.Matches(labels.Set(svc.Labels)) {
			continue
		}
		selected := 0
		for _, p := range pods {
			if !labels.SelectorFromSet(svc.Spec.Selector).Matches(p.labels) {
				continue
			}
			selected++
			for _, sp := range svc.Spec.Ports {
				if !slices.Contains(p.ports, sp.TargetPort.StrVal) {
					t.Errorf("Service %s: target port %q is not a port of the pods it selects (%v)", name, sp.TargetPort.StrVal, p.ports)
				}
			}
		}
		if selected == 0 {
			t.Errorf("Service %s selects no pods", name)
		}
		for _, sp := range svc.Spec.Ports {
			ports[sp.Name] = true
		}
	}
	spec, _ := monitors[0].GetFieldValue("spec.selector.matchLabels")
	if want := map[string]any{"app.kubernetes.io/name": "curia", "curia.dev/metrics": "true"}; !equalMaps(spec, want) {
		t.Errorf("ServiceMonitor selects %v, want %v", spec, want)
	}
	eps, err := monitors[0].GetSlice("spec.endpoints")
	if err != nil {
		t.Fatal(err)
	}
	var scraped []string
	for _, e := range eps {
		e := e.(map[string]any)
		port, _ := e["port"].(string)
		if !ports[port] {
			t.Errorf("ServiceMonitor scrapes port %q, which no selected Service has (%v)", port, ports)
		}
		scraped = append(scraped, port+e["path"].(string))
	}
	for _, want := range []string{"metrics-cons/metrics", "metrics-cons/metrics/etcd", "metrics-agent/metrics", "metrics/metrics"} {
		if !slices.Contains(scraped, want) {
			t.Errorf("ServiceMonitor does not scrape %s (it scrapes %v)", want, scraped)
		}
	}
}

func equalMaps(got any, want map[string]any) bool {
	g, ok := got.(map[string]any)
	if !ok || len(g) != len(want) {
		return false
	}
	for k, v := range want {
		if g[k] != v {
			return false
		}
	}
	return true
}
