package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rolling"
	"curia.dev/platform/rpc"
)

// ComposeUpgrade rolls the compose cluster (deploy/compose, make up) onto
// an image, one container at a time, in platform/rolling's order: each
// node's containers (its network holder, consensus and roleserve) are
// recreated together while the node is in maintenance; each curator and
// reconciler replica is removed and compose creates it again (up
// --no-recreate --scale), so the other replicas keep serving. With the
// image the cluster runs, it is a rolling restart.
//
// It runs on the host: it reaches the curators and reconcilers at the
// ports compose publishes, which a recreated replica may change, so it
// asks Docker for them after each replica.
type ComposeUpgrade struct {
	// Dir holds make up's env file and the admin's files (.curia-compose).
	Dir string
	// Cluster is the cluster name.
	Cluster string
	// Image is the image to roll onto (CURIA_IMAGE).
	Image string
	// Compose is the compose command (docker compose, or docker-compose),
	// and Env its environment (COMPOSE_FILE, COMPOSE_PROJECT_NAME).
	Compose []string
	Env     []string
	// Out gets a line per step.
	Out io.Writer
}

// Run checks the image and the cluster, then rolls it. Nothing is changed
// when either check fails.
func (u ComposeUpgrade) Run(ctx context.Context) (*rolling.Report, error) {
	f := &composeFleet{u: u}
	if _, err := f.docker(ctx, "image", "inspect", "--format", "{{.Id}}", u.Image); err != nil {
		return nil, fmt.Errorf("no image %s, so nothing was changed: build it first (make images CURIA_IMAGE=%s)", u.Image, u.Image)
	}
	env, err := ReadEnvFile(filepath.Join(u.Dir, "env"))
	if err != nil {
		return nil, fmt.Errorf("the cluster's env file (make up writes it): %w", err)
	}
	creds, err := rpc.LoadCredentials(u.Cluster, rpc.TLSFiles{CA: env["CURIA_CACERT"], Cert: env["CURIA_ADMIN_CERT"], Key: env["CURIA_ADMIN_KEY"]})
	if err != nil {
		return nil, err
	}
	f.creds = creds
	curators, err := f.published(ctx, "curator", "7200")
	if err != nil {
		return nil, err
	}
	cc, update, err := rpc.DialReplicas(curators, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	f.updateCurators = update
	f.m = curatorv1.NewManagementClient(cc)
	report, err := rolling.Run(ctx, f, rolling.Options{
		Management:    f.m,
		Curator:       curatorv1.NewCuratorClient(cc),
		Out:           u.Out,
		Prefix:        "curia-local compose-upgrade",
		Reason:        "rolling restart (curia-local compose-upgrade to " + u.Image + ")",
		HealthTimeout: healthTimeout,
	})
	if err != nil {
		return report, err
	}
	return report, f.oneShots(ctx)
}

// oneShots recreates the development object store (s3: no curator
// depends on it, a copy that fails meanwhile is tried again) and runs the
// one-shot services (pki, init) again from the image, one after the other.
// Both are idempotent; they run so that nothing of the project is left on
// the old image: compose recreates every service that depends on one it
// recreates, so a later `make up` that found pki on the old image would
// restart every node at once.
func (f *composeFleet) oneShots(ctx context.Context) error {
	if _, err := f.compose(ctx, "up", "-d", "--no-deps", "--force-recreate", "s3"); err != nil {
		return err
	}
	for _, s := range []string{"pki", "init"} {
		if _, err := f.compose(ctx, "up", "-d", "--no-deps", "--force-recreate", s); err != nil {
			return err
		}
		ids, err := f.compose(ctx, "ps", "-q", s)
		if err != nil {
			return err
		}
		for _, id := range strings.Fields(ids) {
			wctx, cancel := context.WithTimeout(ctx, healthTimeout)
			code, err := f.docker(wctx, "wait", id)
			cancel()
			if err != nil {
				return fmt.Errorf("%s ran again from %s and did not finish: %w (%s logs %s)", s, f.u.Image, err, strings.Join(f.u.Compose, " "), s)
			}
			if code != "0" {
				return fmt.Errorf("%s ran again from %s and exited %s: %s logs %s", s, f.u.Image, code, strings.Join(f.u.Compose, " "), s)
			}
		}
		if f.u.Out != nil {
			fmt.Fprintf(f.u.Out, "curia-local compose-upgrade: %s ran again from %s\n", s, f.u.Image)
		}
	}
	return nil
}

// composeFleet is the compose cluster's containers.
type composeFleet struct {
	u              ComposeUpgrade
	creds          *rpc.Credentials
	m              curatorv1.ManagementClient
	updateCurators func([]string)
}

// compose runs a compose command with the image to roll onto.
func (f *composeFleet) compose(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, f.u.Compose[0], append(slices.Clone(f.u.Compose[1:]), args...)...) //nolint:gosec // G204: the operator's compose command
	cmd.Env = append(slices.Clone(f.u.Env), "CURIA_IMAGE="+f.u.Image)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", strings.Join(f.u.Compose, " "), strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (f *composeFleet) docker(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "docker", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("docker %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// containers are the running containers of a service, by id.
func (f *composeFleet) containers(ctx context.Context, service string) ([]string, error) {
	out, err := f.compose(ctx, "ps", "-q", service)
	if err != nil {
		return nil, err
	}
	var running []string
	for _, id := range strings.Fields(out) {
		if st, err := f.docker(ctx, "inspect", "--format", "{{.State.Running}}", id); err == nil && st == "true" {
			running = append(running, id)
		}
	}
	return running, nil
}

// published is where the host reaches port of every running container of
// service.
func (f *composeFleet) published(ctx context.Context, service, port string) ([]string, error) {
	ids, err := f.containers(ctx, service)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, id := range ids {
		addr, err := f.docker(ctx, "port", id, port+"/tcp")
		if err != nil {
			return nil, err
		}
		if first, _, _ := strings.Cut(addr, "\n"); first != "" {
			out = append(out, strings.Replace(first, "0.0.0.0:", "127.0.0.1:", 1))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s container publishes port %s: is the compose cluster up (make up)?", service, port)
	}
	return out, nil
}

// hostnames maps the running containers of a service to their host
// names: the name each curator campaigns under, each reconciler holds the
// lease under.
func (f *composeFleet) hostnames(ctx context.Context, service string) (map[string]string, error) {
	ids, err := f.containers(ctx, service)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, id := range ids {
		h, err := f.docker(ctx, "inspect", "--format", "{{.Config.Hostname}}", id)
		if err != nil {
			return nil, err
		}
		out[h] = id
	}
	return out, nil
}

// awaitHealthy waits until every container of ids runs and, where it has
// a health check, reports healthy; it returns their names.
func (f *composeFleet) awaitHealthy(ctx context.Context, ids []string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	var names []string
	for _, id := range ids {
		var last string
		for {
			st, err := f.docker(ctx, "inspect", "--format", "{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}", id)
			if err != nil {
				last = err.Error()
			} else if fields := strings.Fields(st); len(fields) == 3 && fields[1] == "running" && (fields[2] == "healthy" || fields[2] == "none") {
				names = append(names, strings.TrimPrefix(fields[0], "/"))
				break
			} else {
				last = st
			}
			select {
			case <-ctx.Done():
				return names, fmt.Errorf("container %.12s is not healthy (%s): docker logs %.12s", id, last, id)
			case <-time.After(time.Second):
			}
		}
	}
	return names, nil
}

// Nodes are the registry's nodes that have containers here: a node's
// address is its compose service's name (node1..).
func (f *composeFleet) Nodes(ctx context.Context) ([]rolling.Node, error) {
	services, err := f.compose(ctx, "config", "--services")
	if err != nil {
		return nil, err
	}
	svc := strings.Fields(services)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := f.m.ListNodes(cctx, &curatorv1.ListNodesRequest{PageSize: 1000})
	if err != nil {
		return nil, fmt.Errorf("list the nodes: %w", err)
	}
	var out []rolling.Node
	for _, n := range resp.GetNodes() {
		if name := n.GetStatus().GetAddress(); slices.Contains(svc, name+"-consensus") {
			out = append(out, rolling.Node{ID: n.GetId(), Name: name})
		}
	}
	return out, nil
}

// RestartNode recreates the node's three containers: its network holder
// (so that every container of the node runs the image), consensus and
// roleserve.
func (f *composeFleet) RestartNode(ctx context.Context, n rolling.Node) ([]string, error) {
	services := []string{n.Name, n.Name + "-consensus", n.Name + "-roleserve"}
	if _, err := f.compose(ctx, append([]string{"up", "-d", "--no-deps", "--force-recreate"}, services...)...); err != nil {
		return nil, err
	}
	var ids []string
	for _, s := range services {
		c, err := f.containers(ctx, s)
		if err != nil {
			return nil, err
		}
		ids = append(ids, c...)
	}
	return f.awaitHealthy(ctx, ids)
}

func (f *composeFleet) replicas(ctx context.Context, service string) ([]string, error) {
	names, err := f.hostnames(ctx, service)
	if err != nil {
		return nil, err
	}
	return slices.Sorted(maps.Keys(names)), nil
}

func (f *composeFleet) Curators(ctx context.Context) ([]string, error) {
	return f.replicas(ctx, "curator")
}

func (f *composeFleet) Reconcilers(ctx context.Context) ([]string, error) {
	return f.replicas(ctx, "reconciler")
}

func (f *composeFleet) RestartCurator(ctx context.Context, name string) ([]string, error) {
	names, err := f.replace(ctx, "curator", name)
	if err != nil {
		return names, err
	}
	addrs, err := f.published(ctx, "curator", "7200")
	if err != nil {
		return names, err
	}
	f.updateCurators(addrs)
	return names, nil
}

func (f *composeFleet) RestartReconciler(ctx context.Context, name string) ([]string, error) {
	return f.replace(ctx, "reconciler", name)
}

// replace stops and removes the replica of service whose host name is
// name, has compose create a new one (the others untouched) and waits
// until it is healthy.
func (f *composeFleet) replace(ctx context.Context, service, name string) ([]string, error) {
	before, err := f.hostnames(ctx, service)
	if err != nil {
		return nil, err
	}
	id, ok := before[name]
	if !ok {
		return nil, fmt.Errorf("no running %s container has host name %s", service, name)
	}
	if _, err := f.docker(ctx, "stop", "--time", "20", id); err != nil {
		return nil, err
	}
	if _, err := f.docker(ctx, "rm", id); err != nil {
		return nil, err
	}
	if _, err := f.compose(ctx, "up", "-d", "--no-deps", "--no-recreate", "--scale", fmt.Sprintf("%s=%d", service, len(before)), service); err != nil {
		return nil, err
	}
	after, err := f.hostnames(ctx, service)
	if err != nil {
		return nil, err
	}
	var fresh []string
	for h, id := range after {
		if _, old := before[h]; !old {
			fresh = append(fresh, id)
		}
	}
	if len(fresh) != 1 {
		return nil, fmt.Errorf("compose created %d %s containers for the one removed, want 1", len(fresh), service)
	}
	return f.awaitHealthy(ctx, fresh)
}

// ActiveReconciler is the host name of the reconciler that holds the
// lease ("" if none says so).
func (f *composeFleet) ActiveReconciler(ctx context.Context) string {
	addrs, err := f.published(ctx, "reconciler", "7300")
	if err != nil {
		return ""
	}
	return activeReconciler(ctx, f.creds, addrs)
}
