package kubernetes

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The invariants an operator would check before applying the manifests,
// each a function of the rendered manifests returning what it found wrong
// (TestChecksCatchMutations shows each one failing).

// check is one invariant.
type check struct {
	name string
	fn   func(m *manifests) []error
}

var checks = []check{
	{"objects", checkObjects},
	{"one identity, one secret", checkSecrets},
	{"files on volumes", checkFiles},
	{"service account tokens", checkTokens},
	{"disruption budgets", checkPDBs},
	{"readiness", checkReadiness},
	{"liveness", checkLiveness},
	{"resource requests", checkRequests},
	{"resource limits", checkLimits},
	{"images", checkImages},
	{"headless service", checkHeadless},
	{"services", checkServices},
	{"addresses", checkAddresses},
	{"bootstrap job", checkBootstrapJob},
	{"env references", checkEnvRefs},
	{"security context", checkSecurityContext},
	{"zones", checkZones},
	{"network policies", checkNetworkPolicies},
	{"update strategy", checkUpdateStrategy},
	{"priority", checkPriority},
	{"consensus volume", checkConsensusVolume},
	{"bootstrap job ttl", checkBootstrapTTL},
}

// The image every container runs: the one `make images` builds (as
// compose's), and how it may be pulled (there is no registry).
const wantImage = "curia:dev"

// owners says which container ("<kind>/<workload>/<container>") may read
// each Secret the bootstrap Job makes: its identity's, and nobody else.
// The admin's is the operator's alone.
var owners = map[string][]string{
	SecretAdmin:          nil,
	SecretCurator:        {"Deployment/curia-curator/curator"},
	SecretReconciler:     {"Deployment/curia-reconciler/reconciler"},
	SecretSeed:           {"StatefulSet/curia-seed/roleserve"},
	SecretSeedConsensus:  {"StatefulSet/curia-seed/consensus"},
	SecretRegisterTicket: {"StatefulSet/curia-node/roleserve"},
}

// madeByBootstrap is every object the bootstrap Job writes, with its keys:
// what NewPKI makes, and the ticket's Secret.
var madeByBootstrap = sync.OnceValues(func() (map[string][]string, error) {
	p, err := NewPKI("curia", "curia")
	if err != nil {
		return nil, err
	}
	out := map[string][]string{
		"ConfigMap/" + ConfigMapPublic:   slices.Sorted(maps.Keys(p.Public.Data)),
		"Secret/" + SecretRegisterTicket: slices.Sorted(maps.Keys(ticketSecret(nil).Data)),
	}
	for _, s := range p.Secrets {
		out["Secret/"+s.Name] = slices.Sorted(maps.Keys(s.Data))
	}
	return out, nil
})

// nodeSets are the StatefulSets of nodes.
var nodeSets = []string{"curia-seed", "curia-node"}

func checkObjects(m *manifests) []error {
	var errs []error
	want := map[string][]string{
		"StatefulSet": nodeSets, "Deployment": {"curia-curator", "curia-reconciler"}, "Job": {"curia-bootstrap"},
		"Service": {ServiceNodes, ServiceCurator, ServiceReconciler},
	}
	have := map[string][]string{
		"StatefulSet": slices.Sorted(maps.Keys(m.statefulSets)), "Deployment": slices.Sorted(maps.Keys(m.deployments)),
		"Job": slices.Sorted(maps.Keys(m.jobs)), "Service": slices.Sorted(maps.Keys(m.services)),
	}
	for kind, names := range want {
		if !slices.Equal(slices.Sorted(slices.Values(names)), have[kind]) {
			errs = append(errs, fmt.Errorf("%ss %v, want %v", kind, have[kind], names))
		}
	}
	// The seed's Secrets are one node's identity: a second replica would
	// be a second machine with the same key, bootstrapping its own etcd.
	if s := m.statefulSets["curia-seed"]; s != nil && ptrOr(s.Spec.Replicas, 1) != 1 {
		errs = append(errs, fmt.Errorf("StatefulSet/curia-seed has %d replicas, want 1: it is the one bootstrap node", ptrOr(s.Spec.Replicas, 1)))
	}
	if SeedPod != "curia-seed-0" {
		errs = append(errs, fmt.Errorf("SeedPod %q is not curia-seed's first pod", SeedPod))
	}
	return errs
}

// secretReads are the Secrets a container can read: its mounted Secret
// volumes (also projected), and its environment's references.
func secretReads(pod *corev1.PodTemplateSpec, c *corev1.Container) []string {
	vols := podSecretVolumes(pod)
	var out []string
	for _, vm := range c.VolumeMounts {
		out = append(out, vols[vm.Name]...)
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			out = append(out, e.ValueFrom.SecretKeyRef.Name)
		}
	}
	for _, e := range c.EnvFrom {
		if e.SecretRef != nil {
			out = append(out, e.SecretRef.Name)
		}
	}
	return out
}

// podSecretVolumes maps a pod's volumes to the Secrets they show.
func podSecretVolumes(pod *corev1.PodTemplateSpec) map[string][]string {
	out := map[string][]string{}
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil {
			out[v.Name] = append(out[v.Name], v.Secret.SecretName)
		}
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.Secret != nil {
					out[v.Name] = append(out[v.Name], s.Secret.Name)
				}
			}
		}
	}
	return out
}

func checkSecrets(m *manifests) []error {
	var errs []error
	made, err := madeByBootstrap()
	if err != nil {
		return []error{err}
	}
	for s := range owners {
		if made["Secret/"+s] == nil {
			errs = append(errs, fmt.Errorf("secret %s has owners here, but the bootstrap Job does not make it", s))
		}
	}
	for obj := range made {
		if s, ok := strings.CutPrefix(obj, "Secret/"); ok {
			if _, ok := owners[s]; !ok {
				errs = append(errs, fmt.Errorf("the bootstrap Job makes secret %s: say who may mount it in owners", s))
			}
		}
	}
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	mounted := map[string]bool{}
	for _, w := range ws {
		ownerHere := map[string]bool{}
		for _, c := range containers(w.pod) {
			id := w.String() + "/" + c.Name
			for _, s := range secretReads(w.pod, c) {
				mounted[s+" "+id] = true
				if !slices.Contains(owners[s], id) {
					errs = append(errs, fmt.Errorf("%s can read secret %s, which is not its own (its owners: %v)", id, s, owners[s]))
				} else {
					ownerHere[s] = true
				}
			}
		}
		// The kubelet fetches a pod's Secret volumes for the pod, even
		// one no container mounts.
		for v, ss := range podSecretVolumes(w.pod) {
			for _, s := range ss {
				if !ownerHere[s] {
					errs = append(errs, fmt.Errorf("%s: volume %s shows secret %s, but no container of the pod owns it", w, v, s))
				}
			}
		}
	}
	for s, ids := range owners {
		for _, id := range ids {
			if !mounted[s+" "+id] {
				errs = append(errs, fmt.Errorf("%s does not mount its secret %s", id, s))
			}
		}
	}
	return errs
}

// containerPaths are the absolute paths a container's flags and readiness
// probe name (not the binary).
func containerPaths(c *corev1.Container) (map[string]string, error) {
	flags, err := flagArgs(c.Args)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	add := func(prefix string, fs map[string]string) {
		for k, v := range fs {
			if strings.HasPrefix(v, "/") {
				out[prefix+k] = v
			}
		}
	}
	add("--", flags)
	for _, kp := range probes(c) {
		if p := kp.probe; p.Exec != nil && len(p.Exec.Command) > 0 {
			pf, err := flagArgs(p.Exec.Command[1:])
			if err != nil {
				return nil, fmt.Errorf("%s probe: %w", kp.kind, err)
			}
			add(kp.kind+" probe --", pf)
		}
	}
	return out, nil
}

// kindProbe is one of a container's probes, and which.
type kindProbe struct {
	kind  string // readiness, liveness, startup
	probe *corev1.Probe
}

// probes are a container's probes.
func probes(c *corev1.Container) []kindProbe {
	var out []kindProbe
	for _, kp := range []kindProbe{{"readiness", c.ReadinessProbe}, {"liveness", c.LivenessProbe}, {"startup", c.StartupProbe}} {
		if kp.probe != nil {
			out = append(out, kp)
		}
	}
	return out
}

// mountOf is the mount holding path p in c (the longest mountPath).
func mountOf(c *corev1.Container, p string) *corev1.VolumeMount {
	var best *corev1.VolumeMount
	for i, vm := range c.VolumeMounts {
		if (p == vm.MountPath || strings.HasPrefix(p, strings.TrimSuffix(vm.MountPath, "/")+"/")) && (best == nil || len(vm.MountPath) > len(best.MountPath)) {
			best = &c.VolumeMounts[i]
		}
	}
	return best
}

// writes are the flags naming what a process writes: on a writable volume.
var writes = map[string]bool{"--data-dir": true, "--id-file": true, "--snapshot-dir": true}

func checkFiles(m *manifests) []error {
	var errs []error
	made, err := madeByBootstrap()
	if err != nil {
		return []error{err}
	}
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	for _, w := range ws {
		vols := map[string]*corev1.Volume{}
		for i, v := range w.pod.Spec.Volumes {
			vols[v.Name] = &w.pod.Spec.Volumes[i]
		}
		claimUsers := map[string][]string{}
		for _, c := range containers(w.pod) {
			id := w.String() + "/" + c.Name
			init := slices.ContainsFunc(w.pod.Spec.InitContainers, func(ic corev1.Container) bool { return ic.Name == c.Name })
			for _, vm := range c.VolumeMounts {
				switch {
				case vols[vm.Name] != nil:
				case slices.Contains(w.claims, vm.Name):
					if !init {
						claimUsers[vm.Name] = append(claimUsers[vm.Name], c.Name)
					}
				default:
					errs = append(errs, fmt.Errorf("%s mounts %s, which is no volume of the pod", id, vm.Name))
				}
			}
			paths, err := containerPaths(c)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", id, err))
				continue
			}
			for _, flag := range slices.Sorted(maps.Keys(paths)) {
				p := paths[flag]
				vm := mountOf(c, p)
				if vm == nil {
					errs = append(errs, fmt.Errorf("%s %s=%s is on no volume: the image has nothing there (FROM scratch)", id, flag, p))
					continue
				}
				rel := strings.TrimPrefix(strings.TrimPrefix(p, vm.MountPath), "/")
				if v := vols[vm.Name]; v != nil {
					var obj string
					switch {
					case v.Secret != nil:
						obj = "Secret/" + v.Secret.SecretName
					case v.ConfigMap != nil:
						obj = "ConfigMap/" + v.ConfigMap.Name
					}
					if obj != "" && !slices.Contains(made[obj], rel) {
						errs = append(errs, fmt.Errorf("%s %s=%s: %s has no key %q (it has %v)", id, flag, p, obj, rel, made[obj]))
					}
				}
				if writes[flag] && vm.ReadOnly {
					errs = append(errs, fmt.Errorf("%s %s=%s is on a read-only mount", id, flag, p))
				}
				// A data directory outlives the pod: on its own claim.
				if flag == "--data-dir" && (w.kind != "StatefulSet" || !slices.Contains(w.claims, vm.Name)) {
					errs = append(errs, fmt.Errorf("%s --data-dir=%s is not on a volume claim of a StatefulSet: it would not survive the pod", id, p))
				}
			}
		}
		for claim, users := range claimUsers {
			if len(users) > 1 {
				errs = append(errs, fmt.Errorf("%s: containers %v share the volume %s: each process's data (and keys) on its own", w, users, claim))
			}
		}
	}
	return errs
}

func checkTokens(m *manifests) []error {
	var errs []error
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	for _, w := range ws {
		spec := w.pod.Spec
		if w.kind == "Job" {
			if spec.ServiceAccountName != "curia-bootstrap" || m.serviceAccounts[spec.ServiceAccountName] == nil {
				errs = append(errs, fmt.Errorf("%s runs as service account %q, want curia-bootstrap (defined here)", w, spec.ServiceAccountName))
			}
			continue
		}
		// No curia process talks to the Kubernetes API: its token would be
		// a credential the process does not need.
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			errs = append(errs, fmt.Errorf("%s mounts a service account token: set automountServiceAccountToken: false", w))
		}
		if spec.ServiceAccountName != "" {
			errs = append(errs, fmt.Errorf("%s runs as service account %s", w, spec.ServiceAccountName))
		}
	}
	return errs
}

// controlPlaneSize is the bootstrap Job's --control-plane.
func controlPlaneSize(m *manifests) (int, error) {
	j := m.jobs["curia-bootstrap"]
	if j == nil || len(j.Spec.Template.Spec.Containers) != 1 {
		return 0, errors.New("no curia-bootstrap Job with one container")
	}
	f, err := flagArgs(j.Spec.Template.Spec.Containers[0].Args)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(f["control-plane"])
}

func checkPDBs(m *manifests) []error {
	var errs []error
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	covered := map[string][]string{}
	for _, name := range slices.Sorted(maps.Keys(m.pdbs)) {
		pdb := m.pdbs[name]
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			errs = append(errs, fmt.Errorf("PodDisruptionBudget/%s: %w", name, err))
			continue
		}
		var matched []string
		for _, w := range ws {
			if w.kind != "Job" && sel.Matches(labels.Set(w.pod.Labels)) {
				matched = append(matched, w.name)
				covered[w.name] = append(covered[w.name], name)
			}
		}
		if len(matched) == 0 {
			errs = append(errs, fmt.Errorf("PodDisruptionBudget/%s selects no pods", name))
		}
		if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.Type != intstr.Int || pdb.Spec.MaxUnavailable.IntValue() < 1 {
			errs = append(errs, fmt.Errorf("PodDisruptionBudget/%s: want maxUnavailable, a number of pods (a percentage or minAvailable follows the replicas, not the voters)", name))
			continue
		}
		// A pod that is not ready would otherwise count as the one
		// disruption allowed: a crash-looping node pod would block every
		// drain for as long as it crash-loops.
		if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
			errs = append(errs, fmt.Errorf("PodDisruptionBudget/%s: unhealthyPodEvictionPolicy %v, want AlwaysAllow: an unready pod would block every drain", name, ptrOr(p, "")))
		}
		maxUnavailable := pdb.Spec.MaxUnavailable.IntValue()
		for _, w := range ws {
			if slices.Contains(matched, w.name) && w.kind == "Deployment" && maxUnavailable >= w.replicas {
				errs = append(errs, fmt.Errorf("PodDisruptionBudget/%s lets a drain take all %d replicas of %s", name, w.replicas, w))
			}
		}
		// Nodes: one budget across both StatefulSets (two would let one
		// node of each go at once), small enough that the voters keep
		// their quorum however the voters are spread over the nodes.
		if slices.ContainsFunc(matched, func(n string) bool { return slices.Contains(nodeSets, n) }) {
			if !slices.Equal(slices.Sorted(slices.Values(matched)), slices.Sorted(slices.Values(nodeSets))) {
				errs = append(errs, fmt.Errorf("PodDisruptionBudget/%s selects %v: the nodes' budget must cover exactly %v", name, matched, nodeSets))
			}
			size, err := controlPlaneSize(m)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if quorum := size/2 + 1; size-maxUnavailable < quorum || maxUnavailable != 1 {
				errs = append(errs, fmt.Errorf("PodDisruptionBudget/%s: maxUnavailable %d of the nodes: %d voters keep their quorum of %d only with 1", name, maxUnavailable, size, quorum))
			}
		}
	}
	for _, w := range ws {
		if w.kind != "Job" && len(covered[w.name]) != 1 {
			errs = append(errs, fmt.Errorf("%s is covered by disruption budgets %v, want exactly one", w, covered[w.name]))
		}
	}
	return errs
}

// listenPorts are the ports a container's --listen* flags serve, by flag.
func listenPorts(c *corev1.Container) (map[string]int, error) {
	flags, err := flagArgs(c.Args)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for k, v := range flags {
		if k != "listen" && !strings.HasPrefix(k, "listen-") {
			continue
		}
		_, port, err := net.SplitHostPort(v)
		if err != nil {
			return nil, fmt.Errorf("--%s=%s: %w", k, v, err)
		}
		if out[k], err = strconv.Atoi(port); err != nil {
			return nil, fmt.Errorf("--%s=%s: %w", k, v, err)
		}
	}
	return out, nil
}

// probeTimeout is curia-probe's default --timeout, in seconds.
const probeTimeout = 3

func checkReadiness(m *manifests) []error {
	var errs []error
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	for _, w := range ws {
		if w.kind == "Job" {
			continue // it runs to completion: nothing to route to
		}
		for i := range w.pod.Spec.Containers {
			c := &w.pod.Spec.Containers[i]
			id := w.String() + "/" + c.Name
			pf, perrs := checkProbe(id, "readiness", c, c.ReadinessProbe)
			errs = append(errs, perrs...)
			// Ready is SERVING: a process that is merely alive cannot
			// do its job yet.
			if pf["live"] == "true" {
				errs = append(errs, fmt.Errorf("%s: readiness probe with --live: traffic would reach a process that cannot serve it yet", id))
			}
		}
	}
	return errs
}

// checkProbe checks one probe of container c (id names it): exec
// /bin/curia-probe, given time enough, asking the container's own port
// on loopback: its gRPC API's health over mTLS (--addr, with
// certificates), or its plain-HTTP /healthz (--http, for a process that
// may hold no certificate). It returns the probe's flags.
func checkProbe(id, kind string, c *corev1.Container, p *corev1.Probe) (map[string]string, []error) {
	var errs []error
	switch {
	case p == nil:
		return nil, []error{fmt.Errorf("%s has no %s probe", id, kind)}
	case p.GRPC != nil || p.HTTPGet != nil || p.TCPSocket != nil:
		// The kubelet's gRPC probe speaks plaintext; curia serves
		// mutual TLS only. An open port is not health, and a 503 of
		// /healthz is no sign of a dead process.
		return nil, []error{fmt.Errorf("%s: %s by %v, want gRPC health over mTLS: exec /bin/curia-probe", id, kind, p.ProbeHandler)}
	case p.Exec == nil || len(p.Exec.Command) == 0 || p.Exec.Command[0] != "/bin/curia-probe":
		return nil, []error{fmt.Errorf("%s: %s probe %v, want exec /bin/curia-probe", id, kind, p.Exec)}
	}
	if p.TimeoutSeconds <= probeTimeout {
		errs = append(errs, fmt.Errorf("%s: %s timeoutSeconds %d: the kubelet kills curia-probe before its own %ds timeout", id, kind, p.TimeoutSeconds, probeTimeout))
	}
	pf, err := flagArgs(p.Exec.Command[1:])
	if err != nil {
		return nil, append(errs, fmt.Errorf("%s: %s probe: %w", id, kind, err))
	}
	ports, err := listenPorts(c)
	if err != nil {
		return pf, append(errs, fmt.Errorf("%s: %w", id, err))
	}
	// Which of its own ports the probe asks: the gRPC API's (health
	// over mTLS, with certificates it holds), or for consensus, which
	// may hold none, its plain-HTTP /healthz on loopback.
	var flag, target string
	switch {
	case pf["addr"] != "":
		flag, target = "listen", pf["addr"]
		for _, f := range []string{"ca", "cert", "key"} {
			if pf[f] == "" {
				errs = append(errs, fmt.Errorf("%s: %s probe without --%s: no mutual TLS", id, kind, f))
			}
		}
	case pf["http"] != "":
		u, err := url.Parse(pf["http"])
		if err != nil || u.Path != "/healthz" {
			return pf, append(errs, fmt.Errorf("%s: %s probe --http=%s, want http://127.0.0.1:<metrics port>/healthz", id, kind, pf["http"]))
		}
		flag, target = "listen-metrics", u.Host
	default:
		return pf, append(errs, fmt.Errorf("%s: %s probe asks nothing (--addr or --http)", id, kind))
	}
	host, port, err := net.SplitHostPort(target)
	if err != nil || host != "127.0.0.1" || port != strconv.Itoa(ports[flag]) {
		errs = append(errs, fmt.Errorf("%s: %s probe asks %s, want 127.0.0.1 and the --%s port %d", id, kind, target, flag, ports[flag]))
	}
	return pf, errs
}

// The least time a probe gives a process before the kubelet restarts it,
// failureThreshold × periodSeconds: a start (etcd replaying its log, or
// waiting for its peers' pods to be scheduled) and, once started, a
// stall (a long GC or disk pause).
const (
	minStartupSeconds  = 300
	minLivenessSeconds = 30
)

// checkLiveness: every process is restarted when it stops answering, and
// only then. A startup probe holds the liveness probe back while the
// process starts; both ask with --live, so that a process waiting for
// etcd, its quorum or its approval (NOT_SERVING, which can last as long
// as another part of the cluster is away) is not restarted, which would
// only delay it; and they ask with certificates the container has from
// the start, not ones it is given later.
func checkLiveness(m *manifests) []error {
	var errs []error
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	for _, w := range ws {
		if w.kind == "Job" {
			continue // it runs to completion, under activeDeadlineSeconds
		}
		vols := podSecretVolumes(w.pod)
		for i := range w.pod.Spec.Containers {
			c := &w.pod.Spec.Containers[i]
			id := w.String() + "/" + c.Name
			for _, kind := range []string{"startup", "liveness"} {
				p, least := c.StartupProbe, minStartupSeconds
				if kind == "liveness" {
					p, least = c.LivenessProbe, minLivenessSeconds
				}
				pf, perrs := checkProbe(id, kind, c, p)
				errs = append(errs, perrs...)
				if pf == nil {
					continue
				}
				if pf["live"] != "true" {
					errs = append(errs, fmt.Errorf("%s: %s probe without --live: it would restart a process that waits, NOT_SERVING, for etcd, its quorum or its approval", id, kind))
				}
				// (0: the API server's defaults, 3 and 10.)
				if got := cmp.Or(p.FailureThreshold, 3) * cmp.Or(p.PeriodSeconds, 10); got < int32(least) {
					errs = append(errs, fmt.Errorf("%s: %s probe gives up after %ds (failureThreshold × periodSeconds), want at least %ds", id, kind, got, least))
				}
				for _, f := range []string{"cert", "key"} {
					if pf[f] == "" {
						continue
					}
					if vm := mountOf(c, pf[f]); vm == nil || vols[vm.Name] == nil {
						errs = append(errs, fmt.Errorf("%s: %s probe --%s=%s is on no Secret volume: a file the process makes later (at enrolment) fails the probe until then", id, kind, f, pf[f]))
					}
				}
			}
		}
	}
	return errs
}

func checkRequests(m *manifests) []error {
	var errs []error
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	for _, w := range ws {
		for _, c := range containers(w.pod) {
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if q, ok := c.Resources.Requests[r]; !ok || q.Sign() <= 0 {
					errs = append(errs, fmt.Errorf("%s/%s requests no %s: the scheduler would place it anywhere", w, c.Name, r))
				}
			}
		}
	}
	return errs
}

// checkLimits: every container has a memory limit, at least its request,
// so that a leak fails its own pod and not the Kubernetes node under
// every pod; no container has a CPU limit: CFS quota stops a process for
// the rest of a 100 ms period once it spent its quota, longer than etcd's
// heartbeat interval, and curia's processes time heartbeats and leases.
// The CPU request is their share when the node is busy.
func checkLimits(m *manifests) []error {
	var errs []error
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	for _, w := range ws {
		for _, c := range containers(w.pod) {
			id := w.String() + "/" + c.Name
			limit, ok := c.Resources.Limits[corev1.ResourceMemory]
			request := c.Resources.Requests[corev1.ResourceMemory]
			switch {
			case !ok || limit.Sign() <= 0:
				errs = append(errs, fmt.Errorf("%s has no memory limit: a leak would take the Kubernetes node's memory", id))
			case limit.Cmp(request) < 0:
				errs = append(errs, fmt.Errorf("%s: memory limit %s below its request %s", id, limit.String(), request.String()))
			}
			if q, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
				errs = append(errs, fmt.Errorf("%s: CPU limit %s: CFS throttling would stall it past etcd's heartbeats and curia's leases; give it a request", id, q.String()))
			}
		}
	}
	return errs
}

// imageBinaries are the binaries in the image: `make build`'s CMDS, which
// `make images` copies to /bin.
var imageBinaries = sync.OnceValues(func() ([]string, error) {
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		return nil, err
	}
	m := regexp.MustCompile(`(?m)^CMDS\s*:=(.*)$`).FindSubmatch(b)
	if m == nil {
		return nil, errors.New("no CMDS in the Makefile")
	}
	var out []string
	for _, c := range strings.Fields(string(m[1])) {
		out = append(out, "/bin/"+path.Base(c))
	}
	return out, nil
})

func checkImages(m *manifests) []error {
	var errs []error
	bins, err := imageBinaries()
	if err != nil {
		return []error{err}
	}
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	for _, w := range ws {
		for _, c := range containers(w.pod) {
			id := w.String() + "/" + c.Name
			if c.Image != wantImage {
				errs = append(errs, fmt.Errorf("%s runs image %s, want %s", id, c.Image, wantImage))
			}
			if c.ImagePullPolicy != corev1.PullIfNotPresent && c.ImagePullPolicy != corev1.PullNever {
				errs = append(errs, fmt.Errorf("%s: imagePullPolicy %q: the image is loaded into the nodes, there is no registry (IfNotPresent or Never)", id, c.ImagePullPolicy))
			}
			cmds := [][]string{c.Command}
			for _, kp := range probes(c) {
				if kp.probe.Exec != nil {
					cmds = append(cmds, kp.probe.Exec.Command)
				}
			}
			for _, cmd := range cmds {
				if len(cmd) == 0 || !slices.Contains(bins, cmd[0]) {
					errs = append(errs, fmt.Errorf("%s runs %v: the image has only %v", id, cmd, bins))
				}
			}
		}
	}
	return errs
}

func checkHeadless(m *manifests) []error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(m.statefulSets)) {
		s := m.statefulSets[name]
		svc := m.services[s.Spec.ServiceName]
		if svc == nil {
			errs = append(errs, fmt.Errorf("StatefulSet/%s: serviceName %q is no Service here: its pods get no stable names", name, s.Spec.ServiceName))
			continue
		}
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			errs = append(errs, fmt.Errorf("StatefulSet/%s: Service %s is not headless (clusterIP %q): no per-pod DNS names", name, svc.Name, svc.Spec.ClusterIP))
		}
		if !svc.Spec.PublishNotReadyAddresses {
			errs = append(errs, fmt.Errorf("Service %s: publishNotReadyAddresses false: etcd peers could not reach a member before it is ready", svc.Name))
		}
		if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(s.Spec.Template.Labels)) {
			errs = append(errs, fmt.Errorf("Service %s (selector %v) does not select StatefulSet/%s's pods", svc.Name, svc.Spec.Selector, name))
		}
		for _, port := range []int32{2379, 2380, 7100} {
			if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == port }) {
				errs = append(errs, fmt.Errorf("Service %s has no port %d", svc.Name, port))
			}
		}
	}
	return errs
}

func checkServices(m *manifests) []error {
	var errs []error
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	for _, name := range slices.Sorted(maps.Keys(m.services)) {
		svc := m.services[name]
		if len(svc.Spec.Selector) == 0 {
			errs = append(errs, fmt.Errorf("Service %s has no selector", name))
			continue
		}
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		n := 0
		for _, w := range ws {
			if w.kind == "Job" || !sel.Matches(labels.Set(w.pod.Labels)) {
				continue
			}
			n++
			for _, sp := range svc.Spec.Ports {
				if !servesPort(w.pod, sp.TargetPort) {
					errs = append(errs, fmt.Errorf("Service %s port %s: targetPort %s is no port %s serves", name, sp.Name, sp.TargetPort.String(), w))
				}
			}
		}
		if n == 0 {
			errs = append(errs, fmt.Errorf("Service %s selects no pods", name))
		}
	}
	// Every declared container port is a port the process listens on, and
	// the other way round.
	for _, w := range ws {
		for _, c := range containers(w.pod) {
			ports, err := listenPorts(c)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s/%s: %w", w, c.Name, err))
				continue
			}
			var listened, declared []int
			for _, p := range ports {
				listened = append(listened, p)
			}
			for _, p := range c.Ports {
				declared = append(declared, int(p.ContainerPort))
				if len(validation.IsValidPortName(p.Name)) > 0 {
					errs = append(errs, fmt.Errorf("%s/%s: port name %q is invalid", w, c.Name, p.Name))
				}
			}
			slices.Sort(listened)
			slices.Sort(declared)
			if !slices.Equal(listened, declared) {
				errs = append(errs, fmt.Errorf("%s/%s declares ports %v but listens on %v", w, c.Name, declared, listened))
			}
		}
	}
	return errs
}

// servesPort: a container of pod declares port (by name or number).
func servesPort(pod *corev1.PodTemplateSpec, port intstr.IntOrString) bool {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if (port.Type == intstr.String && p.Name == port.StrVal) || (port.Type == intstr.Int && p.ContainerPort == port.IntVal) {
				return true
			}
		}
	}
	return false
}

// container finds a container of a workload's pod.
func container(pod *corev1.PodTemplateSpec, name string) *corev1.Container {
	for _, c := range containers(pod) {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func checkAddresses(m *manifests) []error {
	var errs []error
	// The names node pods have: <statefulset>-<ordinal>.<service>.
	podNames := map[string]bool{}
	for _, name := range nodeSets {
		s := m.statefulSets[name]
		if s == nil {
			return []error{fmt.Errorf("no StatefulSet/%s", name)}
		}
		for i := range int(ptrOr(s.Spec.Replicas, 1)) {
			podNames[fmt.Sprintf("%s-%d.%s", name, i, s.Spec.ServiceName)] = true
		}
		if name == "curia-seed" && (s.Spec.ServiceName != ServiceNodes || !podNames[SeedPod+"."+ServiceNodes]) {
			errs = append(errs, fmt.Errorf("the bootstrap node's certificates name %s.%s, which is not curia-seed's pod", SeedPod, ServiceNodes))
		}
		// Each node advertises its stable name: etcd's peer URLs are part
		// of the membership and must never change, and its certificates
		// name it.
		self := "$(POD_NAME)." + s.Spec.ServiceName
		cons, agent := container(&s.Spec.Template, "consensus"), container(&s.Spec.Template, "roleserve")
		if cons == nil || agent == nil {
			errs = append(errs, fmt.Errorf("StatefulSet/%s: want containers consensus and roleserve", name))
			continue
		}
		cf, err1 := flagArgs(cons.Args)
		af, err2 := flagArgs(agent.Args)
		if err := errors.Join(err1, err2); err != nil {
			errs = append(errs, err)
			continue
		}
		cp, _ := listenPorts(cons)
		for flag, want := range map[string]string{
			"advertise-peer-url":   fmt.Sprintf("https://%s:%d", self, cp["listen-peer"]),
			"advertise-client-url": fmt.Sprintf("https://%s:%d", self, cp["listen-client"]),
		} {
			if cf[flag] != want {
				errs = append(errs, fmt.Errorf("StatefulSet/%s consensus --%s=%s, want %s", name, flag, cf[flag], want))
			}
		}
		for flag, want := range map[string]string{"address": self, "consensus": fmt.Sprintf("%s:%d", self, cp["listen"])} {
			if af[flag] != want {
				errs = append(errs, fmt.Errorf("StatefulSet/%s roleserve --%s=%s, want %s", name, flag, af[flag], want))
			}
		}
	}
	d := m.deployments["curia-curator"]
	if d == nil || container(&d.Spec.Template, "curator") == nil {
		return append(errs, errors.New("no Deployment curia-curator with a container curator"))
	}
	cp, err := listenPorts(container(&d.Spec.Template, "curator"))
	if err != nil {
		return append(errs, err)
	}
	curatorAddr := fmt.Sprintf("%s:%d", ServiceCurator, cp["listen"])
	ws, err := m.workloads()
	if err != nil {
		return append(errs, err)
	}
	for _, w := range ws {
		for _, c := range containers(w.pod) {
			f, err := flagArgs(c.Args)
			if err != nil {
				continue // checkFiles says
			}
			id := w.String() + "/" + c.Name
			// Every way to the curators is the curators' Service.
			if v, ok := f["curator"]; ok && strings.TrimPrefix(v, "dns:///") != curatorAddr {
				errs = append(errs, fmt.Errorf("%s --curator=%s, want %s (the Service)", id, v, curatorAddr))
			}
			// Lists of nodes name node pods that exist, at their ports.
			for flag, port := range map[string]string{"etcd": "2379", "consensus": "7100"} {
				v, ok := f[flag]
				if !ok || strings.HasPrefix(v, "$(") || (flag == "consensus" && w.kind == "StatefulSet") {
					continue
				}
				for _, a := range strings.Split(v, ",") {
					hostPort := strings.TrimPrefix(a, "https://")
					host, p, err := net.SplitHostPort(hostPort)
					if err != nil || !podNames[host] || p != port || (flag == "etcd") != strings.HasPrefix(a, "https://") {
						errs = append(errs, fmt.Errorf("%s --%s: %s is no node pod's %s port (pods: %v)", id, flag, a, port, slices.Sorted(maps.Keys(podNames))))
					}
				}
			}
		}
	}
	return errs
}

func checkBootstrapJob(m *manifests) []error {
	var errs []error
	j := m.jobs["curia-bootstrap"]
	if j == nil {
		return []error{errors.New("no Job curia-bootstrap")}
	}
	c := j.Spec.Template.Spec.Containers[0]
	f, err := flagArgs(c.Args)
	if err != nil {
		return []error{err}
	}
	nodes := 0
	for _, name := range nodeSets {
		if s := m.statefulSets[name]; s != nil {
			nodes += int(ptrOr(s.Spec.Replicas, 1))
		}
	}
	if f["nodes"] != strconv.Itoa(nodes) {
		errs = append(errs, fmt.Errorf("curia-bootstrap --nodes=%s, but the node StatefulSets have %d replicas: it would wait forever, or leave nodes unapproved", f["nodes"], nodes))
	}
	if size, err := controlPlaneSize(m); err != nil || size < 1 || size > nodes || size%2 == 0 {
		errs = append(errs, fmt.Errorf("curia-bootstrap --control-plane=%s: an odd number of voters, at most the %d nodes", f["control-plane"], nodes))
	}
	if p := j.Spec.PodReplacementPolicy; p == nil || *p != "Failed" {
		errs = append(errs, errors.New("curia-bootstrap: podReplacementPolicy must be Failed: never two bootstraps at once"))
	}
	if rp := j.Spec.Template.Spec.RestartPolicy; rp != corev1.RestartPolicyNever && rp != corev1.RestartPolicyOnFailure {
		errs = append(errs, fmt.Errorf("curia-bootstrap: restartPolicy %q", rp))
	}
	// Its ServiceAccount's rights: create Secrets and ConfigMaps, read and
	// replace exactly the ones it makes, nothing else.
	made, err := madeByBootstrap()
	if err != nil {
		return append(errs, err)
	}
	wantNames := map[string][]string{}
	for obj := range made {
		kind, name, _ := strings.Cut(obj, "/")
		res := strings.ToLower(kind) + "s"
		wantNames[res] = append(wantNames[res], name)
	}
	role := m.roles["curia-bootstrap"]
	if role == nil {
		return append(errs, errors.New("no Role curia-bootstrap"))
	}
	gotNames := map[string][]string{}
	for _, r := range role.Rules {
		if !slices.Equal(r.APIGroups, []string{""}) {
			errs = append(errs, fmt.Errorf("Role curia-bootstrap: rule for API groups %v", r.APIGroups))
		}
		for _, res := range r.Resources {
			if res != "secrets" && res != "configmaps" {
				errs = append(errs, fmt.Errorf("Role curia-bootstrap: rule for %s", res))
			}
			for _, v := range r.Verbs {
				switch {
				case v == "create" && len(r.ResourceNames) == 0:
				case (v == "get" || v == "update") && len(r.ResourceNames) > 0:
				default:
					errs = append(errs, fmt.Errorf("Role curia-bootstrap: verb %s on %s %v", v, res, r.ResourceNames))
				}
			}
			gotNames[res] = append(gotNames[res], r.ResourceNames...)
		}
	}
	for res, names := range wantNames {
		if !slices.Equal(slices.Sorted(slices.Values(names)), slices.Sorted(slices.Values(gotNames[res]))) {
			errs = append(errs, fmt.Errorf("Role curia-bootstrap names %s %v, want the ones the Job makes: %v", res, gotNames[res], names))
		}
	}
	rb := m.roleBindings["curia-bootstrap"]
	wantNS := m.namespace
	if wantNS == "" {
		wantNS = "default" // the base, applied as is
	}
	if rb == nil || rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || len(rb.Subjects) != 1 ||
		rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != j.Spec.Template.Spec.ServiceAccountName || rb.Subjects[0].Namespace != wantNS {
		errs = append(errs, fmt.Errorf("RoleBinding curia-bootstrap %+v does not bind the Role to the Job's service account in namespace %s", rb, wantNS))
	}
	return errs
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func checkEnvRefs(m *manifests) []error {
	var errs []error
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	for _, w := range ws {
		for _, c := range containers(w.pod) {
			id := w.String() + "/" + c.Name
			defined := map[string]bool{}
			for _, e := range c.Env {
				defined[e.Name] = true
			}
			// The kubelet expands $(VAR) in command and args; an unknown
			// one stays as is, a name no one resolves.
			for _, a := range slices.Concat(c.Command, c.Args) {
				for _, ref := range envRef.FindAllStringSubmatch(a, -1) {
					if !defined[ref[1]] {
						errs = append(errs, fmt.Errorf("%s: %s refers to $(%s), which its env does not define", id, a, ref[1]))
					}
				}
			}
			// ... but not in a probe's command.
			for _, kp := range probes(c) {
				if p := kp.probe; p.Exec != nil && envRef.MatchString(strings.Join(p.Exec.Command, " ")) {
					errs = append(errs, fmt.Errorf("%s: the %s probe's command refers to $(...), which the kubelet does not expand there", id, kp.kind))
				}
			}
		}
	}
	return errs
}

func checkSecurityContext(m *manifests) []error {
	var errs []error
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	for _, w := range ws {
		psc := w.pod.Spec.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
			errs = append(errs, fmt.Errorf("%s does not run as a non-root user", w))
			continue
		}
		// Secret volumes are root's (mode 0440) and a new volume is
		// root's: the pod's group must own them for its processes to read
		// their keys and write their data.
		if len(podSecretVolumes(w.pod)) > 0 || len(w.claims) > 0 {
			if psc.FSGroup == nil || *psc.FSGroup != ptrOr(psc.RunAsGroup, -1) {
				errs = append(errs, fmt.Errorf("%s has volumes but no fsGroup equal to its runAsGroup: its non-root processes could not read its secrets or write its data", w))
			}
		}
		for _, c := range containers(w.pod) {
			sc := c.SecurityContext
			if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
				errs = append(errs, fmt.Errorf("%s/%s: want a read-only root filesystem, no privilege escalation, every capability dropped", w, c.Name))
			}
		}
	}
	return errs
}

// zoneKey is the well-known label of a Kubernetes node's zone, which the
// API server copies onto a pod when it binds it (PodTopologyLabels).
const zoneKey = "topology.kubernetes.io/zone"

// checkZones: the node pods spread across zones, counting the pods of both
// node StatefulSets, and each agent asks for the zone of the Kubernetes node
// its pod runs on as its "zone" label (autopilot spreads the voters across
// it): from the pod's own label, never a zone written into the manifests,
// which every pod of the StatefulSet would claim wherever it runs.
func checkZones(m *manifests) []error {
	var errs []error
	ws, err := m.workloads()
	if err != nil {
		return []error{err}
	}
	for _, name := range nodeSets {
		s := m.statefulSets[name]
		if s == nil {
			errs = append(errs, fmt.Errorf("no StatefulSet/%s", name))
			continue
		}
		pod := &s.Spec.Template
		var spread *corev1.TopologySpreadConstraint
		for i, c := range pod.Spec.TopologySpreadConstraints {
			if c.TopologyKey == zoneKey {
				spread = &pod.Spec.TopologySpreadConstraints[i]
			}
		}
		if spread == nil {
			errs = append(errs, fmt.Errorf("StatefulSet/%s: no topologySpreadConstraint on %s: its pods may all land in one zone", name, zoneKey))
		} else {
			if spread.MaxSkew != 1 {
				errs = append(errs, fmt.Errorf("StatefulSet/%s: zone spread maxSkew %d, want 1", name, spread.MaxSkew))
			}
			// The skew is counted over the pods the selector matches:
			// every node pod (both StatefulSets), and only those.
			sel, err := metav1.LabelSelectorAsSelector(spread.LabelSelector)
			if err != nil {
				errs = append(errs, fmt.Errorf("StatefulSet/%s: zone spread selector: %w", name, err))
				continue
			}
			for _, w := range ws {
				if node := w.kind == "StatefulSet" && slices.Contains(nodeSets, w.name); node != sel.Matches(labels.Set(w.pod.Labels)) {
					errs = append(errs, fmt.Errorf("StatefulSet/%s: the zone spread's selector %v matches %s: %v, want every node pod and nothing else", name, sel, w, !node))
				}
			}
		}
		agent := container(pod, "roleserve")
		if agent == nil {
			errs = append(errs, fmt.Errorf("StatefulSet/%s: no container roleserve", name))
			continue
		}
		f, err := flagArgs(agent.Args)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		zone := ""
		for kv := range strings.SplitSeq(f["labels"], ",") {
			if k, v, ok := strings.Cut(kv, "="); ok && k == "zone" {
				zone = v
			}
		}
		ref := envRef.FindStringSubmatch(zone)
		if ref == nil || ref[0] != zone {
			errs = append(errs, fmt.Errorf("StatefulSet/%s roleserve --labels=%s: want zone=$(VAR), VAR the pod's %s label (downward API), not a zone every pod of it would claim", name, f["labels"], zoneKey))
			continue
		}
		want := fmt.Sprintf("metadata.labels['%s']", zoneKey)
		if e := envVar(agent, ref[1]); e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != want {
			errs = append(errs, fmt.Errorf("StatefulSet/%s roleserve: $(%s) is %v, want the downward API's %s", name, ref[1], e, want))
		}
	}
	return errs
}

// envVar is a container's environment variable, nil if it has none.
func envVar(c *corev1.Container, name string) *corev1.EnvVar {
	for i, e := range c.Env {
		if e.Name == name {
			return &c.Env[i]
		}
	}
	return nil
}
