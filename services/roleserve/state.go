package roleserve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"curia.dev/platform/pki"
)

// State is where the node is in its enrolment (DESIGN §7; Metropolis'
// cluster manager is the ancestor).
type State string

// The enrolment states.
const (
	StateNew                State = "NEW"
	StateBootstrapping      State = "BOOTSTRAPPING"
	StateRegistering        State = "REGISTERING"
	StateWaitingForApproval State = "WAITING_FOR_APPROVAL"
	StateCommitting         State = "COMMITTING"
	StateRunning            State = "RUNNING"
	StateFailed             State = "FAILED"
)

// states lists every state, in enrolment order.
var states = []State{StateNew, StateBootstrapping, StateRegistering, StateWaitingForApproval, StateCommitting, StateRunning, StateFailed}

// allowedTransitions is the enrolment state machine: from → the states it
// may move to. FAILED is reachable from every state (machine.fail) and is
// final; RUNNING is final too.
//
//	NEW ─┬─▶ BOOTSTRAPPING ───────────────────────────────────────────▶ RUNNING
//	     └─▶ REGISTERING ─▶ WAITING_FOR_APPROVAL ─▶ COMMITTING ─────────▶ RUNNING
//	(any) ─▶ FAILED(reason)
var allowedTransitions = map[State][]State{
	StateNew:                {StateBootstrapping, StateRegistering},
	StateBootstrapping:      {StateRunning},
	StateRegistering:        {StateWaitingForApproval},
	StateWaitingForApproval: {StateCommitting},
	StateCommitting:         {StateRunning},
}

// allowed reports whether the table has from → to.
func allowed(from, to State) bool {
	return slices.Contains(allowedTransitions[from], to)
}

func (s State) valid() bool { return slices.Contains(states, s) }

// enrolmentRecord is the persisted state of the machine (enrolment.json).
type enrolmentRecord struct {
	// NodeID guards against a state file of another node's data dir.
	NodeID string `json:"node_id"`
	State  State  `json:"state"`
	// Reason says why the machine failed (FAILED only).
	Reason string `json:"reason,omitempty"`
	// Bootstrapped: the node went through BOOTSTRAPPING, i.e. it created
	// the cluster (the bootstrap data of the control-plane reduce).
	Bootstrapped bool `json:"bootstrapped,omitempty"`
	// Bootstrap is what BOOTSTRAPPING did on the local consensus; once
	// set, the local consensus is never bootstrapped again (enrolment.go,
	// bootstrapLocal).
	Bootstrap *bootstrapRecord `json:"bootstrap,omitempty"`
	Changed   time.Time        `json:"changed"`
}

// bootstrapRecord is the history of this node's bootstrap member.
type bootstrapRecord struct {
	// Begun is when Start(bootstrap) was about to be called for the first
	// time: persisted before the call, so from then on the local
	// consensus may hold the cluster's first member.
	Begun time.Time `json:"begun"`
	// MemberID and ClusterID (hex, as etcd writes them) name the member
	// once it was seen running; persisted before the curator hears of the
	// cluster.
	MemberID  string    `json:"member_id,omitempty"`
	ClusterID string    `json:"cluster_id,omitempty"`
	Confirmed time.Time `json:"confirmed,omitzero"`
}

// confirmed reports whether the member was seen running.
func (b *bootstrapRecord) confirmed() bool { return b != nil && b.MemberID != "" }

// errForbidden is the error of a transition that is not in the table.
var errForbidden = errors.New("enrolment transition not allowed")

// permanentError marks a step's failure that retrying cannot fix: the
// machine fails with it.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// permanent marks err as a failure that retrying cannot fix.
func permanent(err error) error { return &permanentError{err: err} }

func isPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// machine is the enrolment state machine. Every transition is checked
// against allowedTransitions before its work runs and persisted (atomic
// write) after the work succeeded, so that a restart resumes in the state
// whose work has not been done yet and never repeats a finished step.
type machine struct {
	path string
	log  *slog.Logger

	mu  sync.Mutex
	rec enrolmentRecord
	// note is what the current state waits for or its last error; not
	// persisted.
	note string
}

// loadMachine reads the machine of node nodeID from path, or creates it in
// NEW (persisted at once) when the file does not exist.
func loadMachine(path, nodeID string, log *slog.Logger) (*machine, error) {
	m := &machine{path: path, log: log}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		m.rec = enrolmentRecord{NodeID: nodeID, State: StateNew, Changed: time.Now().UTC()}
		if err := m.persist(m.rec); err != nil {
			return nil, err
		}
		return m, nil
	case err != nil:
		return nil, fmt.Errorf("read enrolment state: %w", err)
	}
	if err := json.Unmarshal(b, &m.rec); err != nil {
		return nil, fmt.Errorf("read enrolment state %s: %w", path, err)
	}
	if m.rec.NodeID != nodeID {
		return nil, fmt.Errorf("enrolment state %s is of node %s, not of this node %s", path, m.rec.NodeID, nodeID)
	}
	if !m.rec.State.valid() {
		return nil, fmt.Errorf("enrolment state %s: unknown state %q", path, m.rec.State)
	}
	return m, nil
}

func (m *machine) persist(rec enrolmentRecord) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode enrolment state: %w", err)
	}
	if err := pki.WriteFileAtomic(m.path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("persist enrolment state: %w", err)
	}
	return nil
}

// State is the current state.
func (m *machine) State() State {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rec.State
}

// record returns the persisted record and the transient note.
func (m *machine) record() (enrolmentRecord, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rec, m.note
}

// setNote records what the current state waits for (or its last error).
func (m *machine) setNote(note string) {
	m.mu.Lock()
	m.note = note
	m.mu.Unlock()
}

// advance moves the machine to next: it checks the transition against the
// table first — a transition not in the table fails the machine and work
// does not run —, then runs work (nil: nothing to do), then persists next.
// An error of work leaves the state as it is (the caller retries) and is
// returned; advance does not fail the machine for it.
func (m *machine) advance(ctx context.Context, next State, work func(context.Context) error) error {
	from := m.State()
	if !allowed(from, next) {
		err := fmt.Errorf("%w: %s → %s", errForbidden, from, next)
		m.fail(err.Error())
		return err
	}
	if work != nil {
		if err := work(ctx); err != nil {
			return err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rec.State != from {
		// Only the enrolment runner advances; a concurrent change is a bug.
		return fmt.Errorf("%w: the state moved from %s to %s meanwhile", errForbidden, from, m.rec.State)
	}
	rec := m.rec
	rec.State, rec.Reason, rec.Changed = next, "", time.Now().UTC()
	if next == StateBootstrapping {
		rec.Bootstrapped = true
	}
	if err := m.persist(rec); err != nil {
		return err
	}
	m.rec, m.note = rec, ""
	m.log.Info("enrolment state changed", "from", from, "to", next)
	return nil
}

// bootstrap returns the bootstrap record (nil: none yet).
func (m *machine) bootstrap() *bootstrapRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rec.Bootstrap == nil {
		return nil
	}
	b := *m.rec.Bootstrap
	return &b
}

// setBootstrap persists the bootstrap record b; only BOOTSTRAPPING does
// bootstrap work. It returns once b is on disk.
func (m *machine) setBootstrap(b bootstrapRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rec.State != StateBootstrapping {
		return fmt.Errorf("%w: bootstrap record in state %s", errForbidden, m.rec.State)
	}
	rec := m.rec
	rec.Bootstrap = &b
	if err := m.persist(rec); err != nil {
		return err
	}
	m.rec = rec
	return nil
}

// fail moves the machine to FAILED with reason, from any state. A
// FAILED machine stays failed (also across restarts).
func (m *machine) fail(reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	from := m.rec.State
	rec := m.rec
	rec.State, rec.Reason, rec.Changed = StateFailed, reason, time.Now().UTC()
	if err := m.persist(rec); err != nil {
		m.log.Error("persist failed enrolment state", "err", err)
	}
	m.rec, m.note = rec, ""
	m.log.Error("enrolment failed", "from", from, "reason", reason)
}
