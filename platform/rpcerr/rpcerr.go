// Package rpcerr is curia's one error model at the gRPC boundary.
//
// A handler says what went wrong by wrapping one of the kinds below (or a
// service's own refinement of one, made with Kind.Sub) with the facts:
//
//	return fmt.Errorf("%w: lease %s expired: acquire again", rpcerr.FenceStale, name)
//
// and the server's error interceptor (platform/rpc) turns it into a status
// with ToStatus: the kind's code, the whole message, and for kinds a caller
// branches on a google.rpc.ErrorInfo with the kind's reason (domain
// "curia.dev") plus any metadata added with With; RetryAfter adds a
// google.rpc.RetryInfo. An error no kind, context or etcd code explains is a
// bug: the client gets Internal with a correlation id, the server's log the
// error under the same id.
//
// Callers branch with Is (a reason or, for kinds without one, a code),
// RetryDelay and Retryable, never on message text.
package rpcerr

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain of every reason below.
const Domain = "curia.dev"

// Kind is a class of failure: one gRPC code, and for classes a caller acts
// on, a reason. Kinds are compared by identity (errors.Is).
type Kind struct {
	code   codes.Code
	reason string
	text   string
	parent *Kind
	// ownState: the failure is this server's own state (SubOwnState).
	ownState bool
}

func (k *Kind) Error() string { return k.text }

// Code is the gRPC code of the kind.
func (k *Kind) Code() codes.Code { return k.code }

// Reason is the ErrorInfo reason of the kind, "" for none.
func (k *Kind) Reason() string { return k.reason }

// Is makes a refinement match the kind it refines.
func (k *Kind) Is(target error) bool {
	for p := k.parent; p != nil; p = p.parent {
		if p == target {
			return true
		}
	}
	return false
}

// Sub refines k with a service's own text ("the local etcd member is not
// running"): the same code and reason, and errors.Is(sub, k).
func (k *Kind) Sub(text string) *Kind {
	return &Kind{code: k.code, reason: k.reason, text: text, parent: k, ownState: k.ownState}
}

// SubOwnState is Sub for a failure of this server's own state that another
// replica of the service need not share (its local etcd member is not
// running). Asking this server again a few hundred milliseconds later
// meets the same answer, so the status tells the client's channel not to
// retry it (the trailer grpc-retry-pushback-ms: -1, gRFC A6): a caller
// that rotates over replicas moves on at once instead of after gRPC's
// retries here (rpc.Dial retries reads on UNAVAILABLE: 4 attempts, about a
// second), and one that has only this server gets the answer sooner and
// retries on its own schedule.
func (k *Kind) SubOwnState(text string) *Kind {
	sub := k.Sub(text)
	sub.ownState = true
	return sub
}

// retryPushback is gRPC's trailer by which a server tells the client's
// channel whether, and when, to retry (gRFC A6); a negative value: not.
const retryPushback = "grpc-retry-pushback-ms"

// The code table. Reasons name what a caller does differently.
var (
	// Invalid: the request is malformed; fix it.
	Invalid = &Kind{code: codes.InvalidArgument, text: "invalid request"}
	// NotFound: what the request names does not exist.
	NotFound = &Kind{code: codes.NotFound, text: "not found"}
	// Exists: what the request would create exists already.
	Exists = &Kind{code: codes.AlreadyExists, text: "already exists"}
	// Refused: the system is not in the state the request needs; retrying
	// the same request will not help until that state changes.
	Refused = &Kind{code: codes.FailedPrecondition, text: "refused"}
	// Denied: the caller may not do this (its identity is known).
	Denied = &Kind{code: codes.PermissionDenied, text: "permission denied"}
	// Unavailable: try again, possibly elsewhere.
	Unavailable = &Kind{code: codes.Unavailable, text: "unavailable"}
	// OutOfRange: a revision the caller resumes from is gone (compacted).
	OutOfRange = &Kind{code: codes.OutOfRange, text: "out of range"}
	// Exhausted: a rate limit; RetryInfo says when.
	Exhausted = &Kind{code: codes.ResourceExhausted, text: "too many calls"}
	// Corrupt: a stored record does not decode. Not Internal: nothing in
	// the server failed, the data did; the message names the key.
	Corrupt = &Kind{code: codes.DataLoss, text: "corrupt record"}

	// Conflict: a guarded write found what it read changed; nothing was
	// written. Read again, decide again.
	Conflict = &Kind{code: codes.Aborted, reason: "CONFLICT", text: "the record changed while this call ran"}
	// FenceStale: the caller's fence (lease, leader term, membership epoch
	// or revision it planned at) no longer holds; nothing was written. The
	// metadata key "part" says which: "lease" (acquire again), "epoch" or
	// "revision" (read again and plan anew).
	FenceStale = &Kind{code: codes.FailedPrecondition, reason: "FENCE_STALE", text: "stale fence"}
	// NotLeader: this curator replica does not lead (or none does yet):
	// retry, on any replica.
	NotLeader = &Kind{code: codes.Unavailable, reason: "NOT_LEADER", text: "not leader"}
	// LearnerPending: a learner is joining (etcd allows one at a time) or
	// not caught up yet; with RetryInfo when it passes by itself.
	LearnerPending = &Kind{code: codes.FailedPrecondition, reason: "LEARNER_PENDING", text: "a learner is pending"}
	// QuorumAtRisk: the change would leave fewer healthy voters than a
	// quorum. (etcd's reconfiguration window, which passes by itself, is
	// Unavailable with a RetryInfo.)
	QuorumAtRisk = &Kind{code: codes.FailedPrecondition, reason: "QUORUM_AT_RISK", text: "quorum at risk"}
	// ChangePending: a membership change is in flight somewhere in the
	// cluster; retry once it finished (RetryInfo when known).
	ChangePending = &Kind{code: codes.Aborted, reason: "CHANGE_PENDING", text: "a membership change is in flight"}
	// LeaseHeld: another holder has the lease; metadata "holder" and
	// "expires" (RFC 3339), RetryInfo until then.
	LeaseHeld = &Kind{code: codes.FailedPrecondition, reason: "LEASE_HELD", text: "lease held"}
	// SnapshotsOff: the curators take no etcd snapshots (they run
	// without --snapshot-dir); nothing to retry.
	SnapshotsOff = &Kind{code: codes.FailedPrecondition, reason: "SNAPSHOTS_OFF", text: "snapshots are off"}
	// MaintenanceRefused: a node cannot go into maintenance now; the
	// metadata key "cause" says why: "not_up", "in_maintenance" (another
	// node is), "change_pending", "learner" (one is catching up),
	// "failure_tolerance" (losing this voter would lose the quorum), or
	// "no_leader".
	MaintenanceRefused = &Kind{code: codes.FailedPrecondition, reason: "MAINTENANCE_REFUSED", text: "maintenance refused"}
)

// detailed carries ErrorInfo metadata and a retry delay with an error.
type detailed struct {
	err   error
	meta  map[string]string
	retry time.Duration
}

func (d *detailed) Error() string { return d.err.Error() }
func (d *detailed) Unwrap() error { return d.err }

// With adds ErrorInfo metadata (key, value pairs) to err.
func With(err error, kv ...string) error {
	d := &detailed{err: err, meta: map[string]string{}}
	var inner *detailed
	if errors.As(err, &inner) {
		maps.Copy(d.meta, inner.meta)
		d.retry = inner.retry
	}
	for i := 0; i+1 < len(kv); i += 2 {
		d.meta[kv[i]] = kv[i+1]
	}
	return d
}

// RetryAfter says that retrying err after d is likely to succeed.
func RetryAfter(err error, d time.Duration) error {
	out := &detailed{err: err, retry: max(d, time.Millisecond)}
	var inner *detailed
	if errors.As(err, &inner) {
		out.meta = inner.meta
	}
	return out
}

// LeaseHeldBy is the LeaseHeld refusal for a lease that holder has until
// expires.
func LeaseHeldBy(name, holder string, expires time.Time) error {
	exp := expires.UTC().Format(time.RFC3339Nano)
	err := fmt.Errorf("%w: lease %s is held by %s until %s", LeaseHeld, name, holder, exp)
	return RetryAfter(With(err, "lease", name, "holder", holder, "expires", exp), time.Until(expires))
}

// ToStatus turns err into the status the client gets. Internal errors are
// logged with a correlation id, which is all the client is told.
func ToStatus(ctx context.Context, log *slog.Logger, method string, err error) error {
	if err == nil {
		return nil
	}
	if se, ok := err.(interface{ GRPCStatus() *status.Status }); ok && se.GRPCStatus().Code() != codes.Unknown {
		// A status as such, not wrapped (authz's and validation's
		// refusals): its message and details are complete.
		return err
	}
	var k *Kind
	if !errors.As(err, &k) {
		if st, ok := innerStatus(err); ok && st.Code() != codes.OK {
			// A status from a call this handler made (or made itself):
			// keep its details, another service's reason and retry delay;
			// the message says more.
			p := st.Proto()
			p.Message = err.Error()
			switch st.Code() {
			case codes.Unknown:
				// It failed below its service (a member starting or
				// stopping answered with the wrong protocol): retry.
				p.Code = int32(codes.Unavailable)
			case codes.Unauthenticated, codes.PermissionDenied:
				// The service below refused this server, not the
				// caller (a consensus process whose member certificate
				// etcd revoked: its node was deleted): the caller's
				// credentials are fine, another replica may serve it.
				// (The caller's own refusals and a forwarded call's
				// answer are statuses as such, above.)
				p.Code = int32(codes.Unavailable)
			}
			return status.FromProto(p).Err()
		}
	}
	if k != nil && k.ownState {
		// Best effort: a context without a gRPC call (a test's) has
		// nowhere to put it.
		_ = grpc.SetTrailer(ctx, metadata.Pairs(retryPushback, "-1"))
	}
	code, reason, known := classify(err)
	if !known {
		id := CorrelationID()
		if log != nil {
			log.ErrorContext(ctx, "internal error", "grpc.method", method, "correlation_id", id, "err", err)
		}
		return Internal(id)
	}
	var details []protoadapt.MessageV1
	var d *detailed
	hasDetail := errors.As(err, &d)
	if reason != "" || (hasDetail && len(d.meta) > 0) {
		info := &errdetails.ErrorInfo{Reason: reason, Domain: Domain}
		if hasDetail {
			info.Metadata = maps.Clone(d.meta)
		}
		details = append(details, info)
	}
	retry := time.Duration(0)
	if hasDetail {
		retry = d.retry
	} else {
		retry = EtcdRetry(err)
	}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	st := status.New(code, err.Error())
	if len(details) > 0 {
		if withDetails, derr := st.WithDetails(details...); derr == nil {
			st = withDetails
		}
	}
	return st.Err()
}

// classify finds the code (and reason) that explains err: a kind first, then
// context, then etcd's own errors.
func classify(err error) (codes.Code, string, bool) {
	var k *Kind
	if errors.As(err, &k) {
		return k.code, k.reason, true
	}
	switch {
	case errors.Is(err, context.Canceled):
		return codes.Canceled, "", true
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded, "", true
	}
	if k, ok := etcdKind(err); ok {
		return k.code, k.reason, true
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		switch c := ee.Code(); c {
		case codes.Unknown, codes.Internal, codes.OK:
			return 0, "", false
		default:
			return c, "", true
		}
	}
	return 0, "", false
}

// etcdKind maps etcd's membership refusals to kinds.
func etcdKind(err error) (*Kind, bool) {
	switch {
	case errors.Is(err, rpctypes.ErrTooManyLearners), errors.Is(err, rpctypes.ErrMemberLearnerNotReady):
		return LearnerPending, true
	case errors.Is(err, rpctypes.ErrUnhealthy):
		// etcd's reconfiguration window: its voters have not been in
		// contact for 5s since a change or restart. Passes by itself
		// (EtcdRetry).
		return Unavailable, true
	case errors.Is(err, rpctypes.ErrMemberNotEnoughStarted):
		return QuorumAtRisk, true
	case errors.Is(err, rpctypes.ErrPeerURLExist), errors.Is(err, rpctypes.ErrMemberExist):
		return Exists, true
	case errors.Is(err, rpctypes.ErrMemberNotFound):
		return NotFound, true
	}
	return nil, false
}

// EtcdRetry is how long to wait before retrying etcd's refusals that pass by
// themselves: a learner catching up, the window after a membership change or
// restart in which etcd wants a quorum connected for 5 seconds. Zero for
// the others.
func EtcdRetry(err error) time.Duration {
	switch {
	case errors.Is(err, rpctypes.ErrMemberLearnerNotReady):
		return 500 * time.Millisecond
	case errors.Is(err, rpctypes.ErrUnhealthy):
		return time.Second
	}
	return 0
}

func innerStatus(err error) (*status.Status, bool) {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		if st := se.GRPCStatus(); st != nil {
			return st, true
		}
	}
	return nil, false
}

// Internal is the status a client gets for a failure logged under id.
func Internal(id string) error {
	return status.Errorf(codes.Internal, "internal error (correlation id %s: the server's log has the details)", id)
}

// CorrelationID is a fresh id to log an internal failure under.
func CorrelationID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
