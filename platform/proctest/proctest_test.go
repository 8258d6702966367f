package proctest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCoverage builds a binary as make test does (CURIA_COVERDIR), runs
// it, and finds its counters once the test that ran it has ended: under
// coverage the end of a test stops its processes with SIGTERM, and a
// binary built with -cover writes them when it exits.
func TestCoverage(t *testing.T) {
	SkipShort(t)
	dir := t.TempDir()
	defer func(old string) { coverDir = old }(coverDir)
	coverDir = dir
	const pkg = "curia.dev/platform/proctest/testdata/untilterm"
	t.Run("process", func(t *testing.T) {
		p := New(t, "untilterm", Build(t, pkg))
		p.Start()
		Eventually(t, time.Minute, func() error {
			if !p.LogContains("up") {
				return errors.New("untilterm is not up yet")
			}
			return nil
		})
	})
	// The counters are written at the exit (the meta-data at the start).
	counters, _ := filepath.Glob(filepath.Join(dir, "covcounters.*"))
	if len(counters) != 1 {
		t.Fatalf("%s holds %d counter files, want 1: untilterm did not exit on its own", dir, len(counters))
	}
	profile := filepath.Join(t.TempDir(), "profile.out")
	if out, err := exec.Command("go", "tool", "covdata", "textfmt", "-i="+dir, "-o="+profile).CombinedOutput(); err != nil {
		t.Fatalf("go tool covdata textfmt: %v\n%s", err, out)
	}
	b, err := os.ReadFile(profile)
	if err != nil {
		t.Fatal(err)
	}
	// The atomic mode of `go test -race -cover`, and main's first block
	// (up to the receive that waits for SIGTERM) run.
	if !strings.HasPrefix(string(b), "mode: atomic\n") {
		t.Errorf("profile's mode is not atomic:\n%s", b)
	}
	covered := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, pkg+"/main.go:") && !strings.HasSuffix(l, " 0") {
			covered = true
		}
	}
	if !covered {
		t.Errorf("no block of %s/main.go ran:\n%s", pkg, b)
	}
}
