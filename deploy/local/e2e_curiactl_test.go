//go:build e2e

package local_test

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/proctest"
)

// curiactlSubnet is TestCuriactl's cluster's loopback /24, apart from the
// other tests' clusters.
const curiactlSubnet = "127.0.96"

// curiactlShell builds curiactl into c's binary directory and returns a
// runner of one command line in a fresh shell in dir that sourced c's env
// file (which puts that directory on PATH), then ran prelude: its output
// and exit code.
func curiactlShell(t *testing.T, c *cluster, dir, prelude string) func(t *testing.T, line string) (string, int) {
	t.Helper()
	if out, err := exec.Command("go", "build", "-o", c.bin+"/", "curia.dev/platform/cmd/curiactl").CombinedOutput(); err != nil {
		t.Fatalf("build curiactl: %v\n%s", err, out)
	}
	env := filepath.Join(c.state, "env")
	return func(t *testing.T, line string) (string, int) {
		t.Helper()
		out, err := freshShell(t, dir, fmt.Sprintf("source %q && %s && %s", env, cmp.Or(prelude, "true"), line))
		var exit *exec.ExitError
		switch {
		case err == nil:
			return out, 0
		case errors.As(err, &exit):
			return out, exit.ExitCode()
		}
		t.Fatalf("%s: %v\n%s", line, err, out)
		return "", 0
	}
}

// TestCuriactl runs the curiactl binary against a process cluster, as an
// operator would after make run: in a fresh shell that sourced the env file
// (which puts bin/ on PATH and sets every CURIA_* variable curiactl reads),
// then every command of the README's curiactl section and docs/curiactl.md
// but those that change the cluster.
func TestCuriactl(t *testing.T) {
	t.Parallel() // a cluster of its own, on its own loopback subnet
	c := startOn(t, curiactlSubnet, 3)
	bootstrap := c.ids["node-1"]
	// curiactl runs with NODE set to the bootstrap node's id.
	dir := t.TempDir()
	curiactl := curiactlShell(t, c, dir, "export NODE="+bootstrap)
	ok := func(t *testing.T, line string) string {
		t.Helper()
		out, code := curiactl(t, line)
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s", line, code, out)
		}
		return out
	}

	t.Run("status", func(t *testing.T) {
		// Three voters once autopilot added node-2 and node-3.
		proctest.Eventually(t, 2*time.Minute, func() error {
			out, code := curiactl(t, "curiactl status")
			if code != 0 || !strings.Contains(out, "VOTERS:              3, 3 healthy, quorum 2") || !strings.Contains(out, "FAILURE TOLERANCE:   1\n") {
				return fmt.Errorf("exit %d:\n%s", code, out)
			}
			return nil
		})
		var out string
		// No membership change in flight once autopilot is done.
		proctest.Eventually(t, time.Minute, func() error {
			if out = ok(t, "curiactl status"); !strings.Contains(out, "PENDING CHANGE:      none\n") {
				return fmt.Errorf("a change pending:\n%s", out)
			}
			return nil
		})
		t.Logf("curiactl status:\n%s", out)
		for _, want := range []string{"CLUSTER:             curia\n", "CURATOR LEADER:      curator-", "ETCD LEADER:         node-", "LEARNERS:            0\n",
			"ACTIVE RECONCILER:   reconciler-", "(last pass ", "PAUSED:              no\n", "NODES:               UP=3\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("status lacks %q:\n%s", want, out)
			}
		}
		var s struct {
			Voters           []string        `json:"voters"`
			FailureTolerance int             `json:"failureTolerance"`
			PendingChange    json.RawMessage `json:"pendingChange"`
		}
		if err := json.Unmarshal([]byte(ok(t, "curiactl status -o json")), &s); err != nil || len(s.Voters) != 3 || s.FailureTolerance != 1 || string(s.PendingChange) != "null" {
			t.Errorf("status -o json: %+v %v", s, err)
		}
	})

	t.Run("plan", func(t *testing.T) {
		out := ok(t, "curiactl plan")
		t.Logf("curiactl plan:\n%s", out)
		if !regexp.MustCompile(`(?m)^PLANNED UNDER: +control_plane_size=3 paused=false \(stored\)$`).MatchString(out) ||
			!regexp.MustCompile(`(?m)^NEXT ACTION: +NONE`).MatchString(out) || !regexp.MustCompile(`(?m)^OBSERVED: +3 etcd members, 3 nodes$`).MatchString(out) {
			t.Errorf("plan of a converged cluster: want nothing to do under the stored configuration:\n%s", out)
		}
		// Shrinking to one voter: a removal first, written nowhere. (The
		// rest of the sequence depends on which member answered the
		// member list: the planner's sequence stops, refusing, once it
		// has removed that one.)
		out = ok(t, "curiactl plan --propose control_plane_size=1")
		t.Logf("curiactl plan --propose control_plane_size=1:\n%s", out)
		if !regexp.MustCompile(`(?m)^NEXT ACTION: +REMOVE_MEMBER node-`).MatchString(out) || !regexp.MustCompile(`(?m)^1 +REMOVE_MEMBER +node-`).MatchString(out) ||
			!strings.Contains(out, "(proposed: control_plane_size; nothing written)") {
			t.Errorf("plan --propose control_plane_size=1: want a removal first:\n%s", out)
		}
		var p struct {
			Config struct {
				ControlPlaneSize int `json:"controlPlaneSize"`
			} `json:"config"`
			Steps []json.RawMessage `json:"steps"`
		}
		if err := json.Unmarshal([]byte(ok(t, "curiactl plan --propose control_plane_size=1 -o json")), &p); err != nil || p.Config.ControlPlaneSize != 1 || len(p.Steps) == 0 {
			t.Errorf("plan -o json: %+v %v", p, err)
		}
		if out := ok(t, "curiactl config get"); !regexp.MustCompile(`(?m)^control_plane_size +3$`).MatchString(out) {
			t.Errorf("config get after plan --propose: want control_plane_size still 3:\n%s", out)
		}
		out, code := curiactl(t, "curiactl plan --propose control_plane_size=4")
		if code != 6 || !strings.Contains(out, "Error: INVALID_ARGUMENT: ") {
			t.Errorf("plan of an invalid size: exit %d, want 6:\n%s", code, out)
		}
	})

	t.Run("recover", func(t *testing.T) {
		// A healthy cluster: refused, nothing changed.
		out, code := curiactl(t, "curiactl recover --settle 1s --wait 0")
		if code != 7 || !strings.Contains(out, "refused: a quorum is reachable") {
			t.Errorf("recover on a healthy cluster: exit %d, want 7 and refused:\n%s", code, out)
		}
		out, code = curiactl(t, "curiactl snapshot restore no-such.db --confirm $NODE")
		if code != 1 || !strings.Contains(out, "the snapshot file failed its checks") {
			t.Errorf("snapshot restore of a missing file: exit %d, want 1:\n%s", code, out)
		}
		if out := ok(t, "curiactl status"); !strings.Contains(out, "VOTERS:              3, 3 healthy") {
			t.Errorf("status after the refusals:\n%s", out)
		}
	})

	t.Run("contexts", func(t *testing.T) {
		// The settings of the env file, as a context of a config file,
		// used without the env file.
		ctxYAML := ok(t, "curiactl context show -o yaml")
		cfg := filepath.Join(dir, "curia.yaml")
		text := "current-context: e2e\ncontexts:\n- " + strings.ReplaceAll(strings.TrimSpace(strings.Replace(ctxYAML, "name: NAME", "name: e2e", 1)), "\n", "\n  ") + "\n"
		if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := freshShell(t, dir, fmt.Sprintf("PATH=%s:$PATH CURIACTL_CONFIG=%s curiactl status", c.bin, cfg))
		if err != nil || !strings.Contains(out, "VOTERS:              3, 3 healthy") {
			t.Errorf("status from a config file alone: %v\n%s\nthe file:\n%s", err, out, text)
		}
		out, err = freshShell(t, dir, fmt.Sprintf("PATH=%s:$PATH CURIACTL_CONFIG=%s curiactl --context other status", c.bin, cfg))
		if err == nil || !strings.Contains(out, "--context other: no such context in "+cfg+" (it has: e2e)") {
			t.Errorf("an unknown context: %v\n%s", err, out)
		}
	})

	t.Run("nodes", func(t *testing.T) {
		out := ok(t, "curiactl nodes list")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID  ") {
			t.Fatalf("nodes list: want a header and 3 nodes:\n%s", out)
		}
		if !regexp.MustCompile(`(?m)^` + bootstrap + ` +UP +HEALTHY +consensus-member,kubernetes-controller +127\.0\.96\.11 `).MatchString(out) {
			t.Errorf("nodes list lacks the bootstrap node %s UP, HEALTHY, with its roles:\n%s", bootstrap, out)
		}
		if out := ok(t, `curiactl nodes list --filter "node.id == \"$NODE\"" -o json`); !strings.Contains(out, `"id": "`+bootstrap+`"`) || strings.Contains(out, "memberCertificate") || strings.Contains(out, "LS0tLS1CRUdJTi") {
			t.Errorf("nodes list --filter -o json: want the bootstrap node, no certificate:\n%s", out)
		}
		out = ok(t, "curiactl nodes get $NODE")
		for _, want := range []string{"ID:                  " + bootstrap + "\n", "STATE:               UP\n", "ROLES:               consensus-member,kubernetes-controller\n", "LABELS:              zone=zone-a\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("nodes get lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "BEGIN CERTIFICATE") {
			t.Errorf("nodes get prints a certificate:\n%s", out)
		}
		// A node that does not exist, and an id that is none.
		out, code := curiactl(t, "curiactl nodes get node-00000000000000000000000000000000")
		if code != 5 || !strings.Contains(out, "Error: NOT_FOUND: ") {
			t.Errorf("nodes get of an unknown node: exit %d, want 5 and NOT_FOUND:\n%s", code, out)
		}
		out, code = curiactl(t, "curiactl nodes approve not-a-node")
		if code != 6 || !strings.Contains(out, "Error: INVALID_ARGUMENT: ") || !strings.Contains(out, "field node_id: ") {
			t.Errorf("nodes approve of a bad id: exit %d, want 6, INVALID_ARGUMENT and the field:\n%s", code, out)
		}
		// Deleting a node with roles is refused with the reason.
		out, code = curiactl(t, "curiactl nodes delete $NODE")
		if code != 7 || !strings.Contains(out, "Error: FAILED_PRECONDITION: ") || !strings.Contains(out, "safety_bypass_has_roles") {
			t.Errorf("nodes delete of a node with roles: exit %d, want 7 and FAILED_PRECONDITION:\n%s", code, out)
		}
	})

	t.Run("config", func(t *testing.T) {
		out := ok(t, "curiactl config get")
		if !regexp.MustCompile(`(?m)^control_plane_size +3$`).MatchString(out) {
			t.Fatalf("config get: want control_plane_size 3:\n%s", out)
		}
		var got struct {
			Revision string `json:"revision"`
		}
		if err := json.Unmarshal([]byte(ok(t, "curiactl config get -o json")), &got); err != nil || got.Revision == "" {
			t.Fatalf("config get -o json: %+v %v", got, err)
		}
		out = ok(t, "curiactl config set control_plane_size=5 --dry-run --expected-revision "+got.Revision)
		if !regexp.MustCompile(`(?m)^control_plane_size +5$`).MatchString(out) || !strings.Contains(out, "nothing written") {
			t.Errorf("config set --dry-run: want control_plane_size 5, nothing written:\n%s", out)
		}
		if out := ok(t, "curiactl config get"); !regexp.MustCompile(`(?m)^control_plane_size +3$`).MatchString(out) {
			t.Errorf("config get after a dry run: want control_plane_size still 3:\n%s", out)
		}
		out, code := curiactl(t, "curiactl config set control_plane_size=4 --dry-run")
		if code != 6 || !strings.Contains(out, "field config.control_plane_size: ") {
			t.Errorf("config set of an invalid size: exit %d, want 6 and the field:\n%s", code, out)
		}
		out, code = curiactl(t, "curiactl config set paused=true --expected-revision 1")
		if code != 7 || !strings.Contains(out, "reason: CONFLICT") {
			t.Errorf("config set at a stale revision: exit %d, want 7 and CONFLICT:\n%s", code, out)
		}
	})

	t.Run("audit", func(t *testing.T) {
		out := ok(t, "curiactl audit tail -n 3")
		if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 4 || !strings.HasPrefix(lines[0], "REVISION ") {
			t.Errorf("audit tail -n 3: want a header and 3 events:\n%s", out)
		}
		if out := ok(t, "curiactl audit tail -n 1000"); !regexp.MustCompile(`(?m) CLUSTER_BOOTSTRAP +` + bootstrap + ` `).MatchString(out) {
			t.Errorf("audit tail -n 1000 lacks the bootstrap:\n%s", out)
		}
		sc := bufio.NewScanner(strings.NewReader(ok(t, "curiactl audit tail -n 2 -o json")))
		n := 0
		for ; sc.Scan(); n++ {
			var e struct {
				Revision string `json:"revision"`
			}
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Revision == "" {
				t.Errorf("audit tail -o json line %q: %v", sc.Text(), err)
			}
		}
		if n != 2 {
			t.Errorf("audit tail -n 2 -o json: %d lines", n)
		}
	})

	t.Run("snapshots", func(t *testing.T) {
		// The curators took one before autopilot's first membership change.
		out := ok(t, "curiactl snapshot list")
		m := regexp.MustCompile(`(?m)^(snapshot-[0-9]{8}T[0-9]{6}Z-rev[0-9]+) `).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("snapshot list: no snapshot:\n%s", out)
		}
		out = ok(t, "curiactl snapshot save saved.db --name "+m[1])
		fi, err := os.Stat(filepath.Join(dir, "saved.db"))
		if err != nil || !strings.Contains(out, "SIZE:      "+strconv.FormatInt(fi.Size(), 10)+" bytes") {
			t.Errorf("snapshot save: %v\n%s", err, out)
		}
	})

	// Every command docs/curiactl.md shows, but those that change the
	// cluster or follow forever; "# fails: exit N" says the exit code.
	t.Run("docs", func(t *testing.T) {
		ran, skipped := 0, 0
		defer func() { t.Logf("README.md and docs/curiactl.md: ran %d commands, skipped %d", ran, skipped) }()
		for _, line := range docCommands(t) {
			cmd, comment, _ := strings.Cut(line, " # ")
			if strings.Contains(comment, "changes the cluster") || strings.Contains(cmd, " -f") {
				skipped++
				continue
			}
			ran++
			want := 0
			if s, ok := strings.CutPrefix(comment, "fails: exit "); ok {
				want, _ = strconv.Atoi(strings.Fields(s)[0])
			}
			out, code := curiactl(t, cmd)
			if code != want {
				t.Errorf("the docs: %s: exit %d, want %d\n%s", cmd, code, want, out)
			}
		}
	})
}

// docCommands are the curiactl command lines of the sh blocks of the
// README (its curiactl section) and docs/curiactl.md.
func docCommands(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, page := range []string{"../../README.md", "../../docs/curiactl.md"} {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		in := false
		for _, l := range strings.Split(string(b), "\n") {
			switch {
			case strings.HasPrefix(l, "```sh"):
				in = true
			case strings.HasPrefix(l, "```"):
				in = false
			case in && strings.HasPrefix(l, "curiactl "):
				out = append(out, l)
				n++
			}
		}
		if n < 4 {
			t.Fatalf("%s: %d curiactl commands in sh blocks", page, n)
		}
	}
	if len(out) < 20 {
		t.Fatalf("%d curiactl commands in the docs' sh blocks", len(out))
	}
	return out
}
