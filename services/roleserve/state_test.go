package roleserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"curia.dev/platform/backoff"
)

const testNode = "node-0123456789abcdef0123456789abcdef"

var discard = slog.New(slog.DiscardHandler)

// machineIn returns a machine whose persisted state is st.
func machineIn(t *testing.T, st State) (*machine, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "enrolment.json")
	m, err := loadMachine(path, testNode, discard)
	if err != nil {
		t.Fatal(err)
	}
	m.rec.State = st
	if err := m.persist(m.rec); err != nil {
		t.Fatal(err)
	}
	return reload(t, path), path
}

// reload reads the machine from disk, as a restarted agent does.
func reload(t *testing.T, path string) *machine {
	t.Helper()
	m, err := loadMachine(path, testNode, discard)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestTransitionsAllowed: every transition of the table runs its work and
// is persisted.
func TestTransitionsAllowed(t *testing.T) {
	for from, tos := range allowedTransitions {
		for _, to := range tos {
			t.Run(fmt.Sprintf("%s→%s", from, to), func(t *testing.T) {
				m, path := machineIn(t, from)
				ran := false
				if err := m.advance(context.Background(), to, func(context.Context) error { ran = true; return nil }); err != nil {
					t.Fatal(err)
				}
				if !ran || m.State() != to {
					t.Fatalf("work ran %v, state %s", ran, m.State())
				}
				rec, _ := reload(t, path).record()
				if rec.State != to || rec.Bootstrapped != (to == StateBootstrapping) {
					t.Fatalf("persisted %+v", rec)
				}
			})
		}
	}
}

// TestTransitionsForbidden: every transition that is not in the table
// fails the machine with the reason, and its work never runs.
func TestTransitionsForbidden(t *testing.T) {
	n := 0
	for _, from := range states {
		for _, to := range states {
			if allowed(from, to) {
				continue
			}
			n++
			t.Run(fmt.Sprintf("%s→%s", from, to), func(t *testing.T) {
				m, path := machineIn(t, from)
				err := m.advance(context.Background(), to, func(context.Context) error {
					t.Fatal("the work of a forbidden transition ran")
					return nil
				})
				if !errors.Is(err, errForbidden) {
					t.Fatalf("advance: %v", err)
				}
				rec, _ := reload(t, path).record()
				want := fmt.Sprintf("%s → %s", from, to)
				if rec.State != StateFailed || !strings.Contains(rec.Reason, want) {
					t.Fatalf("persisted %+v, want FAILED saying %q", rec, want)
				}
			})
		}
	}
	if n < 30 {
		t.Fatalf("only %d forbidden transitions checked", n)
	}
}

// TestFailFromAnyState: FAILED with a reason is reachable from every state
// and survives a restart.
func TestFailFromAnyState(t *testing.T) {
	for _, st := range states {
		t.Run(string(st), func(t *testing.T) {
			m, path := machineIn(t, st)
			m.fail("broken on purpose")
			rec, _ := reload(t, path).record()
			if rec.State != StateFailed || rec.Reason != "broken on purpose" {
				t.Fatalf("persisted %+v", rec)
			}
		})
	}
}

func TestLoadMachineRefuses(t *testing.T) {
	dir := t.TempDir()
	tests := map[string]string{
		"another node's state": `{"node_id":"node-ffffffffffffffffffffffffffffffff","state":"RUNNING"}`,
		"unknown state":        `{"node_id":"` + testNode + `","state":"DANCING"}`,
		"not JSON":             `{`,
	}
	for name, content := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := loadMachine(path, testNode, discard); err == nil {
				t.Fatal("loaded")
			}
		})
	}
}

// steps records which enrolment steps ran. A step named in crash cancels
// the run in the middle of its work (a crash); one named in fail returns
// that error once.
type steps struct {
	bootstrapNode bool
	calls         []string
	crash         string
	cancel        context.CancelFunc
	fail          map[string]error
}

func (s *steps) step(name string) func(context.Context) error {
	return func(ctx context.Context) error {
		s.calls = append(s.calls, name)
		if s.crash == name {
			s.cancel()
			return ctx.Err()
		}
		if err := s.fail[name]; err != nil {
			delete(s.fail, name)
			return err
		}
		return nil
	}
}

func (s *steps) choose() (State, func(context.Context) error, error) {
	if s.bootstrapNode {
		return StateBootstrapping, s.step("prepare-bootstrap"), nil
	}
	return StateRegistering, nil, nil
}
func (s *steps) bootstrap(ctx context.Context) error     { return s.step("bootstrap")(ctx) }
func (s *steps) register(ctx context.Context) error      { return s.step("register")(ctx) }
func (s *steps) awaitApproval(ctx context.Context) error { return s.step("await-approval")(ctx) }
func (s *steps) commit(ctx context.Context) error        { return s.step("commit")(ctx) }

func quick() *backoff.Backoff { return backoff.New(time.Millisecond, time.Millisecond) }

// TestResume: an agent restarted in any state resumes there: it runs the
// work of that state and what follows, never a step it finished before.
// Each case first crashes in the middle of that state's work, then
// restarts from the state file.
func TestResume(t *testing.T) {
	tests := map[string]struct {
		from      State
		bootstrap bool
		crashIn   string   // the step a first run crashes in ("": no first run)
		want      []string // steps the restarted run does
	}{
		"NEW, bootstrap node":          {from: StateNew, bootstrap: true, crashIn: "prepare-bootstrap", want: []string{"prepare-bootstrap", "bootstrap"}},
		"NEW, registering node":        {from: StateNew, crashIn: "register", want: []string{"register", "await-approval", "commit"}},
		"BOOTSTRAPPING":                {from: StateBootstrapping, bootstrap: true, crashIn: "bootstrap", want: []string{"bootstrap"}},
		"REGISTERING":                  {from: StateRegistering, crashIn: "register", want: []string{"register", "await-approval", "commit"}},
		"WAITING_FOR_APPROVAL":         {from: StateWaitingForApproval, crashIn: "await-approval", want: []string{"await-approval", "commit"}},
		"COMMITTING":                   {from: StateCommitting, crashIn: "commit", want: []string{"commit"}},
		"RUNNING":                      {from: StateRunning, want: nil},
		"RUNNING (bootstrap flags on)": {from: StateRunning, bootstrap: true, want: nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, path := machineIn(t, tc.from)
			if tc.crashIn != "" {
				ctx, cancel := context.WithCancel(context.Background())
				s := &steps{bootstrapNode: tc.bootstrap, crash: tc.crashIn, cancel: cancel}
				if err := drive(ctx, reload(t, path), s, quick(), discard); !errors.Is(err, context.Canceled) {
					t.Fatalf("crashed run: %v", err)
				}
				if got := reload(t, path).State(); got != tc.from && tc.from != StateNew {
					t.Fatalf("after a crash in %s: state %s, want %s", tc.crashIn, got, tc.from)
				}
			}
			s := &steps{bootstrapNode: tc.bootstrap}
			m := reload(t, path)
			if err := drive(context.Background(), m, s, quick(), discard); err != nil {
				t.Fatal(err)
			}
			if m.State() != StateRunning || reload(t, path).State() != StateRunning {
				t.Fatalf("state %s", m.State())
			}
			if !slices.Equal(s.calls, tc.want) {
				t.Fatalf("steps %v, want %v", s.calls, tc.want)
			}
		})
	}
	// A crash after NEW's work but before NEW's successor was persisted
	// repeats only that (idempotent) work.
	t.Run("crash between the work and the state write", func(t *testing.T) {
		_, path := machineIn(t, StateRegistering)
		ctx, cancel := context.WithCancel(context.Background())
		s := &steps{crash: "await-approval", cancel: cancel}
		if err := drive(ctx, reload(t, path), s, quick(), discard); err == nil {
			t.Fatal("drive went on after the crash")
		}
		if got := reload(t, path).State(); got != StateWaitingForApproval {
			t.Fatalf("state %s: register finished, so WAITING_FOR_APPROVAL was persisted", got)
		}
		s = &steps{}
		if err := drive(context.Background(), reload(t, path), s, quick(), discard); err != nil || !slices.Equal(s.calls, []string{"await-approval", "commit"}) {
			t.Fatalf("resumed with %v: %v", s.calls, err)
		}
	})
	t.Run("FAILED stays failed", func(t *testing.T) {
		m, path := machineIn(t, StateCommitting)
		m.fail("the node was decommissioned")
		s := &steps{}
		err := drive(context.Background(), reload(t, path), s, quick(), discard)
		if err == nil || !strings.Contains(err.Error(), "decommissioned") || len(s.calls) != 0 {
			t.Fatalf("drive: %v, steps %v", err, s.calls)
		}
	})
}

// TestDriveErrors: a failing step is retried in its state; a permanent
// failure fails the machine with its reason.
func TestDriveErrors(t *testing.T) {
	t.Run("retried", func(t *testing.T) {
		m, _ := machineIn(t, StateRegistering)
		s := &steps{fail: map[string]error{"register": errors.New("curator unavailable"), "commit": errors.New("not yet")}}
		if err := drive(context.Background(), m, s, quick(), discard); err != nil {
			t.Fatal(err)
		}
		want := []string{"register", "register", "await-approval", "commit", "commit"}
		if !slices.Equal(s.calls, want) || m.State() != StateRunning {
			t.Fatalf("steps %v, state %s", s.calls, m.State())
		}
	})
	t.Run("permanent", func(t *testing.T) {
		m, path := machineIn(t, StateWaitingForApproval)
		s := &steps{fail: map[string]error{"await-approval": permanent(errors.New("the node was deleted"))}}
		err := drive(context.Background(), m, s, quick(), discard)
		rec, _ := reload(t, path).record()
		if err == nil || rec.State != StateFailed || rec.Reason != "the node was deleted" || slices.Contains(s.calls, "commit") {
			t.Fatalf("drive: %v, persisted %+v, steps %v", err, rec, s.calls)
		}
	})
	t.Run("the note shows the last error", func(t *testing.T) {
		m, _ := machineIn(t, StateRegistering)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// register fails once, and the run stops at its second attempt.
		s := &crashAfter{steps: &steps{fail: map[string]error{"register": errors.New("wrong register ticket")}}, n: 2, cancel: cancel}
		if err := drive(ctx, m, s, quick(), discard); err == nil {
			t.Fatal("drive went on after the crash")
		}
		if _, note := m.record(); !strings.Contains(note, "wrong register ticket") || m.State() != StateRegistering {
			t.Fatalf("state %s, note %q", m.State(), note)
		}
	})
}

// crashAfter cancels the run at the n-th register call.
type crashAfter struct {
	*steps
	n, calls int
	cancel   context.CancelFunc
}

func (c *crashAfter) register(ctx context.Context) error {
	c.calls++
	if c.calls >= c.n {
		c.cancel()
		return ctx.Err()
	}
	return c.steps.register(ctx)
}

// TestBootstrapRecord: the bootstrap record is written only in
// BOOTSTRAPPING, is on disk when setBootstrap returns, and stays through
// RUNNING, FAILED and restarts. A record of an older agent has none.
func TestBootstrapRecord(t *testing.T) {
	begun := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	t.Run("persisted and kept", func(t *testing.T) {
		m, path := machineIn(t, StateBootstrapping)
		if m.bootstrap() != nil {
			t.Fatal("a new machine has a bootstrap record")
		}
		if err := m.setBootstrap(bootstrapRecord{Begun: begun}); err != nil {
			t.Fatal(err)
		}
		if b := reload(t, path).bootstrap(); b == nil || !b.Begun.Equal(begun) || b.confirmed() {
			t.Fatalf("persisted %+v", b)
		}
		want := bootstrapRecord{Begun: begun, MemberID: "8e9e05c52164694d", ClusterID: "cdf818194e3a8c32", Confirmed: begun.Add(time.Second)}
		if err := m.setBootstrap(want); err != nil {
			t.Fatal(err)
		}
		if err := m.advance(context.Background(), StateRunning, nil); err != nil {
			t.Fatal(err)
		}
		if b := reload(t, path).bootstrap(); b == nil || *b != want || !b.confirmed() {
			t.Fatalf("after RUNNING: %+v, want %+v", b, want)
		}
		m.fail("broken on purpose")
		if b := reload(t, path).bootstrap(); b == nil || *b != want {
			t.Fatalf("after FAILED: %+v, want %+v", b, want)
		}
	})
	for _, st := range states {
		if st == StateBootstrapping {
			continue
		}
		t.Run("refused in "+string(st), func(t *testing.T) {
			m, path := machineIn(t, st)
			if err := m.setBootstrap(bootstrapRecord{Begun: begun}); !errors.Is(err, errForbidden) {
				t.Fatalf("setBootstrap: %v", err)
			}
			if rec, _ := reload(t, path).record(); rec.Bootstrap != nil || rec.State != st {
				t.Fatalf("persisted %+v", rec)
			}
		})
	}
	t.Run("record of an older agent", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "enrolment.json")
		if err := os.WriteFile(path, []byte(`{"node_id":"`+testNode+`","state":"BOOTSTRAPPING","bootstrapped":true}`), 0o600); err != nil {
			t.Fatal(err)
		}
		if b := reload(t, path).bootstrap(); b != nil {
			t.Fatalf("bootstrap record %+v", b)
		}
	})
	t.Run("not written: nothing changes", func(t *testing.T) {
		m, path := machineIn(t, StateBootstrapping)
		m.path = filepath.Join(t.TempDir(), "gone", "enrolment.json")
		if err := m.setBootstrap(bootstrapRecord{Begun: begun}); err == nil {
			t.Fatal("setBootstrap without a place to write succeeded")
		}
		if m.bootstrap() != nil || reload(t, path).bootstrap() != nil {
			t.Fatal("a record that was not written is in force")
		}
	})
}
