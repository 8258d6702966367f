//go:build e2e

package local_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
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
	t.Parallel() // a cluster of its own, on its own loopback subnet
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

	writes := startConfigWrites(ctx, t, c.mgmt, "skew workload")
	begun := time.Now()
	args := append([]string{"upgrade"}, c.layout...)
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "curia-local"), append(args, "--to", current)...).CombinedOutput()
	writes.stop()
	t.Logf("curia-local upgrade %s → this tree (%v):\n%s", base, time.Since(begun).Round(100*time.Millisecond), out)
	if err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	// The older curators know no maintenance, so etcd leadership is not
	// moved away before the etcd leader's node restarts: its consensus
	// hands leadership over as it stops, and a status sampled during that
	// election shows a voter that answers without a leader, a failure
	// tolerance below 0. A lost quorum is two of the three voters silent.
	if !strings.Contains(string(out), "etcd membership changes 0;") || !regexp.MustCompile(`voters silent at once at most [01]`).Match(out) {
		t.Errorf("the upgrade changed etcd membership or lost the quorum: %s", out)
	}
	if strings.Contains(string(out), "lowest failure tolerance -") && !strings.Contains(string(out), "without a leader (an election)") {
		t.Errorf("the failure tolerance went below 0 with no election to explain it: %s", out)
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
