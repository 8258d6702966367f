package rpcerr_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"curia.dev/platform/rpcerr"
)

// wire is what a client sees: the status through its proto, as gRPC sends it.
func wire(t *testing.T, err error) error {
	t.Helper()
	st, ok := status.FromError(rpcerr.ToStatus(context.Background(), nil, "/test/Method", err))
	if !ok {
		t.Fatalf("ToStatus(%v) is not a status", err)
	}
	return status.FromProto(st.Proto()).Err()
}

func TestKindsOnTheWire(t *testing.T) {
	t.Parallel()
	notRunning := rpcerr.Unavailable.Sub("the local etcd member is not running")
	for _, tc := range []struct {
		name   string
		err    error
		code   codes.Code
		kind   *rpcerr.Kind
		reason string
		retry  time.Duration
	}{
		{"stale fence", fmt.Errorf("remove: %w", fmt.Errorf("%w: lease expired", rpcerr.FenceStale)), codes.FailedPrecondition, rpcerr.FenceStale, "FENCE_STALE", 0},
		{"not leader", rpcerr.NotLeader, codes.Unavailable, rpcerr.NotLeader, "NOT_LEADER", 0},
		{"conflict", fmt.Errorf("%w: node n1 changed", rpcerr.Conflict), codes.Aborted, rpcerr.Conflict, "CONFLICT", 0},
		{"change pending with retry", rpcerr.RetryAfter(fmt.Errorf("%w: add n2", rpcerr.ChangePending), 3*time.Second), codes.Aborted, rpcerr.ChangePending, "CHANGE_PENDING", 3 * time.Second},
		{"refinement keeps its kind", fmt.Errorf("%w (stopped)", notRunning), codes.Unavailable, rpcerr.Unavailable, "", 0},
		{"etcd learner not ready", fmt.Errorf("promote: %w", rpctypes.ErrMemberLearnerNotReady), codes.FailedPrecondition, rpcerr.LearnerPending, "LEARNER_PENDING", 500 * time.Millisecond},
		{"etcd's reconfiguration window", fmt.Errorf("remove: %w", rpctypes.ErrUnhealthy), codes.Unavailable, rpcerr.Unavailable, "", time.Second},
		{"etcd: too few started members", fmt.Errorf("remove: %w", rpctypes.ErrMemberNotEnoughStarted), codes.FailedPrecondition, rpcerr.QuorumAtRisk, "QUORUM_AT_RISK", 0},
		{"etcd no leader keeps etcd's code", fmt.Errorf("txn: %w", rpctypes.ErrNoLeader), codes.Unavailable, rpcerr.Unavailable, "", 0},
		{"deadline", fmt.Errorf("read: %w", context.DeadlineExceeded), codes.DeadlineExceeded, nil, "", 0},
		// An etcd that is stopping or between leaders: retry, not Internal
		// (the fault suite met "read heartbeats: etcdserver: server
		// stopped" answered as Internal).
		{"etcd stopped", fmt.Errorf("read heartbeats: %w", rpctypes.ErrStopped), codes.Unavailable, rpcerr.Unavailable, "", 0},
		{"etcd timeout", fmt.Errorf("read nodes: %w", rpctypes.ErrTimeout), codes.Unavailable, rpcerr.Unavailable, "", 0},
		{"etcd peer URL taken", fmt.Errorf("add: %w", rpctypes.ErrPeerURLExist), codes.AlreadyExists, rpcerr.Exists, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := wire(t, tc.err)
			if c := status.Code(got); c != tc.code {
				t.Fatalf("code %v, want %v (%v)", c, tc.code, got)
			}
			if !strings.Contains(status.Convert(got).Message(), tc.err.Error()) {
				t.Errorf("message %q lost %q", status.Convert(got).Message(), tc.err)
			}
			if r := rpcerr.Reason(got); r != tc.reason {
				t.Errorf("reason %q, want %q", r, tc.reason)
			}
			if tc.kind != nil && !rpcerr.Is(got, tc.kind) {
				t.Errorf("Is(%v, %v) = false", got, tc.kind)
			}
			d, ok := rpcerr.RetryDelay(got)
			if ok != (tc.retry > 0) || d != tc.retry {
				t.Errorf("retry delay %v %v, want %v", d, ok, tc.retry)
			}
		})
	}
}

func TestReasonsDoNotMatchOtherReasonsOfTheSameCode(t *testing.T) {
	t.Parallel()
	got := wire(t, fmt.Errorf("%w: quorum", rpcerr.QuorumAtRisk))
	for _, k := range []*rpcerr.Kind{rpcerr.FenceStale, rpcerr.LearnerPending, rpcerr.LeaseHeld} {
		if rpcerr.Is(got, k) {
			t.Errorf("a QUORUM_AT_RISK status matches %v", k)
		}
	}
	// A kind without a reason matches by code.
	if !rpcerr.Is(got, rpcerr.Refused) {
		t.Errorf("a FailedPrecondition status does not match Refused")
	}
}

func TestLeaseHeldCarriesHolderAndExpiry(t *testing.T) {
	t.Parallel()
	exp := time.Now().Add(7 * time.Second)
	got := wire(t, rpcerr.LeaseHeldBy("reconciler", "r-2", exp))
	if !rpcerr.Is(got, rpcerr.LeaseHeld) {
		t.Fatalf("not LEASE_HELD: %v", got)
	}
	if h := rpcerr.Meta(got, "holder"); h != "r-2" {
		t.Errorf("holder %q", h)
	}
	if e, err := time.Parse(time.RFC3339Nano, rpcerr.Meta(got, "expires")); err != nil || !e.Equal(exp.UTC()) {
		t.Errorf("expires %q (%v), want %v", rpcerr.Meta(got, "expires"), err, exp.UTC())
	}
	if d, ok := rpcerr.RetryDelay(got); !ok || d <= 0 || d > 7*time.Second {
		t.Errorf("retry delay %v %v, want (0, 7s]", d, ok)
	}
}

func TestInternalHidesTheChainAndLogsIt(t *testing.T) {
	t.Parallel()
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	secret := errors.New("open /var/lib/curia/secret.key: permission denied")
	got := rpcerr.ToStatus(context.Background(), log, "/curia.Test/Do", fmt.Errorf("load: %w", secret))
	st := status.Convert(got)
	if st.Code() != codes.Internal {
		t.Fatalf("code %v, want Internal", st.Code())
	}
	if strings.Contains(st.Message(), "secret.key") {
		t.Fatalf("the client sees the error chain: %q", st.Message())
	}
	_, id, ok := strings.Cut(st.Message(), "correlation id ")
	id, _, _ = strings.Cut(id, ":")
	if !ok || len(id) != 16 {
		t.Fatalf("no correlation id in %q", st.Message())
	}
	if line := logged.String(); !strings.Contains(line, "correlation_id="+id) || !strings.Contains(line, "secret.key") || !strings.Contains(line, "/curia.Test/Do") {
		t.Fatalf("the log does not have the error under id %s: %s", id, line)
	}
}

func TestUnexplainedErrorsAreInternal(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		errors.New("something else"),
		fmt.Errorf("decode: %w", errors.New("unexpected EOF")),
	} {
		if c := status.Code(wire(t, err)); c != codes.Internal {
			t.Errorf("%v became %v, want Internal", err, c)
		}
	}
}

func TestStatusFromBelowKeepsItsDetails(t *testing.T) {
	t.Parallel()
	// A consensus service refused; the curator wraps its answer.
	below := wire(t, rpcerr.RetryAfter(fmt.Errorf("%w: member 1 has not caught up", rpcerr.LearnerPending), 2*time.Second))
	got := wire(t, fmt.Errorf("promote via consensus at 127.0.0.1:7001: %w", below))
	if !rpcerr.Is(got, rpcerr.LearnerPending) || status.Code(got) != codes.FailedPrecondition {
		t.Fatalf("lost the reason from below: %v", got)
	}
	if d, _ := rpcerr.RetryDelay(got); d != 2*time.Second {
		t.Errorf("retry delay %v, want 2s", d)
	}
	if !strings.Contains(status.Convert(got).Message(), "127.0.0.1:7001") {
		t.Errorf("message lost the context: %q", status.Convert(got).Message())
	}
	// A status without a code failed below the service: retry.
	if c := status.Code(wire(t, fmt.Errorf("x: %w", status.Error(codes.Unknown, "bad protocol")))); c != codes.Unavailable {
		t.Errorf("Unknown from below became %v, want Unavailable", c)
	}
	// The service below refused this server's certificate (etcd, a
	// deleted node's revoked member certificate): the caller is not at
	// fault and another replica may answer.
	for _, code := range []codes.Code{codes.Unauthenticated, codes.PermissionDenied} {
		got := wire(t, fmt.Errorf("read membership epoch: %w", status.Error(code, "certificate 1f is revoked")))
		if status.Code(got) != codes.Unavailable || !strings.Contains(status.Convert(got).Message(), "revoked") {
			t.Errorf("%v from below became %v, want Unavailable with the reason", code, got)
		}
	}
	// The caller's own refusal (a status as such) stays what it is.
	if c := status.Code(wire(t, status.Error(codes.PermissionDenied, "not for you"))); c != codes.PermissionDenied {
		t.Errorf("a refusal of the caller became %v", c)
	}
}

func TestRetryable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{wire(t, rpcerr.NotLeader), true},
		{wire(t, fmt.Errorf("%w: x", rpcerr.Conflict)), true},
		{wire(t, fmt.Errorf("%w: x", rpcerr.Refused)), false},
		{wire(t, rpcerr.RetryAfter(fmt.Errorf("%w: x", rpcerr.LearnerPending), time.Second)), true},
		{wire(t, fmt.Errorf("%w: x", rpcerr.QuorumAtRisk)), false},
		{wire(t, fmt.Errorf("%w: x", rpcerr.Invalid)), false},
		{nil, false},
	} {
		if got := rpcerr.Retryable(tc.err); got != tc.want {
			t.Errorf("Retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
