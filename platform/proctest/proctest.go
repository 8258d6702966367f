// Package proctest runs curia's binaries as real processes in tests, so that
// a test can kill -9 a service the way a machine failure would, and polls
// for conditions with a deadline instead of sleeping.
//
// Tests that start processes or etcd are skipped under `go test -short`
// (make test-unit): Build and New skip, and so does every other helper that
// starts etcd, through SkipShort. Binaries are built with -race when the
// tests run with it (race.go), so that the race detector watches the
// services too, not only the test's own goroutines.
//
// With CURIA_COVERDIR set (make test does), the binaries are built with
// -cover too and write their coverage counters there when they exit, so
// that the code a test runs only inside a process counts as covered
// (platform/cmd/curia-cover adds them to the tests' profile).
package proctest

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"curia.dev/platform/process"
)

// SkipShort skips the test under `go test -short`: it is called where a
// test starts processes (Build, New) or etcd (the in-process etcd helpers),
// so that the fast tier never runs one and no test has to remember to skip.
func SkipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts processes or etcd: skipped with -short")
	}
}

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// coverDir is where binaries built with -cover write their counters
// (GOCOVERDIR), from CURIA_COVERDIR: an absolute directory, since each
// package's tests run in their own. Empty: no coverage, the binaries are
// built and stopped as without it.
var coverDir = os.Getenv("CURIA_COVERDIR")

// coverStopGrace is how long the end of a test gives a process built with
// -cover to exit on SIGTERM before it kills it. A service that hangs on
// its way out loses its counters, not the test its time.
const coverStopGrace = 10 * time.Second

// Build builds the command package pkg (e.g.
// "curia.dev/services/consensus/cmd/consensus") with the given build tags
// and returns the binary's path, with -race when the test binary has it.
// The test must run inside the go.work. Under -short it skips the test.
//
// With CURIA_COVERDIR set, the binary is built with -cover for every
// package of curia it links (-coverpkg=curia.dev/...), in atomic mode as
// `go test -race -cover` counts, so that both profiles add up; it goes to
// a directory of its own (+cover), next to the plain one.
//
// The binary goes to a directory of this user's shared by every test
// process (one per package): go build leaves a binary alone when its build
// ID says it is current, so only the first package of a `go test ./...`
// links it, and the others find it made (linking a -race binary takes
// seconds of CPU). A lock file keeps two test processes from building one
// binary at once; a binary another test still runs is replaced by a
// rename, never written over.
func Build(t testing.TB, pkg string, tags ...string) string {
	t.Helper()
	SkipShort(t)
	buildMu.Lock()
	defer buildMu.Unlock()
	key := pkg + " " + strings.Join(tags, ",")
	if p, ok := built[key]; ok {
		return p
	}
	variant := strings.Join(append([]string{strings.ReplaceAll(pkg, "/", "_")}, tags...), "+")
	if raceEnabled {
		variant += "+race"
	}
	if coverDir != "" {
		if !filepath.IsAbs(coverDir) {
			t.Fatalf("CURIA_COVERDIR=%q: want an absolute path (each package's tests run in its own directory)", coverDir)
		}
		if err := os.MkdirAll(coverDir, 0o700); err != nil {
			t.Fatalf("CURIA_COVERDIR: %v", err)
		}
		variant += "+cover"
	}
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("curia-test-bin-%d", os.Getuid()), variant)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	unlock, err := lockFile(dir + ".lock")
	if err != nil {
		t.Fatalf("lock the build of %s: %v", pkg, err)
	}
	defer unlock()
	bin := filepath.Join(dir, filepath.Base(pkg))
	args := []string{"build", "-tags", strings.Join(tags, ","), "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	if coverDir != "" {
		// gen/ too: leaving it out saves no measurable build time (a
		// tenth of a second on the consensus binary).
		args = append(args, "-cover", "-covermode=atomic", "-coverpkg=curia.dev/...")
	}
	out, err := exec.Command("go", append(args, pkg)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	built[key] = bin
	return bin
}

// lockFile takes an exclusive lock on the file path (made if need be),
// across processes, until unlock.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil // closing the file drops the lock
}

// Proc is one service process, started and stopped as often as a test
// likes; its output goes to a log file that is printed when the test fails.
type Proc struct {
	t    testing.TB
	Name string
	bin  string
	args []string
	Log  string
	// Env is the process's environment (the test's, by default, and
	// CURIA_FAILPOINT_DIR).
	Env []string
	// Failpoints is the process's CURIA_FAILPOINT_DIR: Hold stops it at a
	// point of its code (binaries built with the failpoints tag).
	Failpoints string

	mu   sync.Mutex
	proc *process.Process // nil before Start and after a stop
}

// New prepares a process; Start runs it. It is killed when the test ends
// (under coverage, stopped: SIGTERM, SIGKILL after 10s; see Build).
func New(t testing.TB, name, bin string, args ...string) *Proc {
	t.Helper()
	SkipShort(t)
	p := &Proc{t: t, Name: name, bin: bin, args: args, Log: filepath.Join(t.TempDir(), name+".log"), Failpoints: t.TempDir()}
	p.Env = append(os.Environ(), "CURIA_FAILPOINT_DIR="+p.Failpoints)
	if coverDir != "" {
		p.Env = append(p.Env, "GOCOVERDIR="+coverDir)
		if raceEnabled {
			// The race detector sleeps a second before a process exits
			// (GORACE's atexit_sleep_ms, for other threads to report):
			// under coverage every process exits, and those seconds
			// added a minute to the reconciler's tests alone.
			p.Env = append(p.Env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
		}
	}
	t.Cleanup(func() {
		if coverDir != "" {
			// A binary built with -cover writes its counters when it
			// exits (returning from main, or os.Exit: run.Main does
			// either on SIGTERM), and SIGKILL leaves it no exit.
			p.stop(syscall.SIGTERM, coverStopGrace)
		} else {
			p.Kill()
		}
		// A -race binary reports a race and runs on: its log is where
		// the race shows, and the test fails on it.
		if raceEnabled {
			if b, _ := os.ReadFile(p.Log); bytes.Contains(b, []byte(raceWarning)) {
				t.Errorf("%s: the race detector found a data race:\n%s", name, firstRace(b))
			}
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.Log)
			t.Logf("--- log of %s ---\n%s", name, tail(b, 80))
		}
	})
	return p
}

func tail(b []byte, lines int) string {
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// Start starts the process unless it runs (platform/process: its own
// process group, killed if the test binary dies).
func (p *Proc) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil && p.proc.Running() {
		return
	}
	// The exit status of the one before is not the test's verdict: tests
	// stop and kill their processes on purpose, and judge them by API and
	// log.
	proc, err := process.Start(process.Spec{Argv: append([]string{p.bin}, p.args...), Env: p.Env, Log: p.Log})
	if err != nil {
		p.t.Fatal(err)
	}
	p.proc = proc
}

// Running reports whether the process runs (started and not exited).
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.proc != nil && p.proc.Running()
}

// PID is the running process's id (0 when stopped).
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		return 0
	}
	return p.proc.PID()
}

// Kill sends SIGKILL and waits for the process to die.
func (p *Proc) Kill() { p.Signal(syscall.SIGKILL) }

// Stop sends SIGTERM and waits for the process to exit.
func (p *Proc) Stop() { p.Signal(syscall.SIGTERM) }

// Pause freezes the process (SIGSTOP), as a long GC pause or a stalled VM
// would; Resume lets it go on (SIGCONT).
func (p *Proc) Pause() { p.send(syscall.SIGSTOP) }

// Resume continues a paused process.
func (p *Proc) Resume() { p.send(syscall.SIGCONT) }

func (p *Proc) send(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc != nil {
		p.proc.Signal(sig)
	}
}

// Signal sends sig and waits for the process to exit (SIGKILL after 30s; a
// paused process is resumed to see sig).
func (p *Proc) Signal(sig syscall.Signal) { p.stop(sig, 30*time.Second) }

// stop sends sig and waits for the process to exit, SIGKILL after grace.
func (p *Proc) stop(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	proc := p.proc
	p.proc = nil
	p.mu.Unlock()
	if proc != nil {
		proc.Stop(sig, grace)
	}
}

// Hold makes the process stop at the named failpoint (platform/failpoint)
// the next time it gets there, until release is called (at the latest when
// the test ends).
func (p *Proc) Hold(name string) (release func()) {
	p.t.Helper()
	dir := filepath.Join(p.Failpoints, name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		p.t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { os.RemoveAll(dir) }) }
	p.t.Cleanup(release)
	return release
}

// ArmCrash makes the process exit (code 86) the next time it passes the
// named failpoint (platform/failpoint.Crash); once: arm it again for
// another crash.
func (p *Proc) ArmCrash(name string) {
	p.t.Helper()
	if err := os.WriteFile(filepath.Join(p.Failpoints, name+".crash"), nil, 0o600); err != nil {
		p.t.Fatal(err)
	}
}

// Delay makes the process sleep d every time it passes the named
// failpoint (until the test ends).
func (p *Proc) Delay(name string, d time.Duration) {
	p.t.Helper()
	file := filepath.Join(p.Failpoints, name+".delay")
	if err := os.WriteFile(file, []byte(d.String()), 0o600); err != nil {
		p.t.Fatal(err)
	}
}

// Reached waits until the process stopped at the held failpoint name.
func (p *Proc) Reached(name string) {
	p.t.Helper()
	Eventually(p.t, time.Minute, func() error {
		_, err := os.Stat(filepath.Join(p.Failpoints, name, "reached"))
		return err
	})
}

// LogContains reports whether the process's log contains s.
func (p *Proc) LogContains(s string) bool {
	b, _ := os.ReadFile(p.Log)
	return strings.Contains(string(b), s)
}

// FreeAddr returns a loopback address with a port free right now. Ports
// come from below the kernel's ephemeral range: a port picked from that
// range (":0") can be taken by the client side of any connection before
// the service binds it. A port is also reserved for the test's life with a
// lock file, so that test binaries running side by side (go test runs
// packages in parallel) never hand out the same port between its pick
// and its bind.
func FreeAddr(t testing.TB) string {
	t.Helper()
	low := ephemeralLow()
	dir := filepath.Join(os.TempDir(), "curia-proctest-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		port := 10000 + rand.IntN(low-10000)
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			continue
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close() // another test holds it
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			f.Close()
			continue
		}
		l.Close()
		t.Cleanup(func() { f.Close() }) // (closing releases the lock)
		return l.Addr().String()
	}
	t.Fatal("no free port below the ephemeral range")
	return ""
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if low, err := strconv.Atoi(f[0]); err == nil && low > 11000 {
				return low
			}
		}
	}
	return 32768
}

// Eventually polls f until it returns nil, or fails the test with f's last
// error when timeout passes.
func Eventually(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := 10 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", timeout, err)
		}
		time.Sleep(wait)
		if wait < 500*time.Millisecond {
			wait *= 2
		}
	}
}

// Get does a plain-HTTP GET (a process's /healthz or /metrics) and returns
// the status code and body.
func Get(url string) (code int, body string, err error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// WaitHealthz polls http://addr/healthz until it answers code (200 once the
// process is SERVING, 503 while it is not), or fails the test.
func WaitHealthz(t testing.TB, addr string, code int, timeout time.Duration) {
	t.Helper()
	Eventually(t, timeout, func() error {
		got, body, err := Get("http://" + addr + "/healthz")
		if err != nil || got != code {
			return fmt.Errorf("/healthz of %s = %d %q (%w), want %d", addr, got, strings.TrimSpace(body), err, code)
		}
		return nil
	})
}

// MetricsHave fails the test unless http://addr/metrics names every metric
// in names.
func MetricsHave(t testing.TB, addr string, names ...string) string {
	t.Helper()
	return MetricsAtHave(t, addr, "/metrics", names...)
}

// MetricsAtHave fails the test unless http://addr<path> names every metric
// in names (a name, or a name and the start of its labels).
func MetricsAtHave(t testing.TB, addr, path string, names ...string) string {
	t.Helper()
	code, body, err := Get("http://" + addr + path)
	if err != nil || code != http.StatusOK {
		t.Fatalf("%s of %s = %d (%v)", path, addr, code, err)
	}
	for _, n := range names {
		if !strings.Contains(body, "\n"+n) && !strings.HasPrefix(body, n) {
			t.Errorf("%s of %s lacks %s", path, addr, n)
		}
	}
	return body
}

const raceWarning = "WARNING: DATA RACE"

// firstRace is the first race report in a -race binary's log.
func firstRace(log []byte) []byte {
	_, report, _ := bytes.Cut(log, []byte(raceWarning))
	report, _, _ = bytes.Cut(report, []byte("=================="))
	return append([]byte(raceWarning), report...)
}

// BlackHole is the address of a listener that accepts connections and never
// answers, as a frozen machine does (its kernel still accepts): a server
// that hangs. It closes when the test ends.
func BlackHole(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	return l.Addr().String()
}
