//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/failpoint"
)

// The suite needs root (network namespaces, iptables) and builds the
// services with failpoints; `make test-faults` runs it.
//
//	FAULT_SEED=7 FAULT_DURATION=30m FAULT_NEMESES=kill,pause make test-faults
//
// FAULT_STRICT_RECONFIG=on keeps etcd's own reconfiguration checks; by
// default they are off, so curia's quorum guard must hold alone.
//
// FAULT_SEED=random picks a seed (printed in the report); FAULT_DIR keeps
// the run's state, logs and reports (default: a temporary directory, kept
// when the test fails).

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// binaries builds the four services with failpoints into dir.
func binaries(t *testing.T, dir string) {
	t.Helper()
	for _, svc := range []string{"consensus", "curator", "reconciler", "roleserve"} {
		pkg := fmt.Sprintf("curia.dev/services/%s/cmd/%s", svc, svc)
		out, err := exec.Command("go", "build", "-tags", "failpoints", "-o", filepath.Join(dir, svc), pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
}

func preconditions(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the fault suite needs root: network namespaces and iptables")
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the fault suite needs %s (Debian: apt-get install iproute2 iptables)", tool)
		}
	}
}

// runSuite runs the suite once and returns its report.
func runSuite(t *testing.T, cfg Config) *Report {
	t.Helper()
	dir := os.Getenv("FAULT_DIR")
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "curia-faults-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if !t.Failed() {
				os.RemoveAll(dir)
			}
		})
	}
	cfg.Dir = filepath.Join(dir, t.Name())
	cfg.Bin = filepath.Join(dir, "bin")
	if err := os.MkdirAll(cfg.Bin, 0o755); err != nil {
		t.Fatal(err)
	}
	binaries(t, cfg.Bin)
	cfg.Out = os.Stderr
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration+10*time.Minute)
	defer cancel()
	t.Logf("seed %d, %v, state and logs in %s", cfg.Seed, cfg.Duration, cfg.Dir)
	report, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("the suite could not run: %v (logs in %s)", err, filepath.Join(cfg.Dir, "cluster", "logs"))
	}
	var b strings.Builder
	report.Write(&b)
	t.Logf("report (also %s):\n%s", filepath.Join(cfg.Dir, fmt.Sprintf("report-seed-%d.json", cfg.Seed)), b.String())
	return report
}

// TestFaults is the suite: a fixed seed and a short run by default.
func TestFaults(t *testing.T) {
	preconditions(t)
	var seed uint64
	if s := env("FAULT_SEED", "1"); s == "random" {
		seed = uint64(time.Now().UnixNano())
	} else {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FAULT_SEED=%q: want a number or random", s)
		}
		seed = v
	}
	d, err := time.ParseDuration(env("FAULT_DURATION", "3m"))
	if err != nil {
		t.Fatalf("FAULT_DURATION: %v", err)
	}
	var nemeses []string
	if s := os.Getenv("FAULT_NEMESES"); s != "" {
		nemeses = strings.Split(s, ",")
	}
	var strict bool
	switch s := env("FAULT_STRICT_RECONFIG", "off"); s {
	case "on", "off":
		strict = s == "on"
	default:
		t.Fatalf("FAULT_STRICT_RECONFIG=%q: want on (etcd's own checks too) or off (curia's guards alone, the default)", s)
	}
	report := runSuite(t, Config{Seed: seed, Duration: d, Nemeses: nemeses, StrictReconfig: strict, Subnet: "10.211.7", Name: "curiaflt"})
	for _, v := range report.Violations {
		t.Errorf("VIOLATION %s", v)
	}
	if report.Visualization != "" {
		t.Errorf("the failing registry history is drawn in %s", report.Visualization)
	}
}

// TestMutationsCaught switches each safety mechanism off in turn and
// checks that the suite fails, naming the invariant its absence breaks.
// Each run aims its nemeses and widens its windows at the mechanism, so
// that one short run catches it.
func TestMutationsCaught(t *testing.T) {
	preconditions(t)
	for _, m := range []struct {
		mutation  string
		nemeses   []string
		delays    map[string]string
		invariant string
	}{
		// Two changes through two consensus processes overlap.
		{failpoint.NoPending, []string{NemOrphanLearner}, map[string]string{"after-commit": "1s"}, InvOneInFlight},
		// An unreadable record looks deleted: a removal is planned, and
		// refused by the proof of absence.
		{failpoint.NoSnapshotFreshness, []string{NemCorruptNode}, nil, InvFreshPlans},
		// A node gone for a moment: the removal lands after it is back.
		{failpoint.NoAbsenceProof, []string{NemNodeGoneAndBack}, map[string]string{"before-call": "500ms"}, InvLiveMember},
		// A paused reconciler and its twin act under one lease.
		{failpoint.NoIncarnation, []string{NemTwin}, nil, InvOneHolder},
	} {
		t.Run(m.mutation, func(t *testing.T) {
			seed := uint64(42)
			report := runSuite(t, Config{Seed: seed, Duration: 75 * time.Second, Nemeses: m.nemeses, Mutations: []string{m.mutation},
				Delays: m.delays, Subnet: "10.211.8", Name: "curiamut"})
			var names []string
			for _, v := range report.Violations {
				names = append(names, v.Invariant)
			}
			if !slices.Contains(names, m.invariant) {
				t.Errorf("with %s switched off, seed %d: violations %v, want %s among them", m.mutation, seed, names, m.invariant)
			} else {
				t.Logf("with %s switched off, seed %d caught it: %s", m.mutation, seed, report.Violations[slices.Index(names, m.invariant)])
			}
		})
	}
}
