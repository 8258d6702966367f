//go:build e2e

package local_test

import (
	"context"
	"maps"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// rollingRestart (issue 30): curia-local upgrade, with the cluster's own
// binaries, restarts every process one at a time, each node in
// maintenance while it is down: no etcd membership change, the failure
// tolerance never below 0, no admin call failing twice in a row, the etcd
// leader moved at most once per voter; every process runs again under a
// new pid, and no node is left in maintenance. A directory without the
// binaries is refused and restarts nothing.
func rollingRestart(t *testing.T, c *cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	upgrade := func(to string) (string, error) {
		args := append([]string{"upgrade"}, c.layout...)
		args = append(args, "--to", to)
		out, err := exec.CommandContext(ctx, filepath.Join(c.bin, "curia-local"), args...).CombinedOutput()
		return string(out), err
	}
	names := []string{"curator-1", "curator-2", "reconciler-1", "reconciler-2"}
	for i := 1; i <= c.nodes; i++ {
		names = append(names, "node-"+strconv.Itoa(i)+"-consensus", "node-"+strconv.Itoa(i)+"-roleserve")
	}
	pids := func() map[string]int {
		out := map[string]int{}
		for _, n := range names {
			out[n] = c.pid(n)
		}
		return out
	}

	before := pids()
	out, err := upgrade(t.TempDir())
	if err == nil || !strings.Contains(out, "has no executable consensus, curator, reconciler, roleserve: nothing was changed") {
		t.Fatalf("upgrade from an empty directory: %v\n%s", err, out)
	}
	if after := pids(); !maps.Equal(before, after) {
		t.Fatalf("a refused upgrade restarted processes: %v → %v", before, after)
	}

	writes := startConfigWrites(ctx, t, c.mgmt, "rolling restart workload")
	begun := time.Now()
	out, err = upgrade(c.bin)
	writes.stop()
	t.Logf("curia-local upgrade (%v):\n%s", time.Since(begun).Round(100*time.Millisecond), out)
	if err != nil {
		t.Fatalf("rolling restart: %v", err)
	}
	writes.check(t, c.mgmt(), "during the rolling restart")
	// The order: the nodes, the curators (the leader last), the
	// reconcilers (the active one last).
	var order []string
	for _, m := range regexp.MustCompile(`(?m)^curia-local upgrade: (\S+) restarted$`).FindAllStringSubmatch(out, -1) {
		order = append(order, m[1])
	}
	leader := regexp.MustCompile(`curator (\S+) leads: it is restarted last`).FindStringSubmatch(out)
	active := regexp.MustCompile(`reconciler (\S+) holds the lease: it is restarted last`).FindStringSubmatch(out)
	if leader == nil || active == nil || len(order) != len(names) || order[len(order)-3] != leader[1] || order[len(order)-1] != active[1] {
		t.Errorf("restart order %v: want the curator leader (%v) last of the curators and the active reconciler (%v) last", order, leader, active)
	}
	m := regexp.MustCompile(`restarted (\d+) processes in (\S+); etcd membership changes (\d+); lowest failure tolerance (-?\d+); etcd leader moves (\d+); admin calls failed at most (\d+) in a row`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("no report line")
	}
	num := func(i int) int { n, _ := strconv.Atoi(m[i]); return n }
	if num(1) != len(names) {
		t.Errorf("restarted %d processes, want %d", num(1), len(names))
	}
	if num(3) != 0 {
		t.Errorf("%d etcd membership changes during a rolling restart, want 0", num(3))
	}
	if num(4) < 0 {
		t.Errorf("failure tolerance went down to %d", num(4))
	}
	if voters := len(c.voters()); num(5) > voters {
		t.Errorf("the etcd leader moved %d times, more than once per voter (%d)", num(5), voters)
	}
	if num(6) > 1 {
		t.Errorf("admin calls failed %d times in a row", num(6))
	}
	after := pids()
	for _, n := range names {
		if after[n] == before[n] {
			t.Errorf("%s runs under the same pid %d: not restarted", n, after[n])
		}
	}
	for id, n := range getNodes(t, c) {
		if n.GetMaintenance() != nil {
			t.Errorf("node %s left in maintenance: %v", id, n.GetMaintenance())
		}
	}
	if err := c.agreement(); err != nil {
		t.Fatal(err)
	}
}

// getNodes lists every node by id.
func getNodes(t *testing.T, c *cluster) map[string]*curatorv1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.mgmt().ListNodes(ctx, &curatorv1.ListNodesRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*curatorv1.Node{}
	for _, n := range resp.GetNodes() {
		out[n.GetId()] = n
	}
	return out
}
