package kubernetes

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// manifests is a rendered kustomization, every object decoded strictly
// into its k8s.io/api type.
type manifests struct {
	namespace       string
	services        map[string]*corev1.Service
	namespaces      map[string]*corev1.Namespace
	serviceAccounts map[string]*corev1.ServiceAccount
	statefulSets    map[string]*appsv1.StatefulSet
	deployments     map[string]*appsv1.Deployment
	jobs            map[string]*batchv1.Job
	pdbs            map[string]*policyv1.PodDisruptionBudget
	roles           map[string]*rbacv1.Role
	roleBindings    map[string]*rbacv1.RoleBinding
	networkPolicies map[string]*networkingv1.NetworkPolicy
	priorityClasses map[string]*schedulingv1.PriorityClass
}

// decodeStrict decodes one manifest into a new T; a field T does not have
// (a typo, a field at the wrong level) fails, as does a duplicate field.
func decodeStrict[T any](b []byte) (*T, error) {
	out := new(T)
	if err := yaml.UnmarshalStrict(b, out); err != nil {
		return nil, err
	}
	return out, nil
}

// put decodes b as T into m under its name, refusing a second object of
// the same kind and name.
func put[T any](m map[string]*T, name string, b []byte) error {
	v, err := decodeStrict[T](b)
	if err != nil {
		return err
	}
	if _, dup := m[name]; dup {
		return fmt.Errorf("two objects named %s", name)
	}
	m[name] = v
	return nil
}

// render runs kustomize (krusty, as kubectl apply -k does) on dir and
// decodes every object strictly.
func render(t *testing.T, dir string) *manifests {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	m, err := decodeAll(res.Resources())
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	return m
}

func decodeAll(rs []*resource.Resource) (*manifests, error) {
	m := &manifests{
		services: map[string]*corev1.Service{}, namespaces: map[string]*corev1.Namespace{},
		serviceAccounts: map[string]*corev1.ServiceAccount{}, statefulSets: map[string]*appsv1.StatefulSet{},
		deployments: map[string]*appsv1.Deployment{}, jobs: map[string]*batchv1.Job{},
		pdbs: map[string]*policyv1.PodDisruptionBudget{}, roles: map[string]*rbacv1.Role{},
		roleBindings: map[string]*rbacv1.RoleBinding{}, networkPolicies: map[string]*networkingv1.NetworkPolicy{},
		priorityClasses: map[string]*schedulingv1.PriorityClass{},
	}
	namespaces := map[string]bool{}
	for _, r := range rs {
		b, err := r.AsYAML()
		if err != nil {
			return nil, err
		}
		kind, name := r.GetApiVersion()+"/"+r.GetKind(), r.GetName()
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, fmt.Errorf("%s %q: %v", kind, name, errs)
		}
		// Cluster-scoped objects have no namespace.
		if clusterScoped := kind == "v1/Namespace" || kind == "scheduling.k8s.io/v1/PriorityClass"; !clusterScoped {
			namespaces[r.GetNamespace()] = true
		} else if r.GetNamespace() != "" {
			return nil, fmt.Errorf("%s %s: a cluster-scoped object in namespace %s", kind, name, r.GetNamespace())
		}
		switch kind {
		case "v1/Service":
			err = put(m.services, name, b)
		case "v1/Namespace":
			err = put(m.namespaces, name, b)
		case "v1/ServiceAccount":
			err = put(m.serviceAccounts, name, b)
		case "apps/v1/StatefulSet":
			err = put(m.statefulSets, name, b)
		case "apps/v1/Deployment":
			err = put(m.deployments, name, b)
		case "batch/v1/Job":
			err = put(m.jobs, name, b)
		case "policy/v1/PodDisruptionBudget":
			err = put(m.pdbs, name, b)
		case "rbac.authorization.k8s.io/v1/Role":
			err = put(m.roles, name, b)
		case "rbac.authorization.k8s.io/v1/RoleBinding":
			err = put(m.roleBindings, name, b)
		case "networking.k8s.io/v1/NetworkPolicy":
			err = put(m.networkPolicies, name, b)
		case "scheduling.k8s.io/v1/PriorityClass":
			err = put(m.priorityClasses, name, b)
		default:
			err = errors.New("a kind this test does not know: add it to decodeAll")
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", kind, name, err)
		}
	}
	if len(namespaces) != 1 {
		return nil, fmt.Errorf("objects in namespaces %v, want one", slices.Collect(maps.Keys(namespaces)))
	}
	for ns := range namespaces {
		m.namespace = ns
	}
	return m, nil
}

// workload is a Deployment, StatefulSet or Job, as far as its pods go.
type workload struct {
	kind, name string
	replicas   int
	selector   labels.Selector
	pod        *corev1.PodTemplateSpec
	// claims are a StatefulSet's volumeClaimTemplates: volumes too.
	claims []string
}

func (w workload) String() string { return w.kind + "/" + w.name }

// workloads are every workload, in a fixed order.
func (m *manifests) workloads() ([]workload, error) {
	var out []workload
	for _, name := range slices.Sorted(maps.Keys(m.statefulSets)) {
		s := m.statefulSets[name]
		sel, err := metav1.LabelSelectorAsSelector(s.Spec.Selector)
		if err != nil {
			return nil, fmt.Errorf("StatefulSet/%s: selector: %w", name, err)
		}
		w := workload{kind: "StatefulSet", name: name, replicas: int(ptrOr(s.Spec.Replicas, 1)), selector: sel, pod: &s.Spec.Template}
		for _, c := range s.Spec.VolumeClaimTemplates {
			w.claims = append(w.claims, c.Name)
		}
		out = append(out, w)
	}
	for _, name := range slices.Sorted(maps.Keys(m.deployments)) {
		d := m.deployments[name]
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil {
			return nil, fmt.Errorf("Deployment/%s: selector: %w", name, err)
		}
		out = append(out, workload{kind: "Deployment", name: name, replicas: int(ptrOr(d.Spec.Replicas, 1)), selector: sel, pod: &d.Spec.Template})
	}
	for _, name := range slices.Sorted(maps.Keys(m.jobs)) {
		j := m.jobs[name]
		out = append(out, workload{kind: "Job", name: name, replicas: int(ptrOr(j.Spec.Parallelism, 1)), selector: labels.Everything(), pod: &j.Spec.Template})
	}
	return out, nil
}

// containers are a pod's init containers and containers.
func containers(pod *corev1.PodTemplateSpec) []*corev1.Container {
	var out []*corev1.Container
	for i := range pod.Spec.InitContainers {
		out = append(out, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		out = append(out, &pod.Spec.Containers[i])
	}
	return out
}

// flagArgs splits a container's arguments of the form --name=value or
// --name (a boolean) into their values, each name once. The manifests
// write flags that way only, so that each reads on its own.
func flagArgs(args []string) (map[string]string, error) {
	out := map[string]string{}
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			return nil, fmt.Errorf("argument %q: write flags as --name=value or --name", a)
		}
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok {
			value = "true"
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--%s given twice", name)
		}
		out[name] = value
	}
	return out, nil
}

func TestFlagArgs(t *testing.T) {
	got, err := flagArgs([]string{"--a=1", "--b", "--c=x=y"})
	if err != nil || !maps.Equal(got, map[string]string{"a": "1", "b": "true", "c": "x=y"}) {
		t.Fatalf("flagArgs = %v, %v", got, err)
	}
	for _, bad := range [][]string{{"-a=1"}, {"--a", "1"}, {"--a=1", "--a=2"}} {
		if _, err := flagArgs(bad); err == nil {
			t.Errorf("flagArgs(%q) accepted", bad)
		}
	}
}
