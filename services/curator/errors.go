package curator

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"curia.dev/platform/fence"
)

// Sentinels: handlers wrap them with the facts; toStatus maps them to gRPC
// codes, in this one place.
var (
	errNotLeader   = errors.New("not leader")
	errConflict    = errors.New("the record changed while this call ran")
	errBadRequest  = errors.New("invalid request")
	errNotFound    = errors.New("not found")
	errRefused     = errors.New("refused")
	errDenied      = errors.New("permission denied")
	errUnavailable = errors.New("unavailable")
	errStale       = errors.New("stale")
	// errCorrupt: a stored record does not decode. Not Internal: nothing in
	// the server failed; the data did (DataLoss), and the message names the
	// key.
	errCorrupt = errors.New("corrupt record")
	// errExhausted: a rate limit; retry later.
	errExhausted = errors.New("too many calls")
)

func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return err
	}
	msg := err.Error()
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, msg)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, msg)
	case errors.Is(err, errNotLeader), errors.Is(err, errNoLeader), errors.Is(err, errUnavailable):
		return status.Error(codes.Unavailable, msg)
	case errors.Is(err, errBadRequest):
		return status.Error(codes.InvalidArgument, msg)
	case errors.Is(err, errNotFound):
		return status.Error(codes.NotFound, msg)
	case errors.Is(err, errRefused):
		return status.Error(codes.FailedPrecondition, msg)
	case errors.Is(err, errDenied):
		return status.Error(codes.PermissionDenied, msg)
	case errors.Is(err, errCorrupt):
		return status.Error(codes.DataLoss, msg)
	case errors.Is(err, errExhausted):
		return status.Error(codes.ResourceExhausted, msg)
	case errors.Is(err, errStale), errors.Is(err, fence.ErrStale), errors.Is(err, errConflict):
		return status.Error(codes.Aborted, msg)
	}
	// etcd's own errors carry a code but no gRPC status: one that says
	// etcd is unreachable for now (stopped, no leader, timed out) is
	// Unavailable, worth a retry; the others stay Internal.
	// (consensus's etcdCode passes every etcd code on; the curator is not
	// etcd's front, so only this one.)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) && ee.Code() == codes.Unavailable {
		return status.Error(codes.Unavailable, msg)
	}
	// An error a consensus service returned keeps its code. One without a
	// code failed below the call (an etcd member starting or stopping
	// answered with the wrong protocol, as consensus's toStatus says too):
	// retry.
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		if c := se.GRPCStatus().Code(); c != codes.Unknown {
			return status.Error(c, msg)
		}
		return status.Error(codes.Unavailable, msg)
	}
	return status.Error(codes.Internal, msg)
}
