package kubernetes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/nodes"
	"curia.dev/platform/pki"
	"curia.dev/platform/rolling"
	"curia.dev/platform/rpc"
)

// kubectl runs kubectl in one context and namespace.
type kubectl struct {
	path, context, namespace string
}

// command is kubectl's argument list for args.
func (k kubectl) command(args ...string) []string {
	var out []string
	if k.context != "" {
		out = append(out, "--context", k.context)
	}
	return append(append(out, "--namespace", k.namespace), args...)
}

func (k kubectl) run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, k.path, k.command(args...)...) //nolint:gosec // G204: the operator's kubectl
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Errorf("kubectl %s: %w", strings.Join(k.command(args...), " "), err)
	}
	return out, nil
}

// get decodes `kubectl get args -o json` into out; with
// --ignore-not-found, an object that is not there leaves out as it is.
func (k kubectl) get(ctx context.Context, out any, args ...string) error {
	b, err := k.run(ctx, append(append([]string{"get"}, args...), "-o", "json")...)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("kubectl get %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// credentials are the admin's: from the files given, or from the
// namespace's ConfigMap curia-public and Secret curia-admin.
func (k kubectl) credentials(ctx context.Context, cfg RollConfig) (*rpc.Credentials, error) {
	if cfg.TLS.CA != "" {
		return rpc.LoadCredentials(cfg.Cluster, cfg.TLS)
	}
	var public corev1.ConfigMap
	if err := k.get(ctx, &public, "configmap", ConfigMapPublic); err != nil {
		return nil, err
	}
	var admin corev1.Secret
	if err := k.get(ctx, &admin, "secret", SecretAdmin); err != nil {
		return nil, err
	}
	return rpc.NewCredentials(cfg.Cluster, []byte(public.Data[KeyCACert]), admin.Data[KeyTLSCert], admin.Data[KeyTLSKey])
}

// pods are the pods of selector, by name, the ones being deleted left
// out.
func (k kubectl) pods(ctx context.Context, selector string) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := k.get(ctx, &list, "pods", "--selector", selector); err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func podNames(ps []corev1.Pod) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// kubeFleet is the curia pods of one namespace, restarted with kubectl.
type kubeFleet struct {
	k     kubectl
	cfg   RollConfig
	creds *rpc.Credentials
	m     curatorv1.ManagementClient
	out   io.Writer
}

func (f *kubeFleet) say(format string, args ...any) {
	if f.out != nil {
		fmt.Fprintf(f.out, "curia-kube roll: "+format+"\n", args...)
	}
}

// poll calls fn every 2 s until it says "" (done), or the pod timeout; the
// error says what fn said last and where to look.
func (f *kubeFleet) poll(ctx context.Context, what, look string, fn func(context.Context) (string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.PodTimeout)
	defer cancel()
	for {
		waiting, err := fn(ctx)
		if err == nil && waiting == "" {
			return nil
		}
		if err != nil {
			waiting = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not done after %v (%s): %s", what, f.cfg.PodTimeout, waiting, look)
		case <-time.After(2 * time.Second):
		}
	}
}

// Nodes are the registry's nodes that run in the node pods here.
func (f *kubeFleet) Nodes(ctx context.Context) ([]rolling.Node, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ns, err := nodes.ListBasic(cctx, f.m, "")
	if err != nil {
		return nil, fmt.Errorf("list the nodes: %w", err)
	}
	pods, err := f.k.pods(ctx, selectNodes)
	if err != nil {
		return nil, err
	}
	out, skipped, err := nodePods(ns, podNames(pods))
	if err != nil {
		return nil, err
	}
	if len(skipped) > 0 {
		f.say("nodes without a pod in namespace %s, not restarted: %s", f.cfg.Namespace, strings.Join(skipped, ", "))
	}
	return out, nil
}

// RestartNode deletes the node's pod and waits until its StatefulSet
// created it again (a new UID, the same name and volumes) and it is Ready.
func (f *kubeFleet) RestartNode(ctx context.Context, n rolling.Node) ([]string, error) {
	var old corev1.Pod
	if err := f.k.get(ctx, &old, "pod", n.Name); err != nil {
		return nil, err
	}
	if _, err := f.k.run(ctx, "delete", "pod", n.Name, "--wait=true", fmt.Sprintf("--timeout=%s", f.cfg.PodTimeout)); err != nil {
		return nil, err
	}
	look := fmt.Sprintf("kubectl -n %s describe pod %s", f.cfg.Namespace, n.Name)
	err := f.poll(ctx, "pod "+n.Name+" created again and Ready", look, func(ctx context.Context) (string, error) {
		var p corev1.Pod
		if err := f.k.get(ctx, &p, "pod", n.Name, "--ignore-not-found"); err != nil {
			return "", err
		}
		switch {
		case p.UID == "" || p.UID == old.UID:
			return "not created again yet", nil
		case !podReady(&p):
			return "not Ready", nil
		}
		return "", nil
	})
	if err != nil {
		return nil, err
	}
	return []string{"pod/" + n.Name}, nil
}

func (f *kubeFleet) Curators(ctx context.Context) ([]string, error) {
	ps, err := f.k.pods(ctx, selectCurators)
	return podNames(ps), err
}

func (f *kubeFleet) Reconcilers(ctx context.Context) ([]string, error) {
	ps, err := f.k.pods(ctx, selectReconciler)
	return podNames(ps), err
}

// A curator's and a reconciler's name is its pod's (--name=$(POD_NAME)).
func (f *kubeFleet) RestartCurator(ctx context.Context, name string) ([]string, error) {
	return f.replace(ctx, "curia-curator", selectCurators, name)
}

func (f *kubeFleet) RestartReconciler(ctx context.Context, name string) ([]string, error) {
	return f.replace(ctx, "curia-reconciler", selectReconciler, name)
}

// replace deletes a Deployment's pod and waits until the Deployment is
// fully available again, the pod gone and its successor counted: the
// other replicas serve meanwhile. It names the pods that are new since.
// Deleting the pods one by one, rather than `kubectl rollout restart`
// (one at a time too, with maxUnavailable 0 and maxSurge 1), keeps
// platform/rolling's order: the leader and the active reconciler last.
func (f *kubeFleet) replace(ctx context.Context, deployment, selector, name string) ([]string, error) {
	before, err := f.k.pods(ctx, selector)
	if err != nil {
		return nil, err
	}
	if _, err := f.k.run(ctx, "delete", "pod", name, "--ignore-not-found", "--wait=true", fmt.Sprintf("--timeout=%s", f.cfg.PodTimeout)); err != nil {
		return nil, err
	}
	var fresh []string
	look := fmt.Sprintf("kubectl -n %s rollout status deployment %s", f.cfg.Namespace, deployment)
	err = f.poll(ctx, "deployment "+deployment+" available again", look, func(ctx context.Context) (string, error) {
		var d appsv1.Deployment
		if err := f.k.get(ctx, &d, "deployment", deployment); err != nil {
			return "", err
		}
		if why := deploymentAvailable(&d); why != "" {
			return why, nil
		}
		after, err := f.k.pods(ctx, selector)
		if err != nil {
			return "", err
		}
		names := podNames(after)
		if slices.Contains(names, name) {
			return "pod " + name + " still there", nil
		}
		old := map[string]bool{}
		for _, p := range before {
			old[p.Name] = true
		}
		fresh = slices.DeleteFunc(names, func(n string) bool { return old[n] })
		return "", nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(fresh))
	for _, n := range fresh {
		out = append(out, "pod/"+n)
	}
	return out, nil
}

// ActiveReconciler is the name of the reconciler that holds the lease, ""
// without --reconciler or if none answers.
func (f *kubeFleet) ActiveReconciler(ctx context.Context) string {
	if f.cfg.Reconciler == "" {
		return ""
	}
	cc, err := rpc.Dial(f.cfg.Reconciler, rpc.ClientConfig{Credentials: f.creds, ServerKinds: []pki.Kind{pki.KindReconciler}})
	if err != nil {
		return ""
	}
	defer cc.Close()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := reconcilerv1.NewReconcilerClient(cc).GetStatus(cctx, &reconcilerv1.GetStatusRequest{})
	if err != nil {
		return ""
	}
	holder, _, _ := strings.Cut(st.GetLeaseHolder(), "/")
	return holder
}

// updated checks, after the roll, that every node pod runs its
// StatefulSet's current template.
func (f *kubeFleet) updated(ctx context.Context) error {
	var sets appsv1.StatefulSetList
	if err := f.k.get(ctx, &sets, "statefulsets"); err != nil {
		return err
	}
	pods, err := f.k.pods(ctx, selectNodes)
	if err != nil {
		return err
	}
	if stale := stalePods(sets.Items, pods); len(stale) > 0 {
		return fmt.Errorf("pods %s are not on their StatefulSet's current template (was it changed during the roll?): run curia-kube roll again", strings.Join(stale, ", "))
	}
	f.say("every node pod of %s runs its StatefulSet's current template", strings.Join(slices.Sorted(maps.Keys(setNames(sets.Items))), ", "))
	return nil
}

func setNames(sets []appsv1.StatefulSet) map[string]bool {
	out := map[string]bool{}
	for _, s := range sets {
		out[s.Name] = true
	}
	return out
}
