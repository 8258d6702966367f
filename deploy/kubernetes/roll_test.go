package kubernetes

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/rolling"
	"curia.dev/platform/rpc"
)

// curia-kube roll's logic that does not need a cluster: its flags, what
// it reads from kubectl's JSON and the registry, and its refusals. What it
// does with kubectl (delete a pod, wait for its successor) has run on no
// cluster yet: there is none on curia's machines.

func TestRollConfigValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		mutate func(*RollConfig)
		want   string // "": valid
	}{
		"the defaults":                     {mutate: func(*RollConfig) {}},
		"the admin's files":                {mutate: func(c *RollConfig) { c.TLS = rpc.TLSFiles{CA: "ca.crt", Cert: "admin.crt", Key: "admin.key"} }},
		"a key without its cert":           {mutate: func(c *RollConfig) { c.TLS = rpc.TLSFiles{CA: "ca.crt", Key: "admin.key"} }, want: "all three"},
		"no curator":                       {mutate: func(c *RollConfig) { c.Curator = "" }, want: "--curator is required"},
		"no kubectl":                       {mutate: func(c *RollConfig) { c.Kubectl = "" }, want: "--kubectl is required"},
		"a namespace kubectl would refuse": {mutate: func(c *RollConfig) { c.Namespace = "Curia_1" }, want: "--namespace"},
		"no namespace":                     {mutate: func(c *RollConfig) { c.Namespace = "" }, want: "--namespace"},
		"no time for a pod":                {mutate: func(c *RollConfig) { c.PodTimeout = 0 }, want: "positive"},
		"a bad cluster name":               {mutate: func(c *RollConfig) { c.Cluster = "no such/name" }, want: "cluster"},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := DefaultRollConfig()
			tc.mutate(&cfg)
			err := cfg.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestKubectlCommand(t *testing.T) {
	k := kubectl{path: "kubectl", namespace: "curia"}
	if got := k.command("get", "pods"); !slices.Equal(got, []string{"--namespace", "curia", "get", "pods"}) {
		t.Errorf("command = %q", got)
	}
	k.context = "kind-curia"
	if got := k.command("delete", "pod", "x"); !slices.Equal(got, []string{"--context", "kind-curia", "--namespace", "curia", "delete", "pod", "x"}) {
		t.Errorf("command with a context = %q", got)
	}
}

// nodeAt is a registry node as ListNodes answers, at an address.
func nodeAt(id, address string) *curatorv1.Node {
	return &curatorv1.Node{Id: id, State: curatorv1.NodeState_NODE_STATE_UP, Status: &curatorv1.NodeStatus{Address: address}}
}

// agentAddress is the address a node pod's agent registers with, as the
// rendered manifests give it (--address, $(POD_NAME) expanded).
func agentAddress(t *testing.T, m *manifests, set, pod string) string {
	t.Helper()
	f, err := flagArgs(container(&m.statefulSets[set].Spec.Template, "roleserve").Args)
	if err != nil {
		t.Fatal(err)
	}
	if f["address"] == "" {
		t.Fatalf("StatefulSet/%s roleserve has no --address", set)
	}
	return strings.ReplaceAll(f["address"], "$(POD_NAME)", pod)
}

func TestNodePods(t *testing.T) {
	m := render(t, "overlays/local")
	pods := []string{"curia-node-0", "curia-node-1", "curia-node-2", "curia-seed-0"}
	seed := nodeAt("n-seed", agentAddress(t, m, "curia-seed", "curia-seed-0"))
	registry := []*curatorv1.Node{
		seed,
		nodeAt("n0", agentAddress(t, m, "curia-node", "curia-node-0")),
		nodeAt("n1", agentAddress(t, m, "curia-node", "curia-node-1")),
		nodeAt("n2", agentAddress(t, m, "curia-node", "curia-node-2")),
	}
	t.Run("every pod a node", func(t *testing.T) {
		got, skipped, err := nodePods(registry, pods)
		want := []rolling.Node{{ID: "n-seed", Name: "curia-seed-0"}, {ID: "n0", Name: "curia-node-0"}, {ID: "n1", Name: "curia-node-1"}, {ID: "n2", Name: "curia-node-2"}}
		if err != nil || !slices.Equal(got, want) || len(skipped) > 0 {
			t.Fatalf("nodePods = %v, skipped %v, %v; want %v", got, skipped, err, want)
		}
	})
	t.Run("a node elsewhere is skipped", func(t *testing.T) {
		got, skipped, err := nodePods(append(slices.Clone(registry), nodeAt("far", "machine-7.example"), nodeAt("gone", "curia-node-9.curia-node")), pods)
		if err != nil || len(got) != 4 || len(skipped) != 2 || !strings.Contains(skipped[0], "far") || !strings.Contains(skipped[1], "gone") {
			t.Fatalf("nodePods = %v, skipped %v, %v", got, skipped, err)
		}
	})
	t.Run("a pod that is no node: refused", func(t *testing.T) {
		_, _, err := nodePods(registry, append(slices.Clone(pods), "curia-node-3"))
		if err == nil || !strings.Contains(err.Error(), "pod curia-node-3 is no node of the registry") {
			t.Fatalf("nodePods with an unregistered pod: %v", err)
		}
	})
	t.Run("two nodes at one pod: refused", func(t *testing.T) {
		_, _, err := nodePods(append(slices.Clone(registry), nodeAt("stale", registry[2].GetStatus().GetAddress())), pods)
		if err == nil || !strings.Contains(err.Error(), "nodes n1 and stale both have the address of pod curia-node-1") {
			t.Fatalf("nodePods with two nodes at one pod: %v", err)
		}
	})
}

// TestRollSelectors: the labels roll selects pods by are the manifests'.
func TestRollSelectors(t *testing.T) {
	m := render(t, "overlays/local")
	ws, err := m.workloads()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{selectNodes: "StatefulSet/curia-node StatefulSet/curia-seed", selectCurators: "Deployment/curia-curator", selectReconciler: "Deployment/curia-reconciler"}
	for sel, wantNames := range want {
		s, err := labels.Parse(sel)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, w := range ws {
			if s.Matches(labels.Set(w.pod.Labels)) {
				got = append(got, w.String())
			}
		}
		if strings.Join(got, " ") != wantNames {
			t.Errorf("selector %s matches %v, want %s", sel, got, wantNames)
		}
	}
	if !slices.Equal(nodeSetNames, nodeSets) {
		t.Errorf("roll's node StatefulSets %v, the manifests' %v", nodeSetNames, nodeSets)
	}
}

// sets are the StatefulSets as kubectl get statefulsets -o json shows
// them: the rendered manifests', through JSON.
func sets(t *testing.T, m *manifests) []appsv1.StatefulSet {
	t.Helper()
	var list appsv1.StatefulSetList
	for _, name := range slices.Sorted(maps.Keys(m.statefulSets)) {
		list.Items = append(list.Items, *m.statefulSets[name])
	}
	b, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	var out appsv1.StatefulSetList
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out.Items
}

// management answers GetConsensusStatus with st (a cluster's health), and
// nothing else.
type management struct {
	curatorv1.ManagementClient
	st *curatorv1.GetConsensusStatusResponse
}

func (m management) GetConsensusStatus(context.Context, *curatorv1.GetConsensusStatusRequest, ...grpc.CallOption) (*curatorv1.GetConsensusStatusResponse, error) {
	return m.st, nil
}

func TestPreflight(t *testing.T) {
	healthy := &curatorv1.GetConsensusStatusResponse{Voters: 3, HealthyVoters: 3, FailureTolerance: 1}
	cfg := DefaultRollConfig()
	for name, tc := range map[string]struct {
		sets func(m *manifests) []appsv1.StatefulSet
		st   *curatorv1.GetConsensusStatusResponse
		want string // "": the roll may begin
	}{
		"this release's manifests, a healthy cluster": {st: healthy},
		"a voter down": {
			st:   &curatorv1.GetConsensusStatusResponse{Voters: 3, HealthyVoters: 2},
			want: "the cluster is not healthy, so nothing was changed: 2 of 3 voters are healthy (curators at localhost:7200)",
		},
		"a learner catching up": {
			st:   &curatorv1.GetConsensusStatusResponse{Voters: 3, HealthyVoters: 3, Members: []*curatorv1.ConsensusMemberStatus{{MemberId: 7, NodeId: "n4", Learner: true}}},
			want: "the cluster is not healthy, so nothing was changed: learner 7 (node n4) is catching up",
		},
		"another namespace": {
			sets: func(*manifests) []appsv1.StatefulSet {
				return []appsv1.StatefulSet{{ObjectMeta: metav1.ObjectMeta{Name: "postgres"}}}
			},
			st:   healthy,
			want: "namespace curia has no curia StatefulSets (curia-seed, curia-node), so nothing was changed",
		},
		"an empty namespace": {
			sets: func(*manifests) []appsv1.StatefulSet { return nil },
			st:   healthy,
			want: "has no curia StatefulSets",
		},
		"curia-node missing": {
			sets: func(m *manifests) []appsv1.StatefulSet { return []appsv1.StatefulSet{*m.statefulSets["curia-seed"]} },
			st:   healthy,
			want: "namespace curia has no StatefulSet curia-node, so nothing was changed",
		},
		"the manifests of a release that rolled the nodes itself": {
			sets: func(m *manifests) []appsv1.StatefulSet {
				s := sets(t, m)
				s[0].Spec.UpdateStrategy.Type = appsv1.RollingUpdateStatefulSetStrategyType
				return s
			},
			st:   healthy,
			want: "updates its pods itself (updateStrategy RollingUpdate), so nothing was changed",
		},
	} {
		t.Run(name, func(t *testing.T) {
			m := render(t, "overlays/local")
			ss := sets(t, m)
			if tc.sets != nil {
				ss = tc.sets(m)
			}
			err := preflight(t.Context(), cfg, ss, management{st: tc.st})
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("preflight = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestRollWithoutKubectl: no kubectl, no roll, and nothing touched (it
// refuses before it reads or dials anything).
func TestRollWithoutKubectl(t *testing.T) {
	cfg := DefaultRollConfig()
	cfg.Kubectl = t.TempDir() + "/kubectl"
	report, err := Roll(t.Context(), cfg, nil)
	if report != nil || err == nil || !strings.Contains(err.Error(), "no kubectl") || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("Roll without kubectl = %v, %v", report, err)
	}
}

// podJSON is a pod as kubectl get pod -o json shows it.
const podJSON = `{
  "apiVersion": "v1", "kind": "Pod",
  "metadata": {"name": "curia-node-1", "namespace": "curia", "uid": "9f0c",
    "labels": {"app.kubernetes.io/component": "node", "controller-revision-hash": "curia-node-7d9f", "statefulset.kubernetes.io/pod-name": "curia-node-1"},
    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "curia-node", "uid": "1", "controller": true}]},
  "status": {"phase": "Running", "conditions": [
    {"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "%s"}, {"type": "ContainersReady", "status": "True"}]}
}`

func pod(t *testing.T, ready string) corev1.Pod {
	t.Helper()
	var p corev1.Pod
	if err := json.Unmarshal([]byte(strings.Replace(podJSON, "%s", ready, 1)), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPodReady(t *testing.T) {
	if p := pod(t, "True"); !podReady(&p) {
		t.Error("a Ready pod is not ready")
	}
	if p := pod(t, "False"); podReady(&p) {
		t.Error("a pod whose Ready is False is ready")
	}
	p := pod(t, "True")
	p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if podReady(&p) {
		t.Error("a pod being deleted is ready")
	}
	p = pod(t, "True")
	p.Status.Conditions = nil
	if podReady(&p) {
		t.Error("a pod without conditions is ready")
	}
}

func TestDeploymentAvailable(t *testing.T) {
	two := int32(2)
	d := func(st appsv1.DeploymentStatus) *appsv1.Deployment {
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Spec: appsv1.DeploymentSpec{Replicas: &two}, Status: st}
	}
	for name, tc := range map[string]struct {
		st   appsv1.DeploymentStatus
		want string
	}{
		"available":                     {st: appsv1.DeploymentStatus{ObservedGeneration: 3, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2, AvailableReplicas: 2}},
		"its successor not yet settled": {st: appsv1.DeploymentStatus{ObservedGeneration: 3, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2, AvailableReplicas: 1}, want: "1 of 2 replicas available"},
		"a change not yet seen":         {st: appsv1.DeploymentStatus{ObservedGeneration: 2, Replicas: 2, UpdatedReplicas: 2, AvailableReplicas: 2}, want: "not seen"},
		"an old replica left (surge)":   {st: appsv1.DeploymentStatus{ObservedGeneration: 3, Replicas: 3, UpdatedReplicas: 2, AvailableReplicas: 2}, want: "3 replicas, want 2"},
		"mid-rollout":                   {st: appsv1.DeploymentStatus{ObservedGeneration: 3, Replicas: 3, UpdatedReplicas: 1, AvailableReplicas: 2}, want: "1 of 2 replicas updated"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := deploymentAvailable(d(tc.st)); got != tc.want && (tc.want == "" || !strings.Contains(got, tc.want)) {
				t.Fatalf("deploymentAvailable = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestStalePods(t *testing.T) {
	set := appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "curia-node"}, Status: appsv1.StatefulSetStatus{UpdateRevision: "curia-node-7d9f"}}
	current := pod(t, "True")
	if got := stalePods([]appsv1.StatefulSet{set}, []corev1.Pod{current}); len(got) > 0 {
		t.Errorf("stalePods of a pod on the update revision = %v", got)
	}
	set.Status.UpdateRevision = "curia-node-8e0a"
	if got := stalePods([]appsv1.StatefulSet{set}, []corev1.Pod{current}); !slices.Equal(got, []string{"curia-node-1"}) {
		t.Errorf("stalePods of a pod on an older revision = %v", got)
	}
}

// TestNodesFirstSelection: the upgrade's first apply
// (docs/operating/upgrading.md, `kubectl apply -k ... -l '...'`) takes
// the node StatefulSets and what their pods need (the PriorityClass), and
// no Deployment: those roll by themselves, after the nodes.
func TestNodesFirstSelection(t *testing.T) {
	b, err := os.ReadFile("../../docs/operating/upgrading.md")
	if err != nil {
		t.Fatal(err)
	}
	found := regexp.MustCompile(`kubectl apply -k \S+ -l '([^']+)'`).FindAllSubmatch(b, -1)
	if len(found) == 0 {
		t.Fatal("upgrading.md applies no selection first")
	}
	m := render(t, "overlays/local")
	for _, f := range found {
		sel, err := labels.Parse(string(f[1]))
		if err != nil {
			t.Fatalf("selector %s: %v", f[1], err)
		}
		for name, s := range m.statefulSets {
			if !sel.Matches(labels.Set(s.Labels)) {
				t.Errorf("-l '%s' leaves out StatefulSet/%s", f[1], name)
			}
		}
		for name, pc := range m.priorityClasses {
			if !sel.Matches(labels.Set(pc.Labels)) {
				t.Errorf("-l '%s' leaves out PriorityClass/%s, which the node pods name: they would not be created again", f[1], name)
			}
		}
		for name, d := range m.deployments {
			if sel.Matches(labels.Set(d.Labels)) {
				t.Errorf("-l '%s' takes Deployment/%s, which would roll before the nodes", f[1], name)
			}
		}
	}
}
