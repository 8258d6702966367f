package consensus

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"curia.dev/platform/fence"
)

// Sentinels for refusals the service decides itself. Handlers wrap them with
// the facts (which member, which node); toStatus maps them to gRPC codes.
var (
	errNotRunning    = errors.New("the local etcd member is not running")
	errBadRequest    = errors.New("invalid request")
	errRefused       = errors.New("refused")
	errStillMember   = errors.New("this node is still an etcd member")
	errCannotConfirm = errors.New("cannot confirm membership")
	errConflict      = errors.New("conflict")
	errNotFound      = errors.New("not found")
	// errChangePending: another membership change is in flight somewhere
	// in the cluster; retry once it finished.
	errChangePending = errors.New("a membership change is in flight")
	// errOutcomeUnknown: the member call of a change failed in a way that
	// does not say whether etcd applied it; the change stays pending.
	errOutcomeUnknown = errors.New("outcome of the membership change unknown")
	// errTryAgain: etcd refused for a reason that passes by itself.
	errTryAgain = errors.New("try again shortly")
)

// toStatus maps an error to a gRPC status at the API boundary, so that no
// etcd error ever reaches a client as Unknown. The message keeps the chain of
// what was being done.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
		return err
	}
	msg := err.Error()
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, msg)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, msg)
	case errors.Is(err, fence.ErrStale):
		return status.Error(codes.FailedPrecondition, msg)
	case errors.Is(err, errBadRequest):
		return status.Error(codes.InvalidArgument, msg)
	case errors.Is(err, errRefused), errors.Is(err, errStillMember):
		return status.Error(codes.FailedPrecondition, msg)
	case errors.Is(err, errNotFound):
		return status.Error(codes.NotFound, msg)
	case errors.Is(err, errConflict):
		return status.Error(codes.AlreadyExists, msg)
	case errors.Is(err, errChangePending), errors.Is(err, errFinishedElsewhere):
		return status.Error(codes.Aborted, msg)
	case errors.Is(err, errNotRunning), errors.Is(err, errCannotConfirm), errors.Is(err, errOutcomeUnknown), errors.Is(err, errTryAgain):
		return status.Error(codes.Unavailable, msg)
	}
	if code, ok := etcdCode(err); ok {
		return status.Error(code, msg)
	}
	// An etcd call that failed below etcd's own errors (e.g. a member that
	// is starting or stopping answered with the wrong protocol): retry.
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return status.Error(codes.Unavailable, msg)
	}
	return status.Error(codes.Internal, msg)
}

// etcdCode takes the code etcd itself gives its errors (too many learners and
// learner not ready are FailedPrecondition, lost leaders Unavailable, ...).
func etcdCode(err error) (codes.Code, bool) {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) && ee.Code() != codes.Unknown {
		return ee.Code(), true
	}
	if s, ok := status.FromError(errors.Unwrap(err)); ok && s.Code() != codes.Unknown && s.Code() != codes.OK {
		return s.Code(), true
	}
	return 0, false
}

// explain adds the operator's next step to etcd's terse membership errors.
func explain(err error, what string) error {
	switch {
	case errors.Is(err, rpctypes.ErrTooManyLearners):
		return fmt.Errorf("%s: another learner is still joining (etcd allows one learner at a time): promote or remove it first: %w", what, err)
	case errors.Is(err, rpctypes.ErrMemberLearnerNotReady):
		return fmt.Errorf("%s: the learner has not caught up with the leader yet: retry once it has: %w", what, err)
	case errors.Is(err, rpctypes.ErrUnhealthy):
		return fmt.Errorf("%s: etcd refuses for now: a quorum of voters has not been connected long enough (etcd wants 5s of contact after a membership change or restart) or the change would break quorum; retry shortly: %w", what, err)
	case errors.Is(err, rpctypes.ErrPeerURLExist):
		return fmt.Errorf("%s: another member already uses this peer URL: %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
