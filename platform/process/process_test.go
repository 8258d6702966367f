package process_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"curia.dev/platform/process"
)

func spec(t *testing.T, script string) process.Spec {
	return process.Spec{Argv: []string{"/bin/sh", "-c", script}, Log: filepath.Join(t.TempDir(), "log")}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestStopEscalatesToKill(t *testing.T) {
	// A child that ignores SIGTERM, and one that is frozen: both end.
	for name, freeze := range map[string]bool{"ignores SIGTERM": false, "frozen": true} {
		t.Run(name, func(t *testing.T) {
			sp := spec(t, `trap "" TERM; echo up; while :; do sleep 0.05; done`)
			p, err := process.Start(sp)
			if err != nil {
				t.Fatal(err)
			}
			waitLog(t, sp.Log, "up")
			if freeze {
				p.Signal(syscall.SIGSTOP)
			}
			begun := time.Now()
			p.Stop(syscall.SIGTERM, 300*time.Millisecond)
			if p.Running() || alive(p.PID()) {
				t.Fatalf("pid %d still runs after Stop", p.PID())
			}
			if took := time.Since(begun); took < 300*time.Millisecond {
				t.Fatalf("stopped after %v: it ignores SIGTERM, so only the SIGKILL after the grace period ends it", took)
			}
		})
	}
}

func TestStopWaitsForAGracefulExit(t *testing.T) {
	sp := spec(t, `trap "echo bye; exit 0" TERM; echo up; while :; do sleep 0.05; done`)
	p, err := process.Start(sp)
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, sp.Log, "up")
	p.Stop(syscall.SIGTERM, time.Minute)
	if p.Err() != nil {
		t.Fatalf("exit after SIGTERM: %v, want a clean exit", p.Err())
	}
	waitLog(t, sp.Log, "bye")
}

func TestSuperviseRestartsAndStops(t *testing.T) {
	sp := spec(t, `echo start; sleep 0.1; exit 3`)
	var pids []int
	pidc := make(chan int, 10)
	s := process.Supervise(context.Background(), sp, slog.New(slog.DiscardHandler), func(pid int) { pidc <- pid })
	deadline := time.After(30 * time.Second)
	for len(pids) < 2 {
		select {
		case pid := <-pidc:
			pids = append(pids, pid)
		case <-deadline:
			t.Fatalf("started %d times in 30s, want a restart after the exit", len(pids))
		}
	}
	s.Stop(time.Second)
	if pid := s.PID(); pid != 0 {
		t.Fatalf("PID %d after Stop, want 0", pid)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Fatalf("pid %d still runs after Stop", pid)
		}
	}
	// Every start reports before Stop returns: none came after the two.
	select {
	case pid := <-pidc:
		if alive(pid) {
			t.Fatalf("pid %d, started during Stop, still runs", pid)
		}
	default:
	}
}

func waitLog(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("log %s never said %q: %q", path, want, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
