//go:build e2e

package local_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
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
// port, scales the curators and reconcilers, and restarts it from its
// volumes. It needs Docker and the curia:dev image (make test-e2e builds
// it); without Docker it is skipped.
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
		"CURIA_COMPOSE_OUT="+out, "CURIA_IMAGE=curia:dev")
	compose := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("bash", append([]string{"-c", `if docker compose version >/dev/null 2>&1; then exec docker compose "$@"; else exec docker-compose "$@"; fi`, "compose"}, args...)...)
		cmd.Env = append(env, "COMPOSE_FILE="+filepath.Join("..", "compose", "compose.yaml"))
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("compose %v: %v\n%s", args, err, b)
		}
		return string(b)
	}
	t.Cleanup(func() { compose("down", "--volumes", "--remove-orphans") })
	up := func(args ...string) {
		t.Helper()
		begun := time.Now()
		cmd := exec.Command(filepath.Join("..", "compose", "up.sh"), args...)
		cmd.Env = env
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("up.sh: %v\n%s", err, b)
		}
		t.Logf("compose cluster ready %v after up.sh %v", time.Since(begun).Round(100*time.Millisecond), args)
	}
	up()

	vars := readEnvFile(t, filepath.Join(out, "env"))
	creds, err := rpc.LoadCredentials("curia", rpc.TLSFiles{CA: vars["CURIA_CACERT"], Cert: vars["CURIA_ADMIN_CERT"], Key: vars["CURIA_ADMIN_KEY"]})
	if err != nil {
		t.Fatal(err)
	}
	check := func() map[string]bool {
		t.Helper()
		cc, err := rpc.Dial(vars["CURIA_CURATOR"], rpc.ClientConfig{Credentials: creds, ServerKinds: []pki.Kind{pki.KindCurator}})
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		m := curatorv1.NewManagementClient(cc)
		voters := map[string]bool{}
		proctest.Eventually(t, 2*time.Minute, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := m.GetConsensusStatus(ctx, &curatorv1.GetConsensusStatusRequest{})
			if err != nil {
				return err
			}
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
	t.Run("every container reads only its own keys", func(t *testing.T) { checkComposeSecrets(t, "curia-e2e") })

	// More curators and reconcilers join as followers and standbys.
	up("--scale", "curator=3", "--scale", "reconciler=2")
	if n := len(strings.Fields(compose("ps", "-q", "curator"))); n != 3 {
		t.Fatalf("%d curator containers, want 3", n)
	}
	check()

	// Down and up again: the same members, from the volumes.
	compose("down")
	up()
	vars = readEnvFile(t, filepath.Join(out, "env"))
	if again := check(); !maps.Equal(again, first) {
		t.Fatalf("members before %v, after down/up %v", first, again)
	}
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
			vars[k] = os.Expand(strings.Trim(v, `"`), func(n string) string { return vars[n] })
		}
	}
	return vars
}
