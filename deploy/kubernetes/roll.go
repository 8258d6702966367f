package kubernetes

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rolling"
	"curia.dev/platform/rpc"
)

// RollConfig is curia-kube roll's: it restarts every curia pod of a
// namespace one at a time, in platform/rolling's order (the node pods,
// each in maintenance, the etcd leader's last; the curators, the leader
// last; the reconcilers, the active one last), through kubectl. It runs
// on the operator's machine and reaches the curators with the admin's
// credentials at an address the operator forwards (docs/operating/upgrading.md).
type RollConfig struct {
	Cluster string
	// Curator is where the curators answer: a kubectl port-forward of
	// svc/curia-curator, kept running across the curators' restarts.
	Curator string
	// Reconciler, if set, is where a reconciler answers (a port-forward of
	// svc/curia-reconciler): the one holding the lease is restarted last.
	Reconciler string
	// TLS are the admin's files; all empty: the roll reads the ConfigMap
	// curia-public and the Secret curia-admin with kubectl.
	TLS rpc.TLSFiles
	// Namespace, Kubectl (its path) and Context (empty: kubectl's
	// current) say where the pods are and how to reach them.
	Namespace string
	Kubectl   string
	Context   string
	// PodTimeout bounds each pod's restart: deleted, recreated and Ready.
	PodTimeout time.Duration
	// HealthTimeout bounds each wait for the cluster to be healthy again.
	HealthTimeout time.Duration
}

// DefaultRollConfig is overlays/local's cluster through the port-forward
// of docs/operating/upgrading.md.
func DefaultRollConfig() RollConfig {
	return RollConfig{Cluster: "curia", Curator: "localhost:7200", Namespace: "curia", Kubectl: "kubectl", PodTimeout: 10 * time.Minute, HealthTimeout: 3 * time.Minute}
}

// AddFlags registers the flags.
func (c *RollConfig) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Cluster, "cluster", c.Cluster, "cluster name (trust domain of every identity)")
	fs.StringVar(&c.Curator, "curator", c.Curator, "host:port of the curators: kubectl port-forward svc/curia-curator, kept running (docs/operating/upgrading.md)")
	fs.StringVar(&c.Reconciler, "reconciler", c.Reconciler, "host:port of a reconciler (kubectl port-forward svc/curia-reconciler), to restart the active one last; empty: in their order")
	c.TLS.AddFlags(fs, "")
	fs.StringVar(&c.Namespace, "namespace", c.Namespace, "the namespace of curia's pods")
	fs.StringVar(&c.Kubectl, "kubectl", c.Kubectl, "the kubectl command (a path, or a name on PATH)")
	fs.StringVar(&c.Context, "context", c.Context, "kubectl's context (empty: its current one)")
	fs.DurationVar(&c.PodTimeout, "pod-timeout", c.PodTimeout, "how long one pod may take to be recreated and Ready")
	fs.DurationVar(&c.HealthTimeout, "health-timeout", c.HealthTimeout, "how long the cluster may take to be healthy again after each restart")
}

// Validate checks the configuration.
func (c *RollConfig) Validate() error {
	if err := pki.ValidateCluster(c.Cluster); err != nil {
		return err
	}
	tls := []string{c.TLS.CA, c.TLS.Cert, c.TLS.Key}
	switch {
	case c.Curator == "":
		return errors.New("--curator is required: the curators' address (kubectl port-forward svc/curia-curator 7200)")
	case slices.Contains(tls, "") && slices.ContainsFunc(tls, func(s string) bool { return s != "" }):
		return errors.New("--ca, --cert and --key: all three (the admin's files) or none (read from the namespace's curia-public and curia-admin)")
	case c.Kubectl == "":
		return errors.New("--kubectl is required")
	case c.PodTimeout <= 0 || c.HealthTimeout <= 0:
		return errors.New("--pod-timeout and --health-timeout: positive")
	}
	if errs := validation.IsDNS1123Label(c.Namespace); len(errs) > 0 {
		return fmt.Errorf("--namespace %q: %s", c.Namespace, strings.Join(errs, "; "))
	}
	return nil
}

// Roll restarts every curia pod of the namespace, one at a time. It
// refuses, with nothing changed, when kubectl is missing, the namespace
// has no curia node StatefulSets (or they still update their pods
// themselves), or the cluster is not healthy. The report is returned
// with the error too: what was restarted before a step failed.
func Roll(ctx context.Context, cfg RollConfig, out io.Writer) (*rolling.Report, error) {
	k := kubectl{path: cfg.Kubectl, context: cfg.Context, namespace: cfg.Namespace}
	if _, err := exec.LookPath(cfg.Kubectl); err != nil {
		return nil, fmt.Errorf("no kubectl (--kubectl %s), so nothing was changed: %w", cfg.Kubectl, err)
	}
	var sets appsv1.StatefulSetList
	if err := k.get(ctx, &sets, "statefulsets"); err != nil {
		return nil, fmt.Errorf("the namespace's StatefulSets, so nothing was changed: %w", err)
	}
	creds, err := k.credentials(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("the admin's credentials, so nothing was changed: %w", err)
	}
	conn, err := rpc.Dial(cfg.Curator, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	m := curatorv1.NewManagementClient(conn)
	if err := preflight(ctx, cfg, sets.Items, m); err != nil {
		return nil, err
	}
	f := &kubeFleet{k: k, cfg: cfg, creds: creds, m: m, out: out}
	report, err := rolling.Run(ctx, f, rolling.Options{
		Management:    m,
		Curator:       curatorv1.NewCuratorClient(conn),
		Out:           out,
		Prefix:        "curia-kube roll",
		Reason:        "rolling restart (curia-kube roll, namespace " + cfg.Namespace + ")",
		HealthTimeout: cfg.HealthTimeout,
	})
	if err != nil {
		return report, err
	}
	return report, f.updated(ctx)
}

// preflight refuses a roll, before anything is changed: a namespace
// without curia's node StatefulSets, or a cluster that is not healthy now.
func preflight(ctx context.Context, cfg RollConfig, sets []appsv1.StatefulSet, m curatorv1.ManagementClient) error {
	if err := checkNodeSets(cfg.Namespace, sets); err != nil {
		return err
	}
	if err := rolling.Check(ctx, m); err != nil {
		return fmt.Errorf("%w (curators at %s)", err, cfg.Curator)
	}
	return nil
}

// checkNodeSets refuses a namespace without both node StatefulSets, or
// with one that still updates its pods itself: the roll would race it
// (and the manifests of this release are not applied).
func checkNodeSets(namespace string, sets []appsv1.StatefulSet) error {
	have := map[string]*appsv1.StatefulSet{}
	for i := range sets {
		have[sets[i].Name] = &sets[i]
	}
	var missing []string
	for _, name := range nodeSetNames {
		if have[name] == nil {
			missing = append(missing, name)
		}
	}
	if len(missing) == len(nodeSetNames) {
		return fmt.Errorf("namespace %s has no curia StatefulSets (%s), so nothing was changed: is it curia's namespace (--namespace) and kubectl's context (--context)?", namespace, strings.Join(nodeSetNames, ", "))
	}
	if len(missing) > 0 {
		return fmt.Errorf("namespace %s has no StatefulSet %s, so nothing was changed: apply the manifests (kubectl apply -k)", namespace, strings.Join(missing, ", "))
	}
	for _, name := range nodeSetNames {
		if t := have[name].Spec.UpdateStrategy.Type; t != appsv1.OnDeleteStatefulSetStrategyType {
			return fmt.Errorf("StatefulSet %s updates its pods itself (updateStrategy %s), so nothing was changed: apply this release's manifests first (updateStrategy OnDelete), or the roll and the StatefulSet would restart two voters at once", name, t)
		}
	}
	return nil
}

// nodeSetNames are the StatefulSets of the node pods (base/nodes.yaml).
var nodeSetNames = []string{"curia-seed", "curia-node"}

// The pods of each part, by their labels (base/).
const (
	selectNodes      = "app.kubernetes.io/name=curia,app.kubernetes.io/component=node"
	selectCurators   = "app.kubernetes.io/name=curia,app.kubernetes.io/component=curator"
	selectReconciler = "app.kubernetes.io/name=curia,app.kubernetes.io/component=reconciler"
)

// nodePods maps the registry's nodes to the node pods: a node pod's agent
// registers with --address=$(POD_NAME).curia-node (base/nodes.yaml), so a
// node's status address names its pod. Nodes whose address names no pod
// here are left out (skipped names them). Every pod must be a node's, and
// one node's only: a pod the roll would not restart (still registering,
// or a pod the registry does not know) stays on its old image, so it is
// refused.
func nodePods(ns []*curatorv1.Node, pods []string) (out []rolling.Node, skipped []string, err error) {
	byPod := map[string]string{}
	for _, n := range ns {
		addr := n.GetStatus().GetAddress()
		pod, rest, _ := strings.Cut(addr, ".")
		svc, _, _ := strings.Cut(rest, ".")
		if svc != ServiceNodes || !slices.Contains(pods, pod) {
			skipped = append(skipped, fmt.Sprintf("%s (address %q)", n.GetId(), addr))
			continue
		}
		if other, dup := byPod[pod]; dup {
			return nil, nil, fmt.Errorf("nodes %s and %s both have the address of pod %s, so nothing was changed: delete the stale one (DeleteNode)", other, n.GetId(), pod)
		}
		byPod[pod] = n.GetId()
		out = append(out, rolling.Node{ID: n.GetId(), Name: pod})
	}
	for _, pod := range pods {
		if _, ok := byPod[pod]; !ok {
			return nil, nil, fmt.Errorf("pod %s is no node of the registry (still registering, or waiting for its approval?), so nothing was changed: the roll would leave it on its old image", pod)
		}
	}
	return out, skipped, nil
}

// podReady reports whether a pod is Ready and not being deleted.
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// deploymentAvailable says what a Deployment still lacks to be fully
// available (every replica updated, ready for minReadySeconds, none
// other left), or "".
func deploymentAvailable(d *appsv1.Deployment) string {
	want := ptrOr(d.Spec.Replicas, 1)
	st := d.Status
	switch {
	case st.ObservedGeneration < d.Generation:
		return "its controller has not seen its last change"
	case st.UpdatedReplicas != want:
		return fmt.Sprintf("%d of %d replicas updated", st.UpdatedReplicas, want)
	case st.AvailableReplicas != want:
		return fmt.Sprintf("%d of %d replicas available", st.AvailableReplicas, want)
	case st.Replicas != want:
		return fmt.Sprintf("%d replicas, want %d", st.Replicas, want)
	}
	return ""
}

// stalePods are the node pods not on their StatefulSet's update revision.
func stalePods(sets []appsv1.StatefulSet, pods []corev1.Pod) []string {
	rev := map[string]string{}
	for _, s := range sets {
		rev[s.Name] = s.Status.UpdateRevision
	}
	var out []string
	for _, p := range pods {
		for _, o := range p.OwnerReferences {
			if o.Kind == "StatefulSet" && rev[o.Name] != "" && p.Labels[appsv1.ControllerRevisionHashLabelKey] != rev[o.Name] {
				out = append(out, p.Name)
			}
		}
	}
	return out
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
