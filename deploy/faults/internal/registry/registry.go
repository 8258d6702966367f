// Package registry records the fault suite's calls to the curator's node
// registry and checks the history for linearizability with porcupine.
//
// Every call on a synthetic node (a key and nothing else) is recorded with
// its call and return times and its result (History.Begin). Check turns the
// history into porcupine operations, partitioned by node id, and checks them
// against the sequential specification below.
//
// # The specification, as the curator implements it
//
// The state of one node is absent, deleted (absent for good: its id is
// tombstoned), or {state, worker}. A node starts absent (the workload makes
// a fresh key per synthetic node). The rules come from
// the curator's internal/registry (enrolment.go, nodes.go, roles.go) and
// internal/nodestore; each is checked by the model's step function:
//
//   - register (Curator/RegisterNode): absent → NEW, no roles; deleted is
//     PermissionDenied (a deleted id never registers again). A node that
//     exists already is answered with its record, unchanged, in any state (not
//     only NEW, whatever the proto comment says). The create is guarded by
//     "no such key", so two registers make one node. The answer is a second
//     read after the write; when it finds the node deleted meanwhile the call
//     fails NotFound although the node was created.
//   - approve (Management/ApproveNode): NEW → STANDBY; STANDBY and UP are
//     answered unchanged; absent is NotFound; any other state is
//     FailedPrecondition. The write is guarded by the record read (Aborted if
//     it changed). The answer is a re-read after the write: NotFound there
//     means approved, then deleted.
//   - commit (Curator/CommitNode, as the node): STANDBY → UP, and UP → UP
//     again (a new certificate; roles kept). NEW is FailedPrecondition,
//     absent NotFound, a changed record Aborted. The answer is a re-read: NotFound
//     there means committed, then deleted.
//   - set-worker (Management/UpdateNodeRoles, kubernetes_worker only): UP →
//     UP with worker = the argument, other roles kept; any other state is
//     FailedPrecondition, absent NotFound; a change under the call (or a
//     pending etcd membership change) is Aborted. The answer is a re-read
//     after the write (NotFound there: written, then deleted), or the
//     record read when it already had the value.
//   - delete (Management/DeleteNode, both safety bypasses): exists → deleted,
//     in any state. Absent is NotFound. A changed record makes it decide
//     again, never Aborted.
//   - get (Management/GetNodes filtered to one id): reads the node from a
//     single etcd (linearizable) read: absent, or its state and worker.
//
// # What the results tell the model
//
// An acknowledged call took effect: the model requires the state that
// allows it and moves to the state after it. Because a write's answer is a
// re-read of the record (see above), the returned record is not the state
// just after the op but a state the record had at some point of the call:
// Check adds, for every acknowledged write that returned a record, a read
// ("<op> answer") with the same interval that must return that record.
//
// A refused call (OutcomeRefused) did not take effect, except for NotFound
// from a write's re-read, which follows the write: so a refused
// register/approve/commit/set-worker may also have taken the effect it would
// have had (the model allows both). When the result carries the gRPC code
// (Result.Code) the model also checks the state the refusal implies where
// the code guarantees it: NotFound → absent (or the write happened, see
// above); approve FailedPrecondition → exists, Aborted → NEW; commit
// FailedPrecondition → NEW, Aborted → STANDBY or UP; set-worker
// FailedPrecondition → exists (the consensus service's errors keep their
// code, so not necessarily "not UP"), Aborted → UP; delete NotFound → absent.
// Other refusals (PermissionDenied, Unauthenticated, InvalidArgument, ...)
// are answered before anything is read or written: no effect, any state.
//
// A call with an unknown outcome (OutcomeUnknown: a timeout, Unavailable,
// Internal, ...) may or may not have taken effect, at any time after its
// call: its return time is infinite (math.MaxInt64) and the model allows
// both. A get that did not answer says nothing and is left out.
//
// The model assumes writes are not retried by the client (platform/rpc
// retries only the reads the protos declare without side effects): a
// retried delete would answer NotFound after its first attempt deleted the
// node.
package registry

import (
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Outcome is what a call's error says about its effect.
type Outcome int

const (
	// OutcomeOK: the call succeeded; it took effect.
	OutcomeOK Outcome = iota
	// OutcomeRefused: a definite error; the server answered that it did not
	// do what was asked (but see the package comment on NotFound).
	OutcomeRefused
	// OutcomeUnknown: the call may or may not have taken effect.
	OutcomeUnknown
)

func (o Outcome) String() string {
	switch o {
	case OutcomeOK:
		return "ok"
	case OutcomeRefused:
		return "refused"
	case OutcomeUnknown:
		return "unknown"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// OutcomeOf classifies a call's error by its gRPC status code.
//
// Refused are the codes the curator (or the RPC layer before the handler)
// gives only for a call that wrote nothing: NotFound, FailedPrecondition,
// Aborted (a guarded etcd write found the record changed, so it did not
// write), AlreadyExists, InvalidArgument, PermissionDenied, Unauthenticated,
// Unimplemented. Everything else may come after the write was sent:
// Unavailable (the etcd txn did not answer; also a lost term, which did not
// write, but the code does not tell them apart), DeadlineExceeded, Canceled,
// Internal and Unknown (an etcd error on the read after the write becomes
// Internal), ResourceExhausted, OutOfRange, DataLoss: unknown.
func OutcomeOf(err error) Outcome {
	if err == nil {
		return OutcomeOK
	}
	switch status.Code(err) {
	case codes.OK:
		return OutcomeOK
	case codes.NotFound, codes.FailedPrecondition, codes.Aborted, codes.AlreadyExists,
		codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented:
		return OutcomeRefused
	}
	return OutcomeUnknown
}

// Result is what a call returned.
type Result struct {
	Outcome Outcome
	// Exists, State and Worker are the node record a successful call
	// returned (register, approve, commit, set-worker) or found (get;
	// Exists false: no such node). State is the NodeState's String(), e.g.
	// "NODE_STATE_UP"; Worker says whether the node holds KubernetesWorker.
	Exists bool
	State  string
	Worker bool
	// Code is the gRPC code of a refused call (status.Code(err)), optional:
	// with it the model checks that the refusal fits the state (see the
	// package comment); without it (codes.OK) a refusal is only "no effect,
	// or the effect the op would have had".
	Code codes.Code
}

// The operations.
const (
	OpRegister  = "register"
	OpApprove   = "approve"
	OpCommit    = "commit"
	OpSetWorker = "set-worker"
	OpDelete    = "delete"
	OpGet       = "get"
)

// entry is one recorded call.
type entry struct {
	client int
	op     string
	node   string
	worker bool
	call   int64
	ret    int64 // 0 while pending
	done   bool
	result Result
}

// History records calls; it is safe for concurrent use. The zero value is
// an empty history.
type History struct {
	mu      sync.Mutex
	base    time.Time // monotonic clock reading of the first call
	baseNS  int64
	entries []*entry
}

// now is nanoseconds since the Unix epoch on the monotonic clock: the wall
// clock of the first call plus the monotonic time since, so that a wall
// clock step cannot reorder calls. Called with h.mu held.
func (h *History) now() int64 {
	if h.base.IsZero() {
		h.base = time.Now()
		h.baseNS = h.base.UnixNano()
	}
	return h.baseNS + time.Since(h.base).Nanoseconds()
}

// Begin records an operation's call time; the returned func records its
// return time and result (only its first call counts). op is one of
// "register", "approve", "commit", "set-worker", "delete", "get"; worker is
// the argument of set-worker. A call whose func is never called is checked
// as one with an unknown outcome.
func (h *History) Begin(client int, op, node string, worker bool) func(Result) {
	h.mu.Lock()
	e := &entry{client: client, op: op, node: node, worker: worker, call: h.now()}
	h.entries = append(h.entries, e)
	h.mu.Unlock()
	return func(r Result) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if e.done {
			return
		}
		e.ret, e.done, e.result = h.now(), true, r
		if e.ret < e.call {
			e.ret = e.call
		}
	}
}

// add records a finished call with given times (tests build histories so).
func (h *History) add(client int, op, node string, worker bool, call, ret int64, r Result) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.entries = append(h.entries, &entry{client: client, op: op, node: node, worker: worker, call: call, ret: ret, done: true, result: r})
}

// Len is the number of calls recorded.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.entries)
}

// snapshot copies the entries.
func (h *History) snapshot() []entry {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]entry, len(h.entries))
	for i, e := range h.entries {
		out[i] = *e
	}
	return out
}

// Verdict is the result of Check.
type Verdict struct {
	Result porcupine.CheckResult
	// Ops is the number of calls recorded; Unknown of them had an unknown
	// outcome (or never returned).
	Ops     int
	Unknown int
}

// OK is true unless porcupine found the history not linearizable. A check
// that timed out is OK (nothing was found), and String says so.
func (v Verdict) OK() bool { return v.Result != porcupine.Illegal }

func (v Verdict) String() string {
	var s string
	switch v.Result {
	case porcupine.Ok:
		s = "linearizable"
	case porcupine.Illegal:
		s = "NOT linearizable"
	case porcupine.Unknown:
		s = "unknown (checker timed out)"
	default:
		s = fmt.Sprintf("unknown (checker result %q)", v.Result)
	}
	return fmt.Sprintf("%s (%d ops, %d with unknown outcome)", s, v.Ops, v.Unknown)
}

// input is a porcupine operation's input.
type input struct {
	Op     string // an op, or "<op> answer" for the read of a write's answer
	Node   string
	Worker bool // set-worker's argument
}

// output is a porcupine operation's output.
type output struct {
	Outcome Outcome
	Code    codes.Code
	Exists  bool
	State   string
	Worker  bool
}

// state is one node's state in the model.
type state struct {
	Exists bool
	State  string
	Worker bool
	// Deleted: absent, and tombstoned.
	Deleted bool
}

const (
	stateNew     = "NODE_STATE_NEW"
	stateStandby = "NODE_STATE_STANDBY"
	stateUp      = "NODE_STATE_UP"
)

var (
	absent  = state{}
	deleted = state{Deleted: true}
)

// seen is what a read of s returns: a deleted node reads as absent.
func seen(s state) state {
	s.Deleted = false
	return s
}

const answerSuffix = " answer"

// Check checks the history for linearizability within timeout (0: no
// limit). When it is not linearizable and vizPath is not empty, porcupine's
// visualization (HTML) is written to vizPath; an error writing it is
// returned with the verdict.
func Check(h *History, timeout time.Duration, vizPath string) (Verdict, error) {
	entries := h.snapshot()
	v := Verdict{Ops: len(entries)}
	var ops []porcupine.Operation
	for _, e := range entries {
		switch e.op {
		case OpRegister, OpApprove, OpCommit, OpSetWorker, OpDelete, OpGet:
		default:
			return v, fmt.Errorf("registry history: unknown op %q", e.op)
		}
		r := e.result
		ret := e.ret
		if !e.done || r.Outcome == OutcomeUnknown {
			v.Unknown++
			r = Result{Outcome: OutcomeUnknown}
			ret = math.MaxInt64
		}
		if e.op == OpGet && r.Outcome != OutcomeOK {
			continue // a read without an answer says nothing
		}
		in := input{Op: e.op, Node: e.node, Worker: e.worker}
		out := output{Outcome: r.Outcome, Code: r.Code, Exists: r.Exists, State: r.State, Worker: r.Worker}
		if r.Outcome != OutcomeRefused {
			out.Code = codes.OK
		}
		if r.Outcome == OutcomeOK && e.op != OpGet && e.op != OpDelete {
			// The write, and the read of its answer (same interval).
			ops = append(ops, porcupine.Operation{ClientId: e.client, Input: in, Call: e.call, Output: output{Outcome: OutcomeOK}, Return: ret})
			in.Op += answerSuffix
		}
		ops = append(ops, porcupine.Operation{ClientId: e.client, Input: in, Call: e.call, Output: out, Return: ret})
	}
	m := Model()
	res, info := porcupine.CheckOperationsVerbose(m, ops, timeout)
	v.Result = res
	if res == porcupine.Illegal && vizPath != "" {
		if err := porcupine.VisualizePath(m, info, vizPath); err != nil {
			return v, fmt.Errorf("write linearizability visualization %s: %w", vizPath, err)
		}
	}
	return v, nil
}

// Model is the registry's specification as a porcupine model (partitioned
// by node id): operations are porcupine.Operations whose Input and Output
// Check makes from a History.
func Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partition,
		Init:      func() []interface{} { return []interface{}{absent} },
		Step: func(s, in, out interface{}) []interface{} {
			next := step(s.(state), in.(input), out.(output))
			r := make([]interface{}, len(next))
			for i, n := range next {
				r[i] = n
			}
			return r
		},
		Hash: func(s interface{}) uint64 {
			st := s.(state)
			f := fnv.New64a()
			fmt.Fprintf(f, "%v|%s|%v|%v", st.Exists, st.State, st.Worker, st.Deleted)
			return f.Sum64()
		},
		DescribeOperation: describeOperation,
		DescribeState:     func(s interface{}) string { return describeState(s.(state)) },
	}
	return nm.ToModel()
}

func partition(history []porcupine.Operation) [][]porcupine.Operation {
	byNode := map[string][]porcupine.Operation{}
	for _, op := range history {
		n := op.Input.(input).Node
		byNode[n] = append(byNode[n], op)
	}
	nodes := make([]string, 0, len(byNode))
	for n := range byNode {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	out := make([][]porcupine.Operation, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, byNode[n])
	}
	return out
}

// effect is the state after op took effect on s, and whether op could take
// effect (succeed) in s at all.
func effect(op string, worker bool, s state) (state, bool) {
	switch op {
	case OpRegister:
		if s.Deleted {
			return s, false
		}
		if !s.Exists {
			return state{Exists: true, State: stateNew}, true
		}
		return s, true // answered with the existing record
	case OpApprove:
		switch {
		case !s.Exists:
			return s, false
		case s.State == stateNew:
			s.State = stateStandby
			return s, true
		case s.State == stateStandby, s.State == stateUp:
			return s, true
		}
		return s, false
	case OpCommit:
		if s.Exists && (s.State == stateStandby || s.State == stateUp) {
			s.State = stateUp
			return s, true
		}
		return s, false
	case OpSetWorker:
		if s.Exists && s.State == stateUp {
			s.Worker = worker
			return s, true
		}
		return s, false
	case OpDelete:
		if s.Exists {
			return deleted, true
		}
		return s, false
	case OpGet:
		return s, true
	}
	return s, false
}

// written is the state after op wrote the node record in s, and whether op
// writes in s at all. An op that answers from the record it read without
// writing (register of an existing node, approve of a STANDBY or UP node,
// set-worker to the value the node has) is not a write; commit of an UP node
// is (a new certificate serial).
func written(op string, worker bool, s state) (state, bool) {
	switch op {
	case OpRegister:
		return effect(op, worker, s)
	case OpApprove:
		if s.Exists && s.State == stateNew {
			return effect(op, worker, s)
		}
	case OpCommit, OpDelete:
		return effect(op, worker, s)
	case OpSetWorker:
		if s.Exists && s.Worker != worker {
			return effect(op, worker, s)
		}
	}
	return s, false
}

// notFoundAfterWrite says whether op answers NotFound when the node was
// deleted between its write and the re-read of its answer.
func notFoundAfterWrite(op string) bool {
	switch op {
	case OpRegister, OpApprove, OpCommit, OpSetWorker:
		return true
	}
	return false
}

// refusalFits says whether op may be refused with code in state s, without
// taking effect. code OK means "not recorded".
func refusalFits(op string, code codes.Code, s state) bool {
	switch code {
	case codes.OK:
		return true
	case codes.NotFound:
		// Every op reads the node first; NotFound there is "absent".
		// (GetNodes never answers NotFound: no guarantee to check.)
		return op == OpGet || !s.Exists
	case codes.PermissionDenied:
		if op == OpRegister {
			return s.Deleted // the workload's ticket and key are right
		}
	case codes.FailedPrecondition:
		switch op {
		case OpApprove, OpSetWorker:
			return s.Exists
		case OpCommit:
			return s.Exists && s.State == stateNew
		}
	case codes.Aborted:
		switch op {
		case OpApprove:
			return s.Exists && s.State == stateNew
		case OpCommit:
			return s.Exists && (s.State == stateStandby || s.State == stateUp)
		case OpSetWorker:
			return s.Exists && s.State == stateUp
		}
	}
	return true
}

// step returns the states op may leave behind in s, given its output;
// none if it cannot have happened in s.
func step(s state, in input, out output) []state {
	if strings.HasSuffix(in.Op, answerSuffix) {
		// The answer of an acknowledged write: a read of the record.
		if seen(s) == answerState(out) {
			return []state{s}
		}
		return nil
	}
	switch out.Outcome {
	case OutcomeOK:
		if in.Op == OpGet {
			if seen(s) == answerState(out) {
				return []state{s}
			}
			return nil
		}
		if next, ok := effect(in.Op, in.Worker, s); ok {
			return []state{next}
		}
		return nil
	case OutcomeRefused:
		var next []state
		if refusalFits(in.Op, out.Code, s) {
			next = append(next, s)
		}
		if (out.Code == codes.OK || out.Code == codes.NotFound) && notFoundAfterWrite(in.Op) {
			// Written, then the node was deleted before the answer.
			if after, ok := written(in.Op, in.Worker, s); ok {
				next = append(next, after)
			}
		}
		return next
	default: // unknown: happened or not (porcupine merges equal states)
		next := []state{s}
		if after, ok := written(in.Op, in.Worker, s); ok {
			next = append(next, after)
		}
		return next
	}
}

// answerState is the state a read that returned out saw.
func answerState(out output) state {
	if !out.Exists {
		return absent
	}
	return state{Exists: true, State: out.State, Worker: out.Worker}
}

func shortState(s string) string { return strings.TrimPrefix(s, "NODE_STATE_") }

func describeState(s state) string {
	if s.Deleted {
		return "deleted"
	}
	if !s.Exists {
		return "absent"
	}
	if s.Worker {
		return shortState(s.State) + "+worker"
	}
	return shortState(s.State)
}

func describeOperation(i, o interface{}) string {
	in, out := i.(input), o.(output)
	call := in.Op
	if in.Op == OpSetWorker {
		call = fmt.Sprintf("%s(%v)", in.Op, in.Worker)
	}
	if strings.HasSuffix(in.Op, answerSuffix) || (in.Op == OpGet && out.Outcome == OutcomeOK) {
		return fmt.Sprintf("%s → %s", call, describeState(answerState(out)))
	}
	switch out.Outcome {
	case OutcomeOK:
		return call + " → ok"
	case OutcomeRefused:
		if out.Code != codes.OK {
			return fmt.Sprintf("%s → refused (%s)", call, out.Code)
		}
		return call + " → refused"
	}
	return call + " → unknown"
}
