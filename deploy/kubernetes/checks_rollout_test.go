package kubernetes

import (
	"errors"
	"fmt"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The invariants of restarts and upgrades: what a new template restarts
// by itself, who goes first when a Kubernetes node runs short, and the
// room etcd's data needs.

// checkUpdateStrategy: a new template (an image bump) restarts no node
// pod by itself — the node StatefulSets are OnDelete, and curia-kube roll
// restarts their pods one at a time, since the two StatefulSets would roll
// at once (a PodDisruptionBudget does not gate a StatefulSet's update) —
// and the Deployments replace one replica at a time, a new one first,
// an old one only once its successor has been ready for minReadySeconds.
func checkUpdateStrategy(m *manifests) []error {
	var errs []error
	for _, name := range nodeSets {
		s := m.statefulSets[name]
		if s == nil {
			errs = append(errs, fmt.Errorf("no StatefulSet/%s", name))
			continue
		}
		if s.Spec.UpdateStrategy.Type != appsv1.OnDeleteStatefulSetStrategyType {
			errs = append(errs, fmt.Errorf("StatefulSet/%s: updateStrategy %q, want OnDelete: a new image would restart its pods by itself, alongside the other node StatefulSet's (two voters down); curia-kube roll restarts them", name, s.Spec.UpdateStrategy.Type))
		}
	}
	for _, name := range []string{"curia-curator", "curia-reconciler"} {
		d := m.deployments[name]
		if d == nil {
			errs = append(errs, fmt.Errorf("no Deployment/%s", name))
			continue
		}
		st := d.Spec.Strategy
		ru := st.RollingUpdate
		if st.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || !isInt(ru.MaxUnavailable, 0) || !isInt(ru.MaxSurge, 1) {
			errs = append(errs, fmt.Errorf("Deployment/%s: strategy %+v, want RollingUpdate with maxUnavailable 0 and maxSurge 1: one replica at a time, its successor ready first", name, st))
		}
		if d.Spec.MinReadySeconds < 5 {
			errs = append(errs, fmt.Errorf("Deployment/%s: minReadySeconds %d, want at least 5: a replica that turns ready and falls over at once must not count as available", name, d.Spec.MinReadySeconds))
		}
	}
	return errs
}

// isInt reports whether v is the number n (not a percentage).
func isInt(v *intstr.IntOrString, n int) bool {
	return v != nil && v.Type == intstr.Int && v.IntValue() == n
}

// priorityClass is the control plane's PriorityClass, and the value of
// system-cluster-critical, which it stays below.
const (
	priorityClass          = "curia-control-plane"
	systemClusterCritical  = 2000000000
	highestUserDefinedPrio = 1000000000
)

// checkPriority: every pod of the control plane (node pods, curators,
// reconcilers) names the PriorityClass curia-control-plane, which is here,
// below Kubernetes's own and not the cluster's default.
func checkPriority(m *manifests) []error {
	var errs []error
	pc := m.priorityClasses[priorityClass]
	switch {
	case pc == nil:
		errs = append(errs, fmt.Errorf("no PriorityClass %s", priorityClass))
	case pc.Value <= 0 || pc.Value > highestUserDefinedPrio || pc.Value >= systemClusterCritical:
		errs = append(errs, fmt.Errorf("PriorityClass %s: value %d, want above ordinary pods (0) and at most %d, below system-cluster-critical (%d)", priorityClass, pc.Value, highestUserDefinedPrio, systemClusterCritical))
	case pc.GlobalDefault:
		errs = append(errs, fmt.Errorf("PriorityClass %s is the cluster's default: every pod without a class would take it", priorityClass))
	}
	for name := range m.priorityClasses {
		if name != priorityClass {
			errs = append(errs, fmt.Errorf("PriorityClass %s: want %s only", name, priorityClass))
		}
	}
	ws, err := m.workloads()
	if err != nil {
		return append(errs, err)
	}
	for _, w := range ws {
		got := w.pod.Spec.PriorityClassName
		switch {
		case w.kind == "Job" && got != "":
			errs = append(errs, fmt.Errorf("%s: priorityClassName %s: a one-shot Job has no business preempting", w, got))
		case w.kind != "Job" && got != priorityClass:
			errs = append(errs, fmt.Errorf("%s: priorityClassName %q, want %s: a control-plane pod", w, got, priorityClass))
		}
	}
	return errs
}

// The consensus data volume: etcd's database may reach its backend
// quota, a defragmentation writes a second copy of it next to it, and
// the WAL and etcd's snapshots take the rest.
const (
	quotaFlag   = "etcd-quota-backend-bytes"
	walHeadroom = 1 << 30
)

// checkConsensusVolume: each consensus container states its backend
// quota, and its data's claim asks for at least twice the quota and a
// GiB: raised one without the other, etcd fills its disk before its
// quota (and a full disk is a crashed member, not an alarm).
func checkConsensusVolume(m *manifests) []error {
	var errs []error
	for _, name := range nodeSets {
		s := m.statefulSets[name]
		if s == nil {
			errs = append(errs, fmt.Errorf("no StatefulSet/%s", name))
			continue
		}
		c := container(&s.Spec.Template, "consensus")
		if c == nil {
			errs = append(errs, fmt.Errorf("StatefulSet/%s: no container consensus", name))
			continue
		}
		f, err := flagArgs(c.Args)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		quota, err := strconv.ParseInt(f[quotaFlag], 10, 64)
		if err != nil || quota <= 0 {
			errs = append(errs, fmt.Errorf("StatefulSet/%s consensus: --%s=%q: say etcd's backend quota, in bytes, so that its volume can be sized from it", name, quotaFlag, f[quotaFlag]))
			continue
		}
		vm := mountOf(c, f["data-dir"])
		if vm == nil {
			errs = append(errs, fmt.Errorf("StatefulSet/%s consensus: --data-dir=%s is on no volume", name, f["data-dir"]))
			continue
		}
		var size *resource.Quantity
		for _, claim := range s.Spec.VolumeClaimTemplates {
			if claim.Name == vm.Name {
				if q, ok := claim.Spec.Resources.Requests["storage"]; ok {
					size = &q
				}
			}
		}
		want := resource.NewQuantity(2*quota+walHeadroom, resource.BinarySI)
		switch {
		case size == nil:
			errs = append(errs, fmt.Errorf("StatefulSet/%s consensus: its data (%s) is on no claim with a storage request", name, vm.Name))
		case size.Cmp(*want) < 0:
			errs = append(errs, fmt.Errorf("StatefulSet/%s: claim %s asks for %s, want at least 2 x --%s (%d) + 1Gi = %s", name, vm.Name, size, quotaFlag, quota, want))
		}
	}
	return errs
}

// maxBootstrapTTL bounds how long the finished bootstrap Job stays: an
// apply with another image in that time fails on it.
const maxBootstrapTTL = 600

// checkBootstrapTTL: the Job's pod template carries the image and is
// immutable; unless the finished Job is deleted, the next `kubectl apply
// -k` with another image fails on it (TestBootstrapJobAcrossImages
// renders two images).
func checkBootstrapTTL(m *manifests) []error {
	j := m.jobs["curia-bootstrap"]
	if j == nil {
		return []error{errors.New("no Job curia-bootstrap")}
	}
	if ttl := j.Spec.TTLSecondsAfterFinished; ttl == nil || *ttl > maxBootstrapTTL {
		return []error{fmt.Errorf("curia-bootstrap: ttlSecondsAfterFinished %v, want at most %d: the finished Job's template (its image) is immutable, and the next apply with another image would fail on it", ptrOr(ttl, -1), maxBootstrapTTL)}
	}
	return nil
}
