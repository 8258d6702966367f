package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The compose cluster's dashboard (make up) is a process on the host, not a
// container: a container's port is reachable from every other container of
// the compose network, and the dashboard serves the admin API to whoever
// reaches it. On the host it listens on loopback only, as make run's does,
// and reaches the curators and reconcilers at the ports compose publishes.
//
// It must outlive the command that starts it (deploy/compose/up.sh exits
// once the cluster is ready), so it runs detached, in a session of its own,
// and a pid file records it for the next up.sh (which starts it anew: the
// published ports change with --scale) and for make down:
//
//	up.sh ── curia-local dashboard --state .curia-compose ──▶ curia-dashboard (detached)
//	          reads env (written by up.sh), writes dashboard.pid and dashboard.log
//	make down ── curia-local dashboard --stop ──▶ SIGTERM to the recorded process only
const (
	detachedPIDFile = "dashboard.pid"
	detachedLogFile = "dashboard.log"
	// detachedStartTimeout bounds the wait for its first page.
	detachedStartTimeout = 30 * time.Second
	// detachedStopGrace is how long a SIGTERM is given before SIGKILL.
	detachedStopGrace = 10 * time.Second
)

// Detached is a dashboard that runs on after the command that started it,
// for a cluster whose env file (make up's .curia-compose/env) is in Dir.
type Detached struct {
	// Dir holds the env file; the pid file and the log are written there.
	Dir string
	// Bin holds curia-dashboard.
	Bin string
	// Cluster is the cluster name.
	Cluster string
	// Listen is the loopback address to serve the pages on.
	Listen string
}

// envVars are the variables of the env file the dashboard needs.
var envVars = []string{"CURIA_CACERT", "CURIA_ADMIN_CERT", "CURIA_ADMIN_KEY", "CURIA_CURATORS", "CURIA_RECONCILERS"}

// ReadEnvFile reads the `export NAME=value` lines of an env file (make
// run's or make up's) whose value refers to no other variable.
func ReadEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "export ")
		if !ok {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if ok && !strings.ContainsAny(value, `$"'`) {
			out[name] = value
		}
	}
	return out, sc.Err()
}

// Start stops the dashboard the pid file records, if it runs, then starts
// a new one, detached, and returns its URL once it serves the cluster
// page. If it does not, it is stopped and the error says why (its log's
// end).
func (d Detached) Start(ctx context.Context) (string, error) {
	if err := d.Stop(); err != nil {
		return "", err
	}
	env, err := ReadEnvFile(filepath.Join(d.Dir, "env"))
	if err != nil {
		return "", fmt.Errorf("the cluster's env file: %w", err)
	}
	for _, v := range envVars {
		if env[v] == "" {
			return "", fmt.Errorf("%s sets no %s", filepath.Join(d.Dir, "env"), v)
		}
	}
	bin := filepath.Join(d.Bin, dashboardBin)
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("%w (make build)", err)
	}
	logPath := filepath.Join(d.Dir, detachedLogFile)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return "", err
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(bin,
		"--cluster", d.Cluster, "--ca", env["CURIA_CACERT"], "--cert", env["CURIA_ADMIN_CERT"], "--key", env["CURIA_ADMIN_KEY"],
		"--listen", d.Listen, "--curator", env["CURIA_CURATORS"], "--reconciler", env["CURIA_RECONCILERS"])
	cmd.Stdout, cmd.Stderr = logf, logf
	// A session of its own: no signal of the terminal that ran make up
	// reaches it, and it outlives this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fail := func(err error) (string, error) {
		_ = cmd.Process.Kill()
		_ = os.Remove(filepath.Join(d.Dir, detachedPIDFile))
		b, _ := os.ReadFile(logPath)
		return "", fmt.Errorf("%s: %w; its log (%s) ends:\n%s", dashboardBin, err, logPath, lastLines(string(b), 10))
	}
	start, err := startTime(pid)
	if err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(d.Dir, detachedPIDFile), fmt.Appendf(nil, "%d %d\n", pid, start), 0o600); err != nil {
		return fail(err)
	}
	url := "http://" + d.Listen
	ctx, cancel := context.WithTimeout(ctx, detachedStartTimeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/", nil)
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url, nil
			}
			err = fmt.Errorf("GET %s/: %s", url, resp.Status)
		}
		select {
		case werr := <-exited:
			return fail(fmt.Errorf("exited: %w", werr))
		case <-ctx.Done():
			return fail(fmt.Errorf("no page within %v: %w", detachedStartTimeout, err))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop stops the dashboard the pid file records: SIGTERM, SIGKILL after a
// grace period. A pid file of a process that is gone, or whose pid now
// belongs to another process (another start time), is removed and nothing
// is signalled.
func (d Detached) Stop() error {
	pidPath := filepath.Join(d.Dir, detachedPIDFile)
	b, err := os.ReadFile(pidPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var pid int
	var start uint64
	if _, err := fmt.Sscanf(string(b), "%d %d", &pid, &start); err != nil || pid <= 0 {
		return fmt.Errorf("%s: %q is no pid and start time", pidPath, strings.TrimSpace(string(b)))
	}
	running := func() bool {
		st, err := startTime(pid)
		return err == nil && st == start
	}
	for _, step := range []struct {
		sig   syscall.Signal
		grace time.Duration
	}{{syscall.SIGTERM, detachedStopGrace}, {syscall.SIGKILL, 5 * time.Second}} {
		if !running() {
			return os.Remove(pidPath)
		}
		if err := syscall.Kill(pid, step.sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("stop the dashboard (pid %d): %w", pid, err)
		}
		for deadline := time.Now().Add(step.grace); running() && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if running() {
		return fmt.Errorf("the dashboard (pid %d) does not stop", pid)
	}
	return os.Remove(pidPath)
}

// startTime is a live process's start time (clock ticks after boot,
// /proc/<pid>/stat's 22nd field): with the pid, it names the process, not
// whichever later got its pid. A zombie is not live.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	fields := strings.Fields(string(b[i+1:])) // from field 3, the state
	if len(fields) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)+2)
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, fmt.Errorf("process %d exited", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
