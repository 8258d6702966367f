//go:build e2e

package local_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	auditv1 "curia.dev/gen/curia/audit/v1"
	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/audit"
	"curia.dev/platform/proctest"
)

// skewBase is the oldest release a rolling upgrade to this tree is
// supported and tested from (.ci/oldest-supported, which CI's buf breaking
// also checks against). Move it forward when the version-skew policy
// (docs/operating/upgrading.md) drops a release.
func skewBase(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", ".ci", "oldest-supported"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// skewSubnet is the upgrade test's loopback /24 (bench_test.go uses 127.0.97).
const skewSubnet = "127.0.95"

// buildAt builds the service binaries of commit (a git worktree of this
// repository, removed after the test) into a new directory.
func buildAt(t *testing.T, commit string) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(t.TempDir(), "tree")
	if out, err := exec.Command("git", "-C", root, "worktree", "add", "--detach", tree, commit).CombinedOutput(); err != nil {
		t.Skipf("no git worktree of %s (a shallow clone?): %v\n%s", commit, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("git", "-C", root, "worktree", "remove", "--force", tree).Run() })
	out := t.TempDir()
	cmd := exec.Command("go", "build", "-o", out+"/",
		"./services/consensus/cmd/consensus", "./services/curator/cmd/curator",
		"./services/reconciler/cmd/reconciler", "./services/roleserve/cmd/roleserve")
	cmd.Dir = tree
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", commit, err, b)
	}
	return out
}

// TestUpgradeFromOlderBuild (issue 30, item 4): a cluster running the
// services of the oldest supported release (skewBase) is rolled to this
// tree's with curia-local upgrade while a client writes the cluster
// configuration: every process restarts
// from the new binaries, no etcd membership change, the failure tolerance
// never below 0, and every acknowledged write is in the audit log after.
// The older curators know no maintenance: the nodes restart without it.
func TestUpgradeFromOlderBuild(t *testing.T) {
	proctest.SkipShort(t)
	base := skewBase(t)
	old := buildAt(t, base)
	current := buildAll(t)
	// The cluster's directory: the old services, this tree's curia-local.
	bin := t.TempDir()
	for _, b := range []string{"consensus", "curator", "reconciler", "roleserve"} {
		copyFile(t, filepath.Join(old, b), filepath.Join(bin, b))
	}
	copyFile(t, filepath.Join(current, "curia-local"), filepath.Join(bin, "curia-local"))
	c := startWith(t, skewSubnet, 4, bin)
	c.eventuallyAgree()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	writes := startConfigWrites(ctx, t, c.mgmt(), "skew workload")
	begun := time.Now()
	args := append([]string{"upgrade"}, c.layout...)
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "curia-local"), append(args, "--to", current)...).CombinedOutput()
	writes.stop()
	t.Logf("curia-local upgrade %s → this tree (%v):\n%s", base, time.Since(begun).Round(100*time.Millisecond), out)
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	if !strings.Contains(string(out), "etcd membership changes 0;") || strings.Contains(string(out), "lowest failure tolerance -") {
		t.Errorf("the upgrade changed etcd membership or lost the quorum: %s", out)
	}
	for _, b := range []string{"consensus", "curator", "reconciler", "roleserve"} {
		if !sameFile(t, filepath.Join(bin, b), filepath.Join(current, b)) {
			t.Errorf("%s in the cluster's directory is not this tree's", b)
		}
	}

	// This tree's curators answer what the old ones did not.
	if _, err := c.mgmt().ListNodes(ctx, &curatorv1.ListNodesRequest{}); err != nil {
		t.Errorf("ListNodes after the upgrade: %v", err)
	}
	writes.check(t, c.mgmt(), "during the upgrade")
	if err := c.agreement(); err != nil {
		t.Fatal(err)
	}
}

// configWrites is a workload of cluster configuration writes, one after
// another, each with its own reason and its own dead_node_threshold (a
// write that changes nothing is acknowledged without an audit event): those
// acknowledged must be in the audit log after. stop ends it; check puts
// the threshold back as it was, then checks the audit log.
type configWrites struct {
	stop      func()
	threshold *durationpb.Duration
	mu     sync.Mutex
	acked  []string
	failed int
}

func startConfigWrites(ctx context.Context, t *testing.T, m curatorv1.ManagementClient, prefix string) *configWrites {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	cur, err := m.GetClusterConfig(cctx, &curatorv1.GetClusterConfigRequest{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	threshold := cur.GetConfig().GetDeadNodeThreshold()
	if threshold == nil {
		threshold = durationpb.New(5 * time.Minute)
	}
	w := &configWrites{threshold: threshold}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; wctx.Err() == nil; i++ {
			reason := fmt.Sprintf("%s %d", prefix, i)
			cctx, cancel := context.WithTimeout(wctx, 5*time.Second)
			_, err := m.UpdateClusterConfig(cctx, &curatorv1.UpdateClusterConfigRequest{
				Config:     &curatorv1.ClusterConfig{DeadNodeThreshold: durationpb.New(5*time.Minute + time.Duration(i+1)*time.Millisecond)},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"dead_node_threshold"}}, Reason: reason,
			})
			cancel()
			w.mu.Lock()
			if err == nil {
				w.acked = append(w.acked, reason)
			} else {
				w.failed++
			}
			w.mu.Unlock()
			select {
			case <-wctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	w.stop = func() { stop(); wg.Wait() }
	return w
}

// check fails the test unless every acknowledged write is in the audit
// log.
func (w *configWrites) check(t *testing.T, m curatorv1.ManagementClient, during string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	proctest.Eventually(t, time.Minute, func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := m.UpdateClusterConfig(cctx, &curatorv1.UpdateClusterConfigRequest{
			Config:     &curatorv1.ClusterConfig{DeadNodeThreshold: w.threshold},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"dead_node_threshold"}}, Reason: "workload done: the threshold back",
		})
		return err
	})
	events, err := audit.Backlog(ctx, m, 10000)
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]bool{}
	for _, e := range events {
		if e.GetAction() == auditv1.AuditAction_AUDIT_ACTION_CLUSTER_CONFIG_UPDATE {
			reasons[e.GetReason()] = true
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	missing := 0
	for _, r := range w.acked {
		if !reasons[r] && !containsPrefix(reasons, r) {
			missing++
		}
	}
	t.Logf("%d config writes acknowledged, %d failed %s; %d missing from the audit log", len(w.acked), w.failed, during, missing)
	if missing > 0 || len(w.acked) == 0 {
		t.Fatalf("%d of %d acknowledged config writes are not in the audit log", missing, len(w.acked))
	}
}

// containsPrefix: an audit reason that starts with r (the curator may add
// what changed).
func containsPrefix(set map[string]bool, r string) bool {
	for k := range set {
		if strings.HasPrefix(k, r) {
			return true
		}
	}
	return false
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil { //nolint:gosec // G306: an executable
		t.Fatal(err)
	}
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	x, err1 := os.ReadFile(a)
	y, err2 := os.ReadFile(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}
