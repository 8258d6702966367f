//go:build e2e

package local_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	curatorv1 "curia.dev/gen/curia/curator/v1"
	"curia.dev/platform/pki"
	"curia.dev/platform/proctest"
	"curia.dev/platform/rpc"
)

// TestCompose brings the compose cluster up from nothing with the same
// script `make up` runs, checks its shape through the published curator
// port and on the dashboard up.sh starts on the host, has autopilot
// replace a paused voter, scales the curators and reconcilers, restarts
// it from its volumes, recovers it from the loss of two voters with their
// data as docs/operating/recovery.md says, and stops it and its dashboard with `make down`.
// It needs Docker, the curia:dev image and bin/ (make test-e2e builds
// them); without Docker it is skipped.
func TestCompose(t *testing.T) {
	if err := exec.Command("docker", "info").Run(); err != nil {
		t.Skip("no Docker here")
	}
	if err := exec.Command("docker", "image", "inspect", "curia:dev").Run(); err != nil {
		t.Fatal("no curia:dev image: run make images (make test-e2e does)")
	}
	out := t.TempDir()
	env := append(os.Environ(),
		"COMPOSE_PROJECT_NAME=curia-e2e", "CURIA_HOST_IP=127.0.0.3",
		"CURIA_COMPOSE_OUT="+out, "CURIA_IMAGE=curia:dev", "GRPCURL="+pinnedGrpcurl(t))
	compose := func(args ...string) string {
		t.Helper()
		b, err := composeCmd(context.Background(), env, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("compose %v: %v\n%s", args, err, b)
		}
		return string(b)
	}
	t.Cleanup(func() { compose("down", "--volumes", "--remove-orphans") })
	// (Before the cluster goes: cleanups run last first.)
	t.Cleanup(func() {
		if b, err := exec.Command(filepath.Join("..", "..", "bin", "curia-local"), "dashboard", "--stop", "--state", out).CombinedOutput(); err != nil {
			t.Errorf("stop the dashboard: %v\n%s", err, b)
		}
	})
	up := func(args ...string) string {
		t.Helper()
		begun := time.Now()
		cmd := exec.Command(filepath.Join("..", "compose", "up.sh"), args...)
		cmd.Env = env
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("up.sh: %v\n%s", err, b)
		}
		t.Logf("compose cluster ready %v after up.sh %v", time.Since(begun).Round(100*time.Millisecond), args)
		return string(b)
	}
	printed := up()

	vars := readEnvFile(t, filepath.Join(out, "env"))
	creds, err := rpc.LoadCredentials("curia", rpc.TLSFiles{CA: vars["CURIA_CACERT"], Cert: vars["CURIA_ADMIN_CERT"], Key: vars["CURIA_ADMIN_KEY"]})
	if err != nil {
		t.Fatal(err)
	}
	mgmt := func() curatorv1.ManagementClient {
		t.Helper()
		cc, err := rpc.Dial(vars["CURIA_CURATOR"], rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return curatorv1.NewManagementClient(cc)
	}
	check := func() map[string]bool {
		t.Helper()
		m := mgmt()
		var voters map[string]bool
		proctest.Eventually(t, 2*time.Minute, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := m.GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
			if err != nil {
				return err
			}
			voters = map[string]bool{}
			for _, mem := range st.Members {
				if !mem.HasRole || mem.Learner {
					return fmt.Errorf("member %v does not agree with its node", mem)
				}
				voters[mem.NodeId] = true
			}
			if len(voters) != 3 || len(st.RoleWithoutMember) > 0 {
				return fmt.Errorf("%d voters, roles without members %v", len(voters), st.RoleWithoutMember)
			}
			info, err := m.GetClusterInfo(ctx, &curatorv1.GetClusterInfoRequest{})
			if err != nil {
				return err
			}
			if info.NodesByState["NODE_STATE_UP"] != 4 {
				return fmt.Errorf("nodes by state %v", info.NodesByState)
			}
			return nil
		})
		return voters
	}
	first := check()
	t.Run("dashboard", func(t *testing.T) { checkComposeDashboard(t, printed, out) })
	t.Run("every container reads only its own keys", func(t *testing.T) { checkComposeSecrets(t, "curia-e2e") })
	// up.sh prints `source <out>/env`: out is absolute here.
	t.Run("the printed command in a fresh shell", func(t *testing.T) { checkPrintedCommands(t, printed, t.TempDir(), pinnedGrpcurl(t)) })
	t.Run("doc curl", func(t *testing.T) { checkDocCurl(t, filepath.Join(out, "env")) })
	t.Run("snapshots copied off-site", func(t *testing.T) { checkComposeOffsite(t, mgmt(), "127.0.0.3") })

	// make up set control_plane_size 3: a paused voter node is replaced by
	// the worker, and once unpaused it is a worker itself.
	t.Run("autopilot replaces a paused voter", func(t *testing.T) {
		m := mgmt()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		byHost := func() map[string]*curatorv1.Node {
			out := map[string]*curatorv1.Node{}
			for _, n := range nodeRecords(ctx, t, m) {
				out[n.GetStatus().GetAddress()] = n
			}
			return out
		}
		nodes := byHost()
		paused, worker := nodes["node2"].GetId(), nodes["node4"].GetId()
		if !first[paused] || first[worker] {
			t.Fatalf("voters %v: want node2 (%s) a voter and node4 (%s) the worker", first, paused, worker)
		}
		// make up's dead_node_threshold (30 s); a standby joins once the
		// paused node is unhealthy.
		cfg, err := m.GetClusterConfig(ctx, &curatorv1.GetClusterConfigRequest{})
		if err != nil {
			t.Fatal(err)
		}
		threshold := cfg.Config.GetDeadNodeThreshold().AsDuration()
		containers := []string{"node2", "node2-consensus", "node2-roleserve"}
		compose(append([]string{"pause"}, containers...)...)
		unpaused := false
		unpause := func() {
			if !unpaused {
				compose(append([]string{"unpause"}, containers...)...)
				unpaused = true
			}
		}
		defer unpause()
		begun := time.Now()
		want := maps.Clone(first)
		delete(want, paused)
		want[worker] = true
		proctest.Eventually(t, 3*time.Minute, func() error {
			st, err := m.GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
			if err != nil {
				return err
			}
			got := map[string]bool{}
			for _, mem := range st.Members {
				if !mem.Learner && mem.HasRole {
					got[mem.NodeId] = true
				}
			}
			if !maps.Equal(got, want) || len(st.Members) != 3 {
				return fmt.Errorf("voters %v, want node4 instead of node2 %v", got, want)
			}
			return nil
		})
		took := time.Since(begun)
		t.Logf("paused voter node2 replaced by node4 %v after docker pause (dead_node_threshold %v + %v)", took.Round(100*time.Millisecond), threshold, (took - threshold).Round(100*time.Millisecond))
		unpause()
		proctest.Eventually(t, 2*time.Minute, func() error {
			n := byHost()["node2"]
			if n.GetRoles().GetConsensusMember() != nil || n.GetState() != curatorv1.NodeState_NODE_STATE_UP || slices.Contains(n.GetStatus().GetRunningServices(), "consensus") {
				return fmt.Errorf("node2 after docker unpause: %v, want an UP worker not running consensus", n)
			}
			return nil
		})
		// docker's health checks failed while the containers were paused:
		// they are "unhealthy" until one passes again, and compose refuses
		// to start what depends on them (the next up.sh) until then.
		proctest.Eventually(t, 2*time.Minute, func() error {
			for _, svc := range containers[1:] {
				id := strings.TrimSpace(compose("ps", "-q", svc))
				out, err := exec.Command("docker", "inspect", "-f", "{{.State.Health.Status}}", id).Output()
				if err != nil {
					return fmt.Errorf("inspect %s: %v", svc, err)
				}
				if h := strings.TrimSpace(string(out)); h != "healthy" {
					return fmt.Errorf("%s is %s after docker unpause", svc, h)
				}
			}
			return nil
		})
		first = check()
		if !maps.Equal(first, want) {
			t.Fatalf("voters %v after node2 came back, want %v", first, want)
		}
	})

	// More curators and reconcilers join as followers and standbys; the
	// dashboard starts anew, with the published ports of all of them.
	printed = up("--scale", "curator=3", "--scale", "reconciler=2")
	if n := len(strings.Fields(compose("ps", "-q", "curator"))); n != 3 {
		t.Fatalf("%d curator containers, want 3", n)
	}
	check()
	checkComposeDashboard(t, printed, out)

	t.Run("rolling upgrade onto another image", func(t *testing.T) {
		printed = checkComposeUpgrade(t, env, out, compose, mgmt, up, func() { vars = readEnvFile(t, filepath.Join(out, "env")) })
		check()
	})

	// Down and up again: the same members, from the volumes.
	compose("down")
	printed = up()
	vars = readEnvFile(t, filepath.Join(out, "env"))
	if again := check(); !maps.Equal(again, first) {
		t.Fatalf("members before %v, after down/up %v", first, again)
	}
	url := checkComposeDashboard(t, printed, out)

	t.Run("quorum-loss recovery, as docs/operating/recovery.md says", func(t *testing.T) {
		checkComposeRecovery(t, "curia-e2e", env, mgmt(), creds, check)
	})

	// make down stops the cluster and the dashboard.
	cmd := exec.Command("make", "-C", filepath.Join("..", ".."), "down")
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make down: %v\n%s", err, b)
	}
	if ids := strings.Fields(compose("ps", "-q")); len(ids) > 0 {
		t.Fatalf("containers after make down: %v", ids)
	}
	if _, _, err := proctest.Get(url + "/"); err == nil {
		t.Fatalf("the dashboard %s answers after make down", url)
	}
	if _, err := os.Stat(filepath.Join(out, "dashboard.pid")); !os.IsNotExist(err) {
		t.Fatalf("the dashboard's pid file after make down: %v", err)
	}
}

// composeCmd is a compose command (v2's docker compose, else v1.29's
// docker-compose) on deploy/compose/compose.yaml, in env.
func composeCmd(ctx context.Context, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "bash", append([]string{"-c", `if docker compose version >/dev/null 2>&1; then exec docker compose "$@"; else exec docker-compose "$@"; fi`, "compose"}, args...)...)
	cmd.Env = append(env, "COMPOSE_FILE="+filepath.Join("..", "compose", "compose.yaml"))
	return cmd
}

// composeDashboardLine is how up.sh's last line begins (as make run's).
const composeDashboardLine = "The dashboard (with the admin's credentials, on loopback only): "

// checkComposeDashboard: the last line up.sh printed is the URL of the
// dashboard it started on the host, on port 7001 of the loopback address
// the cluster's ports are published on, and its cluster page shows the
// three voters; it runs detached (its pid file in out names it). It
// returns the URL.
func checkComposeDashboard(t *testing.T, printed, out string) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(printed), "\n")
	url, ok := strings.CutPrefix(lines[len(lines)-1], composeDashboardLine)
	if !ok {
		t.Fatalf("up.sh's last line is not the dashboard's URL:\n%s", printed)
	}
	if want := "http://127.0.0.3:7001"; url != want {
		t.Fatalf("dashboard at %s, want %s (CURIA_HOST_IP's port 7001)", url, want)
	}
	if _, err := os.Stat(filepath.Join(out, "dashboard.pid")); err != nil {
		t.Fatal(err)
	}
	voters := regexp.MustCompile(`id="voters">([^<]*)<`)
	proctest.Eventually(t, 2*time.Minute, func() error {
		code, body, err := proctest.Get(url + "/")
		if err != nil {
			return err
		}
		m := voters.FindStringSubmatch(body)
		if code != http.StatusOK || m == nil || !strings.HasPrefix(m[1], "3 voters, 3 healthy") {
			return fmt.Errorf("GET %s/: %d, voters %q", url, code, m)
		}
		return nil
	})
	t.Logf("the dashboard %s shows 3 voters", url)
	return url
}

// checkComposeSecrets inspects every container of the compose project and
// fails if one of them mounts a volume holding a private key that is not
// its own identity's (DESIGN §2: one identity, one secret). Volumes are
// read on the host (/var/lib/docker/volumes), as root.
func checkComposeSecrets(t *testing.T, project string) {
	if os.Geteuid() != 0 {
		t.Skip("reading docker volumes on the host needs root")
	}
	// The volumes (without the project prefix) that each service may
	// read a key from; the pki job writes them all.
	own := map[string][]string{
		"curator":    {"secrets-curator"},
		"reconciler": {"secrets-reconciler"},
		"init":       {"secrets-admin"},
	}
	for i := 1; i <= 4; i++ {
		n := fmt.Sprintf("node%d", i)
		own[n+"-consensus"] = []string{"secrets-" + n + "-consensus", n + "-consensus"}
		own[n+"-roleserve"] = []string{"secrets-" + n, n + "-roleserve"}
	}
	ids, err := exec.Command("docker", "ps", "-a", "-q", "--filter", "label=com.docker.compose.project="+project).Output()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, id := range strings.Fields(string(ids)) {
		out, err := exec.Command("docker", "inspect", "-f", `{{index .Config.Labels "com.docker.compose.service"}}{{range .Mounts}} {{.Name}}={{.Source}}{{end}}`, id).Output()
		if err != nil {
			t.Fatal(err)
		}
		fields := strings.Fields(string(out))
		service := fields[0]
		if service == "pki" {
			continue // the PKI job makes every identity's files
		}
		checked++
		for _, m := range fields[1:] {
			name, source, _ := strings.Cut(m, "=")
			volume := strings.TrimPrefix(name, project+"_")
			err := filepath.WalkDir(source, func(p string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return nil
				}
				b, _ := os.ReadFile(p)
				if !strings.Contains(string(b), "PRIVATE KEY") {
					return nil
				}
				if !slices.Contains(own[service], volume) {
					t.Errorf("container %s (%s) can read the key %s of volume %s, which is not its own", service, id, strings.TrimPrefix(p, source), volume)
				}
				return nil
			})
			if err != nil {
				t.Errorf("walk volume %s: %v", volume, err)
			}
		}
	}
	if checked < 12 {
		t.Fatalf("checked %d containers, want every one of the cluster", checked)
	}
}

func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
		if ok && !strings.HasPrefix(k, "#") {
			// A name the file does not set is the environment's ($PATH).
			vars[k] = os.Expand(strings.Trim(v, `"`), func(n string) string {
				if v, ok := vars[n]; ok {
					return v
				}
				return os.Getenv(n)
			})
		}
	}
	return vars
}
