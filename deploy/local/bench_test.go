package local_test

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkColdStart is make run on a machine that has the binaries built:
// curia-local with its defaults (3 control-plane nodes, 1 worker, 2
// curators, 2 reconcilers, the dashboard) in a new state directory, from
// its start to its "cluster ready" line, which it prints once etcd has 3
// voters and roles and membership agree (s/cluster-ready). s/voters is the
// part of that from the cluster configuration (control_plane_size 3) to
// the 3 voters: autopilot growing the control plane, learners promoted
// after their stabilization. Each round starts a new cluster and stops it
// (SIGTERM) before the next; the PKI is made in every round, as a first
// make run makes it.
func BenchmarkColdStart(b *testing.B) {
	bin := buildAll(b, "curia.dev/services/dashboard/cmd/curia-dashboard")
	voters := regexp.MustCompile(`(\d+) voters ([0-9.]+m?s) after control_plane_size was set`)
	var ready, grown time.Duration
	for b.Loop() {
		state := filepath.Join(b.TempDir(), "state")
		cmd := exec.Command(filepath.Join(bin, "curia-local"), "--state", state, "--bin", bin, "--subnet", "127.0.97")
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		cmd.Stderr = nil // its logs; the processes' own are in state/logs
		begun := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		// The line is read as it is printed; a cluster that is not ready
		// in 3 minutes fails the benchmark instead of hanging it.
		timer := time.AfterFunc(3*time.Minute, func() { _ = cmd.Process.Kill() })
		var printed []string
		isReady := false
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			printed = append(printed, line)
			if m := voters.FindStringSubmatch(line); m != nil {
				d, err := time.ParseDuration(m[2])
				if err != nil {
					b.Fatalf("%q: %v", line, err)
				}
				grown += d
			}
			if strings.Contains(line, "cluster ready") {
				ready += time.Since(begun)
				isReady = true
				break
			}
		}
		timer.Stop()
		if !isReady {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			b.Fatalf("curia-local ended before the cluster was ready (logs in %s):\n%s", filepath.Join(state, "logs"), strings.Join(printed, "\n"))
		}
		// Stop it as Ctrl-C would; it stops every process it started.
		go func() {
			for sc.Scan() {
			}
		}()
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			b.Fatal(err)
		}
		kill := time.AfterFunc(time.Minute, func() { _ = cmd.Process.Kill() })
		if err := cmd.Wait(); err != nil {
			b.Fatalf("curia-local after SIGTERM: %v", err)
		}
		kill.Stop()
	}
	b.ReportMetric(ready.Seconds()/float64(b.N), "s/cluster-ready")
	b.ReportMetric(grown.Seconds()/float64(b.N), "s/voters")
}
