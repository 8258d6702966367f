package roleserve

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	consensusv1 "curia.dev/gen/curia/consensus/v1"
)

const (
	idle     = consensusv1.LifecycleState_LIFECYCLE_STATE_IDLE
	starting = consensusv1.LifecycleState_LIFECYCLE_STATE_STARTING
	running  = consensusv1.LifecycleState_LIFECYCLE_STATE_RUNNING
	stopped  = consensusv1.LifecycleState_LIFECYCLE_STATE_STOPPED
	failed   = consensusv1.LifecycleState_LIFECYCLE_STATE_FAILED
)

// fakeConsensus is a local consensus service that keeps the rules the
// agent relies on: Start leaves a running member alone and refuses while
// it holds another member's data, Leave wipes. Answers can be forced.
type fakeConsensus struct {
	st    *consensusv1.StatusResponse
	calls []string
	// leaveErr and startErr, when set, are the answers of Leave and Start.
	leaveErr, startErr error
	// onStart runs when Start is called, before it does anything.
	onStart func()
	// bootstrapAs is the member and cluster a bootstrap creates.
	bootstrapAs, clusterAs uint64
}

func newFake(state consensusv1.LifecycleState, member uint64) *fakeConsensus {
	return &fakeConsensus{st: &consensusv1.StatusResponse{NodeId: testNode, State: state, MemberId: member}, bootstrapAs: 0xb001, clusterAs: 0xc1}
}

func (f *fakeConsensus) Status(context.Context, *consensusv1.StatusRequest, ...grpc.CallOption) (*consensusv1.StatusResponse, error) {
	return proto.Clone(f.st).(*consensusv1.StatusResponse), nil
}

func (f *fakeConsensus) Start(_ context.Context, req *consensusv1.StartRequest, _ ...grpc.CallOption) (*consensusv1.StartResponse, error) {
	f.calls = append(f.calls, "start")
	if f.onStart != nil {
		f.onStart()
	}
	if f.startErr != nil {
		return nil, f.startErr
	}
	switch f.st.State {
	case running, starting:
		return &consensusv1.StartResponse{Status: f.st, AlreadyStarted: true}, nil
	case stopped, failed:
		if f.st.MemberId != 0 {
			return nil, status.Error(codes.FailedPrecondition, "this node holds data of another member: call Leave to wipe it before starting anew")
		}
	}
	f.st = &consensusv1.StatusResponse{NodeId: testNode, State: running, MemberId: req.GetJoin().GetMemberId(), ClusterId: f.clusterAs, Learner: req.GetJoin() != nil}
	if req.GetBootstrap() != nil {
		f.st.MemberId = f.bootstrapAs
	}
	return &consensusv1.StartResponse{Status: f.st}, nil
}

func (f *fakeConsensus) Leave(context.Context, *consensusv1.LeaveRequest, ...grpc.CallOption) (*consensusv1.LeaveResponse, error) {
	f.calls = append(f.calls, "leave")
	if f.leaveErr != nil {
		return nil, f.leaveErr
	}
	f.st = &consensusv1.StatusResponse{NodeId: testNode, State: idle}
	return &consensusv1.LeaveResponse{}, nil
}

func (f *fakeConsensus) SetCredentials(context.Context, *consensusv1.SetCredentialsRequest, ...grpc.CallOption) (*consensusv1.SetCredentialsResponse, error) {
	f.calls = append(f.calls, "set-credentials")
	return &consensusv1.SetCredentialsResponse{Status: f.st}, nil
}

// TestJoinAs: the launcher's join acts on the member id the role names: a
// local consensus holding another member's data leaves first (and nothing
// starts while consensus refuses that), the desired member is left alone.
func TestJoinAs(t *testing.T) {
	const memberA, memberB = 0xa, 0xb
	stillMember := status.Error(codes.FailedPrecondition, "this node is still an etcd member: member a")
	tests := map[string]struct {
		fake     *fakeConsensus
		calls    []string
		code     codes.Code // of the error; OK: none
		leaveErr bool       // the error is a Leave a join needs first
		runs     uint64     // member running afterwards (0: none)
	}{
		"empty: start":                         {fake: newFake(idle, 0), calls: []string{"start"}, runs: memberB},
		"the role's member runs: left alone":   {fake: newFake(running, memberB), calls: []string{"start"}, runs: memberB},
		"the role's member starts: left alone": {fake: newFake(starting, memberB), calls: []string{"start"}},
		"another member stopped (removed): leave, then start": {
			fake: newFake(stopped, memberA), calls: []string{"leave", "start"}, runs: memberB,
		},
		"another member failed: leave, then start": {
			fake: newFake(failed, memberA), calls: []string{"leave", "start"}, runs: memberB,
		},
		"another member runs: leave (consensus decides), then start": {
			fake: newFake(running, memberA), calls: []string{"leave", "start"}, runs: memberB,
		},
		"another member still in etcd: Leave refused, nothing starts": {
			fake:  func() *fakeConsensus { f := newFake(stopped, memberA); f.leaveErr = stillMember; return f }(),
			calls: []string{"leave"}, code: codes.FailedPrecondition, leaveErr: true,
		},
		"another member still in etcd while it runs: Leave refused, it runs on": {
			fake:  func() *fakeConsensus { f := newFake(running, memberA); f.leaveErr = stillMember; return f }(),
			calls: []string{"leave"}, code: codes.FailedPrecondition, leaveErr: true, runs: memberA,
		},
		"another member restarting from its data: wait": {
			fake: newFake(starting, memberA), calls: nil, code: codes.Unavailable,
		},
		"another member started meanwhile: retried": {
			fake: func() *fakeConsensus {
				f := newFake(idle, 0)
				f.onStart = func() { f.st = &consensusv1.StatusResponse{NodeId: testNode, State: running, MemberId: memberA} }
				return f
			}(),
			calls: []string{"start"}, code: codes.Aborted, runs: memberA,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := tc.fake
			err := joinAs(context.Background(), f, proto.Clone(f.st).(*consensusv1.StatusResponse), &consensusv1.JoinParameters{MemberId: memberB}, discard)
			if status.Code(err) != tc.code || errors.Is(err, errLeaveFirst) != tc.leaveErr {
				t.Fatalf("joinAs: %v (code %v), want code %v, leave first %v", err, status.Code(err), tc.code, tc.leaveErr)
			}
			if !slices.Equal(f.calls, tc.calls) {
				t.Fatalf("calls %v, want %v", f.calls, tc.calls)
			}
			runs := uint64(0)
			if f.st.State == running {
				runs = f.st.MemberId
			}
			if runs != tc.runs {
				t.Fatalf("local consensus %v, want member %x running", f.st, tc.runs)
			}
			if tc.leaveErr && (!strings.Contains(err.Error(), "member a,") || !strings.Contains(err.Error(), "still an etcd member")) {
				t.Fatalf("the error does not say which member and why: %v", err)
			}
		})
	}
}
