package local

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/proctest"
)

// TestDetachedDashboard: make up's dashboard runs on in a session of its
// own after curia-local dashboard returned, serves the pages from the env
// file's credentials, is replaced by the next start and stopped by --stop;
// a pid file whose pid now belongs to another process stops nothing; a
// dashboard that cannot start says why and leaves no pid file.
func TestDetachedDashboard(t *testing.T) {
	bin := filepath.Dir(proctest.Build(t, "curia.dev/services/dashboard/cmd/curia-dashboard"))
	state := t.TempDir()
	c := New(Config{State: state, Cluster: "curia", ControlPlane: 1, Curators: 1, Reconcilers: 1,
		Out: io.Discard, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := c.PKI(); err != nil {
		t.Fatal(err)
	}
	// Curators and reconcilers that do not run: the dashboard dials
	// lazily and serves its pages all the same.
	if err := c.writeEnv(); err != nil {
		t.Fatal(err)
	}
	d := Detached{Dir: state, Bin: bin, Cluster: "curia", Listen: proctest.FreeAddr(t)}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	pidOf := func() int {
		t.Helper()
		var pid, start int
		b, err := os.ReadFile(filepath.Join(state, detachedPIDFile))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Sscanf(string(b), "%d %d", &pid, &start); err != nil {
			t.Fatalf("pid file %q: %v", b, err)
		}
		return pid
	}
	live := func(pid int) bool {
		_, err := startTime(pid)
		return err == nil
	}

	url, err := d.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if url != "http://"+d.Listen {
		t.Fatalf("URL %s, want http://%s", url, d.Listen)
	}
	code, body, err := proctest.Get(url + "/")
	if err != nil || code != http.StatusOK || !strings.Contains(body, `id="cluster-name"`) {
		t.Fatalf("GET %s/: %d %v\n%s", url, code, err, body)
	}
	first := pidOf()
	if sid, err := session(first); err != nil || sid != first {
		t.Fatalf("the dashboard (pid %d) is in session %d (%v), want one of its own", first, sid, err)
	}

	// Again: the first one is stopped, a new one serves.
	if _, err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	second := pidOf()
	if second == first || live(first) {
		t.Fatalf("after a second start: pid %d (first %d, live %v)", second, first, live(first))
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	if live(second) {
		t.Fatalf("the dashboard (pid %d) runs after Stop", second)
	}
	if _, err := os.Stat(filepath.Join(state, detachedPIDFile)); !os.IsNotExist(err) {
		t.Fatalf("pid file after Stop: %v", err)
	}
	if _, _, err := proctest.Get(url + "/"); err == nil {
		t.Fatalf("%s answers after Stop", url)
	}
	if err := d.Stop(); err != nil {
		t.Fatalf("Stop with nothing running: %v", err)
	}

	t.Run("a pid file of another process stops nothing", func(t *testing.T) {
		other := exec.Command("sleep", "300")
		if err := other.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
		start, err := startTime(other.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		// Its pid, recorded with another start time: the pid was reused.
		if err := os.WriteFile(filepath.Join(state, detachedPIDFile), fmt.Appendf(nil, "%d %d\n", other.Process.Pid, start+1), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
		if !live(other.Process.Pid) {
			t.Fatal("Stop killed a process the pid file does not name")
		}
		if _, err := os.Stat(filepath.Join(state, detachedPIDFile)); !os.IsNotExist(err) {
			t.Fatalf("stale pid file kept: %v", err)
		}
	})

	t.Run("a dashboard that cannot start", func(t *testing.T) {
		bad := d
		bad.Listen = "0.0.0.0:" + strings.Split(d.Listen, ":")[1]
		begun := time.Now()
		_, err := bad.Start(ctx)
		if err == nil || !strings.Contains(err.Error(), "not a loopback address") {
			t.Fatalf("Start on every interface: %v, want the dashboard's refusal from its log", err)
		}
		if waited := time.Since(begun); waited > detachedStartTimeout/2 {
			t.Errorf("Start took %v to see the dashboard exit", waited)
		}
		if _, err := os.Stat(filepath.Join(state, detachedPIDFile)); !os.IsNotExist(err) {
			t.Fatalf("pid file of a dashboard that did not start: %v", err)
		}
	})
}

// session is a process's session id (/proc/<pid>/stat's 6th field).
func session(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(fields) < 4 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	var sid int
	_, err = fmt.Sscan(fields[3], &sid)
	return sid, err
}
