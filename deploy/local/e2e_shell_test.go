//go:build e2e

package local_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/proctest"
)

// freshPATH is the PATH of a fresh login on a machine without curia's
// tools: the shell finds grpcurl only through the env file.
const freshPATH = "/usr/local/bin:/usr/bin:/bin"

// freshShell runs script in bash with an environment as bare as a new
// terminal's (HOME and freshPATH, nothing of the test's), in dir.
func freshShell(t *testing.T, dir, script string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", "--noprofile", "--norc", "-c", script)
	cmd.Dir = dir
	cmd.Env = []string{"HOME=" + os.Getenv("HOME"), "PATH=" + freshPATH}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// pinnedGrpcurl is the grpcurl make test-e2e put first on PATH (the
// pinned one, from the tools cache), which make run and make up pass on.
func pinnedGrpcurl(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("grpcurl")
	if err != nil {
		t.Fatal("grpcurl is not on PATH: run the e2e tests with make test-e2e")
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// checkPrintedCommands runs what make run (or make up) printed once the
// cluster was ready — `source <env file>`, then a grpcurl command — as is,
// in a fresh shell in dir: the env file alone must put the pinned grpcurl
// on PATH, and the command must list the nodes.
func checkPrintedCommands(t *testing.T, output, dir, grpcurl string) {
	t.Helper()
	var source, command string
	for _, l := range strings.Split(output, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "source "):
			source = l
		case strings.HasPrefix(l, "grpcurl ") && source != "" && command == "":
			command = l
		}
	}
	if source == "" || command == "" {
		t.Fatalf("no `source ...` and `grpcurl ...` lines in the output:\n%s", output)
	}
	if out, err := freshShell(t, dir, "command -v grpcurl"); err == nil {
		t.Fatalf("a fresh shell finds grpcurl without the env file (%s): the test proves nothing here", strings.TrimSpace(out))
	}
	t.Logf("in a fresh shell (PATH=%s):\n  %s\n  %s", freshPATH, source, command)
	out, err := freshShell(t, dir, source+" && command -v grpcurl")
	if err != nil || strings.TrimSpace(out) != grpcurl {
		t.Fatalf("after %q, grpcurl is %q (%v), want the pinned %s", source, strings.TrimSpace(out), err, grpcurl)
	}
	out, err = freshShell(t, dir, source+" && "+command)
	if err != nil {
		t.Fatalf("%s: %v\n%s", command, err, out)
	}
	if !strings.Contains(out, "NODE_STATE_UP") {
		t.Fatalf("%s printed no node that is UP:\n%s", command, out)
	}
}

// checkDocCurl runs the curl commands of the docs (docPages: the
// administration page has them) in a fresh shell that
// sourced envFile: each must answer as JSON over the Connect port, with
// mTLS and the admin certificate, the cluster's info (GetClusterInfo) or
// a page of nodes (ListNodes).
func checkDocCurl(t *testing.T, envFile string) {
	t.Helper()
	cmds := curlCommands(readDocs(t))
	if len(cmds) == 0 {
		t.Fatal("no curl command in the docs")
	}
	for _, cmdline := range cmds {
		t.Log(cmdline)
		var out string
		// A follower forwards to the leader: right after a leader change
		// it may answer Unavailable for a moment.
		proctest.Eventually(t, 30*time.Second, func() error {
			var err error
			out, err = freshShell(t, filepath.Dir(envFile), `source "`+envFile+`" && `+cmdline)
			if err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			return nil
		})
		if strings.Contains(cmdline, "/ListNodes") {
			var page struct {
				Nodes []struct {
					ID string `json:"id"`
				} `json:"nodes"`
			}
			if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Nodes) == 0 || page.Nodes[0].ID == "" {
				t.Fatalf("want a page of nodes as JSON (%v):\n%s", err, out)
			}
			continue
		}
		var info struct {
			ClusterName  string            `json:"clusterName"`
			LeaderName   string            `json:"leaderName"`
			NodesByState map[string]string `json:"nodesByState"`
		}
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, out)
		}
		if info.ClusterName != "curia" || info.LeaderName == "" || info.NodesByState["NODE_STATE_UP"] == "" {
			t.Fatalf("cluster info %+v, want cluster curia with a leader and nodes UP:\n%s", info, out)
		}
	}
}
