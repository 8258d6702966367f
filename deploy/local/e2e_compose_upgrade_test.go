//go:build e2e

package local_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
)

// checkComposeUpgrade (issue 30): make upgrade-compose's roll
// (curia-local compose-upgrade) moves every container of the compose
// cluster onto another image tag, one at a time, while a client writes the
// cluster configuration: no etcd membership change, the failure tolerance
// never below 0, no admin call failing twice in a row, the etcd leader
// moved at most once per voter, every acknowledged write in the audit log,
// every long-running container recreated on the new image, no node left in
// maintenance. up.sh afterwards (as make upgrade-compose runs it, for the
// env file and the dashboard) recreates nothing. A missing image is
// refused with nothing changed. It returns what that up.sh printed. env
// is the caller's (up's): CURIA_IMAGE is the new image during that up.sh
// only.
//
// mgmt dials the curator the env file names, and reread reads the env
// file again: a recreated curator may publish another port.
func checkComposeUpgrade(t *testing.T, env []string, out string, compose func(...string) string, mgmt func() curatorv1.ManagementClient, up func(...string) string, reread func()) string {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	roll := func(image string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join("..", "..", "bin", "curia-local"), "compose-upgrade", "--state", out, "--image", image)
		cmd.Env = append(slices.Clone(env), "COMPOSE_FILE="+filepath.Join("..", "compose", "compose.yaml"))
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	services := []string{"curator", "reconciler"}
	for i := 1; i <= 4; i++ {
		services = append(services, "node"+strconv.Itoa(i), "node"+strconv.Itoa(i)+"-consensus", "node"+strconv.Itoa(i)+"-roleserve")
	}
	containers := func() []string {
		var ids []string
		for _, s := range services {
			ids = append(ids, strings.Fields(compose("ps", "-q", s))...)
		}
		slices.Sort(ids)
		return ids
	}
	before := containers()

	if o, err := roll("curia:no-such-image"); err == nil || !strings.Contains(o, "no image curia:no-such-image, so nothing was changed") {
		t.Fatalf("compose-upgrade onto a missing image: %v\n%s", err, o)
	}
	if after := containers(); !slices.Equal(before, after) {
		t.Fatalf("a refused compose-upgrade changed containers: %v → %v", before, after)
	}

	const next = "curia:e2e-next"
	if b, err := exec.Command("docker", "tag", "curia:dev", next).CombinedOutput(); err != nil {
		t.Fatalf("docker tag: %v\n%s", err, b)
	}
	// Untagged at the end (-f: containers still run it, until the
	// caller's compose down); the caller goes on with curia:dev.
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", next).Run() })
	writes := startConfigWrites(ctx, t, mgmt, "compose upgrade workload")
	begun := time.Now()
	o, err := roll(next)
	writes.stop()
	t.Logf("curia-local compose-upgrade (%v):\n%s", time.Since(begun).Round(100*time.Millisecond), o)
	if err != nil {
		t.Fatalf("compose-upgrade: %v", err)
	}
	r := regexp.MustCompile(`restarted (\d+) processes in (\S+); etcd membership changes (\d+); lowest failure tolerance (-?\d+); etcd leader moves (\d+); admin calls failed at most (\d+) in a row`).FindStringSubmatch(o)
	if r == nil {
		t.Fatal("no report line")
	}
	num := func(i int) int { n, _ := strconv.Atoi(r[i]); return n }
	if num(1) != len(before) {
		t.Errorf("restarted %d containers, want %d", num(1), len(before))
	}
	if num(3) != 0 {
		t.Errorf("%d etcd membership changes during the roll, want 0", num(3))
	}
	if num(4) < 0 {
		t.Errorf("failure tolerance went down to %d", num(4))
	}
	if num(5) > 3 {
		t.Errorf("the etcd leader moved %d times, more than once per voter", num(5))
	}
	if num(6) > 1 {
		t.Errorf("admin calls failed %d times in a row", num(6))
	}
	after := containers()
	for _, id := range after {
		if slices.Contains(before, id) {
			t.Errorf("container %.12s was not recreated", id)
		}
		img, err := exec.Command("docker", "inspect", "-f", "{{.Config.Image}}", id).Output()
		if err != nil || strings.TrimSpace(string(img)) != next {
			t.Errorf("container %.12s runs %q, want %s (%v)", id, img, next, err)
		}
	}
	// up.sh on the new image, as make upgrade-compose runs it last:
	// nothing to recreate.
	setImage := func(image string) {
		for i, kv := range env {
			if strings.HasPrefix(kv, "CURIA_IMAGE=") {
				env[i] = "CURIA_IMAGE=" + image
			}
		}
	}
	setImage(next)
	defer setImage("curia:dev")
	printed := up("--scale", "curator=3", "--scale", "reconciler=2")
	if again := containers(); !slices.Equal(after, again) {
		t.Errorf("up.sh after the roll recreated containers: %v → %v", after, again)
	}
	reread()
	m := mgmt()
	writes.check(t, m, "during the compose roll")
	nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
	defer ncancel()
	for _, n := range nodeRecords(nctx, t, m) {
		if n.GetMaintenance() != nil {
			t.Errorf("node %s left in maintenance: %v", n.GetId(), n.GetMaintenance())
		}
	}
	return printed
}
