package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	profile := filepath.Join(t.TempDir(), "profile.out")
	if err := os.WriteFile(profile, []byte(`mode: atomic
curia.dev/platform/rpc/server.go:1.1,2.2 3 1
curia.dev/platform/rpc/server.go:3.1,4.2 1 0
curia.dev/services/curator/leader.go:1.1,2.2 4 0
curia.dev/services/curator/leader.go:1.1,2.2 4 2
curia.dev/services/curator/cmd/curator/main.go:1.1,2.2 2 0
curia.dev/services/curatorx/x.go:1.1,2.2 2 1
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(&out, profile, "", []string{"curia.dev/gen", "curia.dev/platform", "curia.dev/services/curator"}); err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"statement coverage per module:",
		"  curia.dev/gen                0.0%  (0 of 0 statements)",
		"  curia.dev/platform          75.0%  (3 of 4 statements)",
		"  curia.dev/services/curator  66.7%  (4 of 6 statements)",
		"  other                      100.0%  (2 of 2 statements)",
		"  total                       75.0%  (9 of 12 statements)",
		"",
	}, "\n")
	if got := out.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestParseRefusesGarbage(t *testing.T) {
	err := parse(strings.NewReader("mode: set\nnot a profile line\n"), map[string]block{})
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("err = %v, want one about line 2", err)
	}
}

// TestRunCovdata adds the counters of a real binary built with -cover
// (as proctest builds the services under make test) to a profile that
// lists the same blocks, as go test lists a package whose tests ran its
// other branch: each block counts once, covered if either ran it.
func TestRunCovdata(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a binary: skipped with -short")
	}
	const pkg = "curia.dev/platform/cmd/curia-cover/testdata/branches"
	bin := filepath.Join(t.TempDir(), "branches")
	if out, err := exec.Command("go", "build", "-cover", "-covermode=atomic", "-coverpkg=curia.dev/...", "-o", bin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	covdata := t.TempDir()
	cmd := exec.Command(bin) // no argument: the if's body does not run
	cmd.Env = append(os.Environ(), "GOCOVERDIR="+covdata)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
	// The blocks of main.go, as cover numbers them: the tests ran only
	// the if's body.
	profile := filepath.Join(t.TempDir(), "profile.out")
	if err := os.WriteFile(profile, []byte(`mode: atomic
curia.dev/platform/cmd/curia-cover/testdata/branches/main.go:7.13,8.22 1 0
curia.dev/platform/cmd/curia-cover/testdata/branches/main.go:8.22,11.3 2 1
curia.dev/platform/cmd/curia-cover/testdata/branches/main.go:12.2,12.40 1 0
curia.dev/platform/rpc/server.go:1.1,2.2 3 0
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(&out, profile, covdata, []string{"curia.dev/gen", "curia.dev/platform"}); err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"statement coverage per module, in the test binaries (tests) and with the processes they started (+processes):",
		"                       tests  +processes",
		"  curia.dev/gen         0.0%        0.0%  (0 of 0 statements)",
		"  curia.dev/platform   28.6%       57.1%  (4 of 7 statements)",
		"  total                28.6%       57.1%  (4 of 7 statements)",
		"",
	}, "\n")
	if got := out.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestRunEmptyCovdata: no process wrote counters (every test that starts
// one skipped, say): the second column is the first.
func TestRunEmptyCovdata(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go tool covdata: skipped with -short")
	}
	profile := filepath.Join(t.TempDir(), "profile.out")
	if err := os.WriteFile(profile, []byte("mode: atomic\ncuria.dev/platform/rpc/server.go:1.1,2.2 3 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(&out, profile, t.TempDir(), []string{"curia.dev/platform"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "  curia.dev/platform  100.0%      100.0%  (3 of 3 statements)\n") {
		t.Errorf("got\n%s", out.String())
	}
}
