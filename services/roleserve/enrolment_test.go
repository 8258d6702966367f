package roleserve

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
)

// TestPlanBootstrap: the bootstrap step's plan for every local consensus
// state, with no record, a begun bootstrap, and a confirmed member. An
// empty local consensus is bootstrapped only when nothing was ever begun.
func TestPlanBootstrap(t *testing.T) {
	begun := &bootstrapRecord{Begun: time.Now()}
	confirmed := &bootstrapRecord{Begun: time.Now(), MemberID: "b001", ClusterID: "c1", Confirmed: time.Now()}
	st := func(s consensusv1.LifecycleState, member, cluster uint64) *consensusv1.StatusResponse {
		return &consensusv1.StatusResponse{NodeId: testNode, State: s, MemberId: member, ClusterId: cluster}
	}
	tests := map[string]struct {
		rec  *bootstrapRecord
		st   *consensusv1.StatusResponse
		step bootstrapStep
		says string // of a permanent error ("": no error)
	}{
		"new node, empty consensus: start":      {st: st(idle, 0, 0), step: bootstrapStart},
		"new node, a failed start: start again": {st: st(failed, 0, 0), step: bootstrapStart},
		"new node, a member runs: record it":    {st: st(running, 0xb001, 0xc1), step: bootstrapRunning},
		"new node, starting: wait":              {st: st(starting, 0, 0), step: bootstrapWait},
		"begun, empty consensus: refused": {
			rec: begun, st: st(idle, 0, 0), says: "never saw its member run",
		},
		"begun, a failed start: start again":                        {rec: begun, st: st(failed, 0, 0), step: bootstrapStart},
		"begun, stopped: start again (refused while it holds data)": {rec: begun, st: st(stopped, 0xb001, 0), step: bootstrapStart},
		"begun, the member runs: record it":                         {rec: begun, st: st(running, 0xb001, 0xc1), step: bootstrapRunning},
		"begun, starting: wait":                                     {rec: begun, st: st(starting, 0, 0), step: bootstrapWait},
		"confirmed, empty consensus: refused": {
			rec: confirmed, st: st(idle, 0, 0), says: "refusing to bootstrap a second cluster: this node bootstrapped the cluster as etcd member b001 of cluster c1",
		},
		"confirmed, the member runs: go on":         {rec: confirmed, st: st(running, 0xb001, 0xc1), step: bootstrapRunning},
		"confirmed, stopped: wait, never start":     {rec: confirmed, st: st(stopped, 0xb001, 0), step: bootstrapWait},
		"confirmed, failed: wait, never start":      {rec: confirmed, st: st(failed, 0, 0), step: bootstrapWait},
		"confirmed, restarting from its data: wait": {rec: confirmed, st: st(starting, 0xb001, 0), step: bootstrapWait},
		"confirmed, another member runs: refused": {
			rec: confirmed, st: st(running, 0xb002, 0xc1), says: "runs etcd member b002 of cluster c1, but this node bootstrapped the cluster as member b001",
		},
		"confirmed, another cluster runs: refused": {
			rec: confirmed, st: st(running, 0xb001, 0xc2), says: "of cluster c2",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			step, err := planBootstrap(tc.rec, tc.st)
			if tc.says != "" {
				if !isPermanent(err) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("planBootstrap: %v, want a permanent error saying %q", err, tc.says)
				}
				return
			}
			if err != nil || step != tc.step {
				t.Fatalf("planBootstrap: %v %v, want %v", step, err, tc.step)
			}
		})
	}
}

// TestBootstrapLocal runs the bootstrap step against a fake consensus
// through its crash windows: the start is on disk before Start is called,
// the member before the step returns, and after a crash anywhere followed
// by the loss of the consensus data the step refuses for good and never
// calls Start again.
func TestBootstrapLocal(t *testing.T) {
	ctx := context.Background()
	t.Run("the start is recorded before Start, the member after", func(t *testing.T) {
		m, path := machineIn(t, StateBootstrapping)
		f := newFake(idle, 0)
		f.onStart = func() {
			if b := reload(t, path).bootstrap(); b == nil || b.Begun.IsZero() || b.confirmed() {
				t.Fatalf("at Start the record on disk is %+v, want the start begun", b)
			}
		}
		st, err := bootstrapLocal(ctx, m, f, testNode, "consensus", discard)
		if err != nil || st.GetMemberId() != 0xb001 {
			t.Fatalf("bootstrapLocal: %v %v", st, err)
		}
		if b := reload(t, path).bootstrap(); !b.confirmed() || b.MemberID != "b001" || b.ClusterID != "c1" {
			t.Fatalf("record %+v", b)
		}
		if !slices.Equal(f.calls, []string{"start"}) {
			t.Fatalf("calls %v", f.calls)
		}
	})
	t.Run("crash after Start, data kept: the running member is recorded", func(t *testing.T) {
		m, path := machineIn(t, StateBootstrapping)
		f := newFake(idle, 0)
		crashAfterStart(t, m, f)
		st, err := bootstrapLocal(ctx, reload(t, path), f, testNode, "consensus", discard)
		if err != nil || st.GetMemberId() != 0xb001 || !slices.Equal(f.calls, []string{"start"}) {
			t.Fatalf("bootstrapLocal: %v %v, calls %v", st, err, f.calls)
		}
		if b := reload(t, path).bootstrap(); b.MemberID != "b001" {
			t.Fatalf("record %+v", b)
		}
	})
	// Each crash, then the consensus data is lost: never a second
	// bootstrap.
	crashes := map[string]func(*testing.T, *machine, *fakeConsensus){
		"crash between the record and Start": func(t *testing.T, m *machine, f *fakeConsensus) {
			ctx, cancel := context.WithCancel(context.Background())
			f.onStart = func() { cancel() }
			f.startErr = status.Error(codes.Canceled, "crash")
			if _, err := bootstrapLocal(ctx, m, f, testNode, "consensus", discard); err == nil {
				t.Fatal("bootstrapLocal went on after the crash")
			}
			f.onStart, f.startErr = nil, nil
		},
		"crash after Start, before the member was recorded": crashAfterStart,
		"crash after the member was recorded": func(t *testing.T, m *machine, f *fakeConsensus) {
			if _, err := bootstrapLocal(context.Background(), m, f, testNode, "consensus", discard); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, crash := range crashes {
		t.Run(name+", then the data is lost: refused", func(t *testing.T) {
			m, path := machineIn(t, StateBootstrapping)
			f := newFake(idle, 0)
			crash(t, m, f)
			f.st, f.calls = &consensusv1.StatusResponse{NodeId: testNode, State: idle}, nil
			_, err := bootstrapLocal(ctx, reload(t, path), f, testNode, "consensus", discard)
			if !isPermanent(err) || !strings.Contains(err.Error(), "refusing to bootstrap a second cluster") {
				t.Fatalf("bootstrapLocal: %v", err)
			}
			if len(f.calls) != 0 {
				t.Fatalf("calls %v", f.calls)
			}
		})
	}
	t.Run("a failed start is retried", func(t *testing.T) {
		m, _ := machineIn(t, StateBootstrapping)
		f := newFake(idle, 0)
		f.startErr = status.Error(codes.Internal, "etcd failed: listen: address in use")
		f.onStart = func() { f.st.State = failed }
		if _, err := bootstrapLocal(ctx, m, f, testNode, "consensus", discard); err == nil || isPermanent(err) {
			t.Fatalf("first attempt: %v", err)
		}
		f.startErr, f.onStart = nil, nil
		if _, err := bootstrapLocal(ctx, m, f, testNode, "consensus", discard); err != nil || !slices.Equal(f.calls, []string{"start", "start"}) {
			t.Fatalf("second attempt: %v, calls %v", err, f.calls)
		}
	})
	t.Run("no Start without the record on disk", func(t *testing.T) {
		m, _ := machineIn(t, StateBootstrapping)
		m.path = filepath.Join(t.TempDir(), "gone", "enrolment.json")
		f := newFake(idle, 0)
		if _, err := bootstrapLocal(ctx, m, f, testNode, "consensus", discard); err == nil || len(f.calls) != 0 {
			t.Fatalf("bootstrapLocal: %v, calls %v", err, f.calls)
		}
	})
	t.Run("another node's consensus", func(t *testing.T) {
		m, _ := machineIn(t, StateBootstrapping)
		f := newFake(idle, 0)
		f.st.NodeId = "node-ffffffffffffffffffffffffffffffff"
		if _, err := bootstrapLocal(ctx, m, f, testNode, "consensus", discard); status.Code(err) != codes.FailedPrecondition || len(f.calls) != 0 {
			t.Fatalf("bootstrapLocal: %v, calls %v", err, f.calls)
		}
	})
}

// crashAfterStart runs the bootstrap step until Start has created the
// member, and crashes there: before the step saw Start's answer.
func crashAfterStart(t *testing.T, m *machine, f *fakeConsensus) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f.onStart = func() {
		f.st = &consensusv1.StatusResponse{NodeId: testNode, State: running, MemberId: f.bootstrapAs, ClusterId: f.clusterAs}
		cancel()
	}
	f.startErr = status.Error(codes.Canceled, "crash")
	if _, err := bootstrapLocal(ctx, m, f, testNode, "consensus", discard); err == nil {
		t.Fatal("the crashed step succeeded")
	}
	f.onStart, f.startErr = nil, nil
	if f.st.GetState() != running {
		t.Fatalf("the member was not created: %v", f.st)
	}
	if b := m.bootstrap(); b == nil || b.confirmed() {
		t.Fatalf("record %+v after a crash before the member was recorded", b)
	}
}
