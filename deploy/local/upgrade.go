package local

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	reconcilerv1 "curia.dev/gen/curia/reconciler/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/rolling"
	"curia.dev/platform/rpc"
)

// Upgrade replaces every process of a running process cluster (curia-local
// run, make run) with the binaries of dir, one at a time, in the order of
// platform/rolling: the workers' nodes, the voters' nodes that do not lead
// etcd, the leader's node (its leadership moved first), the curators (the
// leader last), the reconcilers (the active one last), each node in
// maintenance while its processes are down and the next step only once
// the cluster is healthy again. With dir the cluster's own binary
// directory, it is a rolling restart.
//
// The binaries are installed into the cluster's directory first (each by
// a rename: a running process keeps the file it started from), once the
// cluster is found healthy; the supervisor of curia-local run starts each
// process again, from the new binary, after the upgrade stops it
// (SIGTERM).
func (c *Cluster) Upgrade(ctx context.Context, dir string) (*rolling.Report, error) {
	if err := c.ReadIDs(); err != nil {
		return nil, err
	}
	bins := []string{"consensus", "curator", "reconciler", "roleserve"}
	if err := checkBinaries(dir, bins); err != nil {
		return nil, err
	}
	admin, err := c.AdminConn()
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	m := curatorv1.NewManagementClient(admin)
	if err := rolling.Check(ctx, m); err != nil {
		return nil, err
	}
	if err := installBinaries(dir, c.cfg.Bin, bins); err != nil {
		return nil, err
	}
	return rolling.Run(ctx, processFleet{c}, rolling.Options{
		Management:    m,
		Curator:       curatorv1.NewCuratorClient(admin),
		Out:           c.cfg.Out,
		Prefix:        "curia-local upgrade",
		Reason:        "rolling restart (curia-local upgrade)",
		HealthTimeout: healthTimeout,
	})
}

// checkBinaries refuses a directory that lacks one of bins.
func checkBinaries(dir string, bins []string) error {
	var missing []string
	for _, b := range bins {
		st, err := os.Stat(filepath.Join(dir, b))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s has no executable %s: nothing was changed (make build writes them to bin/)", dir, strings.Join(missing, ", "))
	}
	return nil
}

// installBinaries copies bins from dir into to, each by a rename; the
// same directory installs nothing (a rolling restart).
func installBinaries(dir, to string, bins []string) error {
	a, err1 := filepath.Abs(dir)
	b, err2 := filepath.Abs(to)
	if err1 == nil && err2 == nil && a == b {
		return nil
	}
	for _, bin := range bins {
		data, err := os.ReadFile(filepath.Join(dir, bin))
		if err != nil {
			return err
		}
		tmp := filepath.Join(to, "."+bin+".new")
		if err := os.WriteFile(tmp, data, 0o755); err != nil { //nolint:gosec // G306: an executable
			return err
		}
		if err := os.Rename(tmp, filepath.Join(to, bin)); err != nil {
			return err
		}
	}
	return nil
}

// processFleet is the process cluster's processes, under curia-local
// run's supervisor: a process is restarted by SIGTERM, and the supervisor
// starts it again.
type processFleet struct{ c *Cluster }

// Fleet is the cluster's processes as platform/rolling restarts them (the
// fault suite rolls the cluster while its nemeses run).
func (c *Cluster) Fleet() rolling.Fleet { return processFleet{c} }

func (f processFleet) Nodes(context.Context) ([]rolling.Node, error) {
	var out []rolling.Node
	for _, n := range f.c.NodeList() {
		out = append(out, rolling.Node{ID: n.ID, Name: n.Name})
	}
	return out, nil
}

func (f processFleet) RestartNode(ctx context.Context, rn rolling.Node) ([]string, error) {
	nodes := f.c.NodeList()
	i := slices.IndexFunc(nodes, func(n Node) bool { return n.ID == rn.ID })
	if i < 0 {
		return nil, fmt.Errorf("no node %s in the cluster's layout", rn.ID)
	}
	n := nodes[i]
	var done []string
	for _, bin := range []string{"consensus", "roleserve"} {
		if err := f.restart(ctx, n.Name+"-"+bin, bin, n.Host); err != nil {
			return done, err
		}
		done = append(done, n.Name+"-"+bin)
	}
	return done, nil
}

func (f processFleet) Curators(context.Context) ([]string, error) {
	var out []string
	for i := range f.c.Curators {
		out = append(out, fmt.Sprintf("curator-%d", i+1))
	}
	return out, nil
}

func (f processFleet) RestartCurator(ctx context.Context, name string) ([]string, error) {
	i, err := replica(name, "curator-", len(f.c.Curators))
	if err != nil {
		return nil, err
	}
	return []string{name}, f.restart(ctx, name, "curator", hostOf(f.c.Curators[i]))
}

func (f processFleet) Reconcilers(context.Context) ([]string, error) {
	var out []string
	for i := range f.c.Reconcilers {
		out = append(out, fmt.Sprintf("reconciler-%d", i+1))
	}
	return out, nil
}

func (f processFleet) RestartReconciler(ctx context.Context, name string) ([]string, error) {
	i, err := replica(name, "reconciler-", len(f.c.Reconcilers))
	if err != nil {
		return nil, err
	}
	return []string{name}, f.restart(ctx, name, "reconciler", hostOf(f.c.Reconcilers[i]))
}

// replica is the index of the replica name (prefix + 1-based number).
func replica(name, prefix string, n int) (int, error) {
	i, err := strconv.Atoi(strings.TrimPrefix(name, prefix))
	if err != nil || !strings.HasPrefix(name, prefix) || i < 1 || i > n {
		return 0, fmt.Errorf("no replica %s in the cluster's layout", name)
	}
	return i - 1, nil
}

// ActiveReconciler is the reconciler replica that holds the lease ("" if
// none says so).
func (f processFleet) ActiveReconciler(ctx context.Context) string {
	creds, err := rpc.LoadCredentials(f.c.cfg.Cluster, f.c.AdminFiles())
	if err != nil {
		return ""
	}
	return activeReconciler(ctx, creds, f.c.Reconcilers)
}

// activeReconciler asks each reconciler replica at addrs for its status
// and names the one that is active ("" if none says so).
func activeReconciler(ctx context.Context, creds *rpc.Credentials, addrs []string) string {
	for _, addr := range addrs {
		cc, err := rpc.Dial(addr, rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindReconciler}})
		if err != nil {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := reconcilerv1.NewReconcilerClient(cc).GetStatus(cctx, &reconcilerv1.GetStatusRequest{})
		cancel()
		cc.Close()
		if err == nil && st.GetRole() == reconcilerv1.Role_ROLE_ACTIVE {
			return st.GetName()
		}
	}
	return ""
}

// restart stops one process (SIGTERM), waits until its supervisor started
// it again and it reports SERVING.
func (f processFleet) restart(ctx context.Context, name, bin, host string) error {
	pidFile := f.c.path("run", name+".pid")
	old, err := readPID(pidFile)
	if err != nil {
		return fmt.Errorf("%s: %w (is the cluster running under curia-local run?)", name, err)
	}
	if err := syscall.Kill(old, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop %s (pid %d): %w", name, old, err)
	}
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	url := "http://" + metricsAddr(host, bin) + "/healthz"
	client := &http.Client{Timeout: 2 * time.Second}
	var last string
	for {
		if pid, err := readPID(pidFile); err == nil && pid != old {
			if last = healthz(client, url); last == "" {
				return nil
			}
		} else {
			last = "not started again yet"
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not come back healthy (%s); see %s", name, last, f.c.path("logs", name+".log"))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s holds no pid", path)
	}
	return pid, nil
}
