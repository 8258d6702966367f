//go:build e2e

package local_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"curia.dev/platform/proctest"
)

// curiactlRecoverSubnet is TestCuriactlRecovery's cluster's loopback /24.
const curiactlRecoverSubnet = "127.0.94"

// TestCuriactlRecovery: curiactl recover, not curia-local, rebuilds a
// 3-voter process cluster that lost two voters' disks, given nothing but
// what an operator of any deployment has: the consensus and curator
// addresses and the admin credentials (the env file). Without --confirm
// it names the survivor and changes nothing (exit 7); with it, the
// survivor's data is the cluster and autopilot grows it back to 3 voters.
func TestCuriactlRecovery(t *testing.T) {
	t.Parallel() // a cluster of its own, on its own loopback subnet
	c := startOn(t, curiactlRecoverSubnet, 3)
	run := curiactlShell(t, c, t.TempDir(), "")
	curiactl := func(line string) (string, int) {
		t.Helper()
		return run(t, line)
	}

	var voters []string
	for id := range c.voters() {
		voters = append(voters, c.names[id])
	}
	slices.Sort(voters)
	if len(voters) != 3 {
		t.Fatalf("voters %v, want 3", voters)
	}
	leader := c.names[c.leader()]
	survivor := voters[slices.IndexFunc(voters, func(v string) bool { return v != leader })]
	survivorID := c.ids[survivor]
	// Two voters lose their disks: wiped and killed; their supervisors
	// restart empty consensus processes.
	for _, v := range voters {
		if v == survivor {
			continue
		}
		if err := os.RemoveAll(filepath.Join(c.state, "data", v, "consensus")); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(c.pid(v+"-consensus"), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	lostAt := time.Now()
	t.Logf("voters %v: %s (%s) survives, the others lost their data", voters, survivor, survivorID)

	var plan string
	proctest.Eventually(t, 2*time.Minute, func() error {
		out, code := curiactl("curiactl recover --settle 3s")
		if code != 7 || !strings.Contains(out, "nothing changed") {
			return fmt.Errorf("exit %d, want 7 and nothing changed:\n%s", code, out)
		}
		plan = out
		return nil
	})
	t.Logf("curiactl recover:\n%s", plan)
	if !strings.Contains(plan, "the most up-to-date survivor is "+survivorID) || !strings.Contains(plan, "--confirm "+survivorID) {
		t.Fatalf("the plan does not name %s:\n%s", survivorID, plan)
	}

	out, code := curiactl("curiactl recover --settle 3s --wait 5m --confirm " + survivorID + ` --reason "e2e: curiactl recover"`)
	t.Logf("curiactl recover --confirm:\n%s", out)
	if code != 0 || !regexp.MustCompile(`(?m)^RECOVERED: +`+survivorID+`$`).MatchString(out) || !regexp.MustCompile(`(?m)^VOTERS: +3, `).MatchString(out) {
		t.Fatalf("curiactl recover --confirm %s: exit %d, want 0, recovered, 3 voters", survivorID, code)
	}
	t.Logf("two voters' data gone → 3 voters again through curiactl: %v", time.Since(lostAt).Round(100*time.Millisecond))
	out, code = curiactl("curiactl status")
	if code != 0 || !strings.Contains(out, "VOTERS:              3, 3 healthy") {
		t.Errorf("status after the recovery: exit %d\n%s", code, out)
	}
	if out, code := curiactl("curiactl audit tail -n 1000"); code != 0 || !strings.Contains(out, "CLUSTER_RECOVER") {
		t.Errorf("the audit log lacks the recovery: exit %d\n%s", code, out)
	}
}
