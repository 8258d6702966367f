// Package process runs the child processes of curia's own tooling
// (curia-local, the test harnesses): a command with its output appended to
// a log file, in its own process group, killed when its parent dies, and
// stopped with a signal and a grace period. Supervise restarts one that
// exits on its own, as systemd or compose would.
package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"curia.dev/platform/backoff"
)

// Spec is what to run.
type Spec struct {
	// Argv is the command line; Argv[0] the binary.
	Argv []string
	// Env is the environment (nil: this process's).
	Env []string
	// Log receives stdout and stderr, appended.
	Log string
}

// Process is one started child.
type Process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // after exited is closed
}

// Start starts spec. The child runs in its own process group, so a Ctrl-C
// reaches only its parent, which stops it in order; it gets SIGKILL when
// its parent dies, so nothing outlives a crashed harness.
func Start(spec Spec) (*Process, error) {
	if len(spec.Argv) == 0 {
		return nil, errors.New("process: empty command line")
	}
	logf, err := os.OpenFile(spec.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("process %s: open its log: %w", spec.Argv[0], err)
	}
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...) //nolint:gosec // G204: the harness starts the binaries it is given
	cmd.Env = spec.Env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("process %s: %w", spec.Argv[0], err)
	}
	p := &Process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logf.Close()
		close(p.exited)
	}()
	return p, nil
}

// PID is the child's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed when the child has exited; Err says how then.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Err is how the child exited (nil before, or for exit status 0).
func (p *Process) Err() error {
	select {
	case <-p.exited:
		return p.err
	default:
		return nil
	}
}

// Running reports whether the child has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig (SIGSTOP and SIGCONT freeze and thaw it); a child that
// exited already gets nothing.
func (p *Process) Signal(sig syscall.Signal) {
	if p.Running() {
		_ = p.cmd.Process.Signal(sig) // it may exit in between: nothing to signal then
	}
}

// Stop sends sig and waits for the child to exit, sending SIGKILL after
// grace (a frozen child is thawed first, or it would never see sig).
func (p *Process) Stop(sig syscall.Signal, grace time.Duration) {
	p.Signal(sig)
	if sig != syscall.SIGKILL {
		p.Signal(syscall.SIGCONT)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
		p.Signal(syscall.SIGKILL)
		<-p.exited
	}
}

// Supervisor keeps a child running: started again (after a backoff from 1s
// to 30s, reset after a minute of running) whenever it exits on its own.
type Supervisor struct {
	spec    Spec
	log     *slog.Logger
	started func(pid int)

	mu   sync.Mutex
	cur  *Process
	once sync.Once
	stop chan struct{} // closed by Stop
	done chan struct{} // closed when run returns
}

// Supervise starts spec under supervision until ctx ends or Stop; started,
// if set, is called with the pid of each start.
func Supervise(ctx context.Context, spec Spec, log *slog.Logger, started func(pid int)) *Supervisor {
	s := &Supervisor{spec: spec, log: log, started: started, stop: make(chan struct{}), done: make(chan struct{})}
	go s.run(ctx)
	return s
}

func (s *Supervisor) run(ctx context.Context) {
	defer close(s.done)
	bo := backoff.New(time.Second, 30*time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.stop:
			return
		default:
		}
		p, err := Start(s.spec)
		if err != nil {
			s.log.Error("start", "process", s.spec.Argv[0], "err", err)
			return
		}
		begun := time.Now()
		s.mu.Lock()
		s.cur = p
		s.mu.Unlock()
		if s.started != nil {
			s.started(p.PID())
		}
		select {
		case <-ctx.Done():
			return // the caller stops the child (Stop), or Pdeathsig does
		case <-s.stop:
			return // Stop stops the child
		case <-p.Exited():
		}
		if time.Since(begun) > time.Minute {
			bo.Reset()
		}
		wait := bo.Next()
		s.log.Warn("process exited; restarting", "process", s.spec.Argv[0], "err", p.Err(), "after", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-s.stop:
			return
		case <-time.After(wait):
		}
	}
}

// PID is the running child's process id, 0 while none runs.
func (s *Supervisor) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil || !s.cur.Running() {
		return 0
	}
	return s.cur.PID()
}

// Stop ends the supervision and stops the child: SIGTERM, SIGKILL after
// grace. It returns once neither runs.
func (s *Supervisor) Stop(grace time.Duration) {
	s.once.Do(func() { close(s.stop) })
	<-s.done // no start after this
	s.mu.Lock()
	cur := s.cur
	s.mu.Unlock()
	if cur != nil {
		cur.Stop(syscall.SIGTERM, grace)
	}
}
