package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const n1 = "node-00000000000000000000000000000001"

func ok() Result { return Result{Outcome: OutcomeOK} }

func rec(state string, worker bool) Result {
	return Result{Outcome: OutcomeOK, Exists: true, State: "NODE_STATE_" + state, Worker: worker}
}

func refused(c codes.Code) Result { return Result{Outcome: OutcomeRefused, Code: c} }

func unknown() Result { return Result{Outcome: OutcomeUnknown} }

// op is one hand-built call.
type op struct {
	client    int
	name      string
	worker    bool
	call, ret int64
	r         Result
}

func history(node string, ops ...op) *History {
	h := &History{}
	for _, o := range ops {
		h.add(o.client, o.name, node, o.worker, o.call, o.ret, o.r)
	}
	return h
}

func check(t *testing.T, h *History, want porcupine.CheckResult) Verdict {
	t.Helper()
	v, err := Check(h, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if v.Result != want {
		t.Fatalf("verdict %s, want %s", v, want)
	}
	return v
}

// up is a node registered, approved and committed, ending at time 60.
func up() []op {
	return []op{
		{0, OpRegister, false, 0, 10, rec("NEW", false)},
		{0, OpApprove, false, 20, 30, rec("STANDBY", false)},
		{0, OpCommit, false, 40, 50, rec("UP", false)},
		{0, OpGet, false, 55, 60, rec("UP", false)},
	}
}

func TestSequentialLegal(t *testing.T) {
	h := history(n1,
		op{0, OpGet, false, 0, 1, Result{Outcome: OutcomeOK}},
		op{0, OpApprove, false, 2, 3, refused(codes.NotFound)},
		op{0, OpCommit, false, 4, 5, refused(codes.NotFound)},
		op{0, OpSetWorker, true, 6, 7, refused(codes.NotFound)},
		op{0, OpDelete, false, 8, 9, refused(codes.NotFound)},
		op{0, OpRegister, false, 10, 20, rec("NEW", false)},
		op{0, OpRegister, false, 21, 22, rec("NEW", false)}, // idempotent
		op{0, OpCommit, false, 23, 24, refused(codes.FailedPrecondition)},
		op{0, OpSetWorker, true, 25, 26, refused(codes.FailedPrecondition)},
		op{0, OpApprove, false, 30, 40, rec("STANDBY", false)},
		op{0, OpApprove, false, 41, 42, rec("STANDBY", false)}, // left alone
		op{0, OpCommit, false, 50, 60, rec("UP", false)},
		op{0, OpCommit, false, 61, 62, rec("UP", false)}, // again: a new certificate
		op{0, OpRegister, false, 63, 64, rec("UP", false)},
		op{0, OpSetWorker, true, 70, 80, rec("UP", true)},
		op{0, OpGet, false, 90, 100, rec("UP", true)},
		op{0, OpCommit, false, 101, 102, rec("UP", true)}, // keeps the role
		op{0, OpSetWorker, false, 110, 120, rec("UP", false)},
		op{0, OpDelete, false, 130, 140, ok()},
		op{0, OpGet, false, 150, 160, Result{Outcome: OutcomeOK}},
		op{0, OpRegister, false, 170, 180, refused(codes.PermissionDenied)}, // tombstoned
		op{0, OpGet, false, 190, 200, Result{Outcome: OutcomeOK}},
		op{0, OpGet, false, 201, 202, refused(codes.InvalidArgument)},
		op{0, OpGet, false, 203, 204, unknown()},
	)
	v := check(t, h, porcupine.Ok)
	if !v.OK() || v.Ops != 24 || v.Unknown != 1 || !strings.HasPrefix(v.String(), "linearizable") {
		t.Errorf("verdict %+v %q", v, v)
	}
}

func TestStaleReadIllegal(t *testing.T) {
	h := history(n1,
		op{0, OpRegister, false, 0, 10, rec("NEW", false)},
		op{1, OpGet, false, 20, 30, Result{Outcome: OutcomeOK}}, // absent
	)
	viz := filepath.Join(t.TempDir(), "viz.html")
	v, err := Check(h, 0, viz)
	if err != nil {
		t.Fatal(err)
	}
	if v.OK() || v.Result != porcupine.Illegal || !strings.HasPrefix(v.String(), "NOT linearizable") {
		t.Fatalf("verdict %s, want NOT linearizable", v)
	}
	b, err := os.ReadFile(viz)
	if err != nil {
		t.Fatalf("visualization: %v", err)
	}
	if !strings.Contains(string(b), "<html") || !strings.Contains(string(b), "register") {
		t.Errorf("visualization (%d bytes) does not look like porcupine's HTML with the history", len(b))
	}

	// The same read concurrent with the register is fine, and no file.
	h = history(n1,
		op{0, OpRegister, false, 0, 10, rec("NEW", false)},
		op{1, OpGet, false, 5, 30, Result{Outcome: OutcomeOK}},
	)
	viz2 := filepath.Join(t.TempDir(), "viz.html")
	if v, err := Check(h, 0, viz2); err != nil || !v.OK() {
		t.Fatalf("concurrent read: %s, %v", v, err)
	}
	if _, err := os.Stat(viz2); !os.IsNotExist(err) {
		t.Errorf("visualization written for a linearizable history: %v", err)
	}
}

func TestUnknownRegister(t *testing.T) {
	reg := op{0, OpRegister, false, 0, 10, unknown()}
	t.Run("seen", func(t *testing.T) {
		v := check(t, history(n1, reg, op{1, OpGet, false, 20, 30, rec("NEW", false)}), porcupine.Ok)
		if v.Unknown != 1 {
			t.Errorf("unknown %d, want 1", v.Unknown)
		}
	})
	t.Run("not seen", func(t *testing.T) {
		check(t, history(n1, reg, op{1, OpGet, false, 20, 30, Result{Outcome: OutcomeOK}}), porcupine.Ok)
	})
	t.Run("seen late", func(t *testing.T) {
		// It may take effect any time after its call.
		check(t, history(n1, reg,
			op{1, OpGet, false, 20, 30, Result{Outcome: OutcomeOK}},
			op{1, OpGet, false, 40, 50, rec("NEW", false)}), porcupine.Ok)
	})
	t.Run("seen, then gone", func(t *testing.T) {
		// But it happens once: the node does not vanish without a delete.
		check(t, history(n1, reg,
			op{1, OpGet, false, 20, 30, rec("NEW", false)},
			op{1, OpGet, false, 40, 50, Result{Outcome: OutcomeOK}}), porcupine.Illegal)
	})
	t.Run("never returned", func(t *testing.T) {
		h := &History{}
		h.Begin(0, OpRegister, n1, false) // its finish is never called
		h.Begin(1, OpGet, n1, false)(rec("NEW", false))
		if h.Len() != 2 {
			t.Fatalf("Len %d", h.Len())
		}
		v := check(t, h, porcupine.Ok)
		if v.Unknown != 1 {
			t.Errorf("unknown %d, want 1", v.Unknown)
		}
	})
}

func TestConcurrentEitherOrder(t *testing.T) {
	for _, last := range []bool{true, false} {
		t.Run(fmt.Sprintf("worker=%v", last), func(t *testing.T) {
			h := history(n1, append(up(),
				op{1, OpSetWorker, true, 100, 130, rec("UP", true)},
				op{2, OpSetWorker, false, 110, 140, rec("UP", false)},
				op{3, OpGet, false, 150, 160, rec("UP", last)},
			)...)
			check(t, h, porcupine.Ok)
		})
	}
	t.Run("delete and register", func(t *testing.T) {
		// A register concurrent with a delete that answers with the
		// existing record, then a read that sees nothing: register first.
		check(t, history(n1, append(up(),
			op{1, OpDelete, false, 100, 130, ok()},
			op{2, OpRegister, false, 110, 140, rec("UP", false)},
			op{3, OpGet, false, 150, 160, Result{Outcome: OutcomeOK}},
		)...), porcupine.Ok)
		// It never creates the node again after the delete: the id is
		// tombstoned.
		check(t, history(n1, append(up(),
			op{1, OpDelete, false, 100, 130, ok()},
			op{2, OpRegister, false, 110, 140, rec("NEW", false)},
			op{3, OpGet, false, 150, 160, rec("NEW", false)},
		)...), porcupine.Illegal)
		// Refused for the tombstone: only after the delete.
		check(t, history(n1, append(up(),
			op{1, OpDelete, false, 100, 130, ok()},
			op{2, OpRegister, false, 110, 140, refused(codes.PermissionDenied)},
		)...), porcupine.Ok)
		check(t, history(n1, append(up(),
			op{2, OpRegister, false, 100, 110, refused(codes.PermissionDenied)},
			op{1, OpDelete, false, 120, 130, ok()},
		)...), porcupine.Illegal)
	})
	t.Run("answer is a later read", func(t *testing.T) {
		// approve wrote STANDBY, a concurrent commit made it UP, and
		// approve's answer (a re-read) shows UP.
		check(t, history(n1,
			op{0, OpRegister, false, 0, 10, rec("NEW", false)},
			op{1, OpApprove, false, 20, 50, rec("UP", false)},
			op{2, OpCommit, false, 30, 40, rec("UP", false)},
		), porcupine.Ok)
	})
	t.Run("approve NotFound after its write", func(t *testing.T) {
		// approve wrote, a concurrent delete removed the node, and the
		// re-read found nothing; a commit in between saw STANDBY.
		check(t, history(n1,
			op{0, OpRegister, false, 0, 10, rec("NEW", false)},
			op{1, OpApprove, false, 20, 60, refused(codes.NotFound)},
			op{2, OpCommit, false, 25, 35, rec("UP", false)},
			op{3, OpDelete, false, 40, 50, ok()},
		), porcupine.Ok)
	})
}

func TestLostSetWorkerIllegal(t *testing.T) {
	h := history(n1, append(up(),
		op{1, OpSetWorker, true, 100, 110, rec("UP", true)},
		op{2, OpGet, false, 120, 130, rec("UP", false)},
	)...)
	check(t, h, porcupine.Illegal)
}

func TestRefusalsChecked(t *testing.T) {
	for _, tc := range []struct {
		name string
		last op
		want porcupine.CheckResult
	}{
		{"delete NotFound of an existing node", op{1, OpDelete, false, 100, 110, refused(codes.NotFound)}, porcupine.Illegal},
		{"approve NotFound of an UP node", op{1, OpApprove, false, 100, 110, refused(codes.NotFound)}, porcupine.Illegal},
		{"commit FailedPrecondition of an UP node", op{1, OpCommit, false, 100, 110, refused(codes.FailedPrecondition)}, porcupine.Illegal},
		{"approve Aborted of an UP node", op{1, OpApprove, false, 100, 110, refused(codes.Aborted)}, porcupine.Illegal},
		{"commit Aborted of an UP node", op{1, OpCommit, false, 100, 110, refused(codes.Aborted)}, porcupine.Ok},
		{"set-worker FailedPrecondition of an UP node", op{1, OpSetWorker, true, 100, 110, refused(codes.FailedPrecondition)}, porcupine.Ok},
		{"delete PermissionDenied", op{1, OpDelete, false, 100, 110, refused(codes.PermissionDenied)}, porcupine.Ok},
		{"delete refused, code not recorded", op{1, OpDelete, false, 100, 110, Result{Outcome: OutcomeRefused}}, porcupine.Ok},
		// The answer is a read at some point of the call: it may show the
		// record before the write, not a record that never was.
		{"set-worker answer from before the write", op{1, OpSetWorker, true, 100, 110, rec("UP", false)}, porcupine.Ok},
		{"set-worker answer that never was", op{1, OpSetWorker, false, 100, 110, rec("UP", true)}, porcupine.Illegal},
		{"commit answering STANDBY after UP", op{1, OpCommit, false, 100, 110, rec("STANDBY", false)}, porcupine.Illegal},
		{"register of an UP node answering NEW", op{1, OpRegister, false, 100, 110, rec("NEW", false)}, porcupine.Illegal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check(t, history(n1, append(up(), tc.last)...), tc.want)
		})
	}
	t.Run("refused delete has no effect", func(t *testing.T) {
		check(t, history(n1, append(up(),
			op{1, OpDelete, false, 100, 110, refused(codes.PermissionDenied)},
			op{1, OpGet, false, 120, 130, Result{Outcome: OutcomeOK}},
		)...), porcupine.Illegal)
	})
	t.Run("unknown delete may have an effect", func(t *testing.T) {
		check(t, history(n1, append(up(),
			op{1, OpDelete, false, 100, 110, unknown()},
			op{1, OpGet, false, 120, 130, Result{Outcome: OutcomeOK}},
		)...), porcupine.Ok)
	})
}

func TestPartitionedByNode(t *testing.T) {
	const n2 = "node-00000000000000000000000000000002"
	h := &History{}
	h.add(0, OpRegister, n1, false, 0, 10, rec("NEW", false))
	h.add(1, OpGet, n2, false, 20, 30, Result{Outcome: OutcomeOK})
	check(t, h, porcupine.Ok)
	h.add(1, OpGet, n1, false, 20, 30, Result{Outcome: OutcomeOK})
	check(t, h, porcupine.Illegal)
}

func TestCheckUnknownOp(t *testing.T) {
	h := history(n1, op{0, "frobnicate", false, 0, 1, ok()})
	if _, err := Check(h, 0, ""); err == nil {
		t.Fatal("no error for an unknown op")
	}
}

func TestBeginConcurrent(t *testing.T) {
	h := &History{}
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				finish := h.Begin(c, OpGet, n1, false)
				finish(Result{Outcome: OutcomeOK})
				finish(rec("UP", true)) // ignored: only the first counts
			}
		}()
	}
	wg.Wait()
	if h.Len() != 400 {
		t.Fatalf("Len %d, want 400", h.Len())
	}
	for _, e := range h.snapshot() {
		if e.ret < e.call || e.result.Exists {
			t.Fatalf("entry %+v", e)
		}
	}
	check(t, h, porcupine.Ok)
}

func TestVerdictString(t *testing.T) {
	v := Verdict{Result: porcupine.Unknown, Ops: 3, Unknown: 1}
	if !v.OK() || !strings.HasPrefix(v.String(), "unknown (checker timed out)") {
		t.Errorf("timed out: OK %v, %q", v.OK(), v)
	}
}

func TestOutcomeOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Outcome
	}{
		{nil, OutcomeOK},
		{status.Error(codes.NotFound, "x"), OutcomeRefused},
		{status.Error(codes.FailedPrecondition, "x"), OutcomeRefused},
		{status.Error(codes.Aborted, "x"), OutcomeRefused},
		{status.Error(codes.AlreadyExists, "x"), OutcomeRefused},
		{status.Error(codes.InvalidArgument, "x"), OutcomeRefused},
		{status.Error(codes.PermissionDenied, "x"), OutcomeRefused},
		{status.Error(codes.Unauthenticated, "x"), OutcomeRefused},
		{status.Error(codes.Unavailable, "x"), OutcomeUnknown},
		{status.Error(codes.DeadlineExceeded, "x"), OutcomeUnknown},
		{status.Error(codes.Canceled, "x"), OutcomeUnknown},
		{status.Error(codes.Internal, "x"), OutcomeUnknown},
		{status.Error(codes.Unknown, "x"), OutcomeUnknown},
		{status.Error(codes.ResourceExhausted, "x"), OutcomeUnknown},
		{fmt.Errorf("wrapped: %w", status.Error(codes.NotFound, "x")), OutcomeRefused},
		{errors.New("not a status"), OutcomeUnknown},
		{context.DeadlineExceeded, OutcomeUnknown},
	} {
		if got := OutcomeOf(tc.err); got != tc.want {
			t.Errorf("OutcomeOf(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}
