package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"curia.dev/platform/rpc"
	"curia.dev/platform/rpcerr"
)

// Exit codes: one per kind of failure a script handles differently.
const (
	exitOK          = 0
	exitFailed      = 1 // any other failure (a local file, an unexpected error)
	exitUsage       = 2 // bad command line: unknown command or flag, wrong arguments
	exitConfig      = 3 // no connection settings, or TLS files that do not load
	exitUnavailable = 4 // no curator answered, or it asked to retry (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED)
	exitNotFound    = 5 // NOT_FOUND
	exitInvalid     = 6 // the request was rejected as malformed (INVALID_ARGUMENT, OUT_OF_RANGE)
	exitRefused     = 7 // the cluster refused it in its current state (FAILED_PRECONDITION, ABORTED, ALREADY_EXISTS), or recover did (nothing changed)
	exitDenied      = 8 // PERMISSION_DENIED, UNAUTHENTICATED
)

// exitCodesHelp documents the exit codes in curiactl --help.
const exitCodesHelp = `Exit codes:
  0  success
  1  any other failure (a local file, an unexpected server error)
  2  usage: unknown command or flag, wrong arguments
  3  connection settings: a flag or CURIA_* variable missing, TLS files that do not load
  4  unavailable: no curator answered in time, or it asked to retry (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED)
  5  not found (NOT_FOUND)
  6  invalid request (INVALID_ARGUMENT, OUT_OF_RANGE)
  7  refused in the cluster's current state (FAILED_PRECONDITION, ABORTED, ALREADY_EXISTS;
     recover: a quorum is reachable, no survivor, or no --confirm: nothing changed)
  8  permission denied (PERMISSION_DENIED, UNAUTHENTICATED)
`

// usageError is a bad command line.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// configError is a connection setting that is missing or does not load.
type configError struct{ err error }

func (e configError) Error() string { return e.err.Error() }
func (e configError) Unwrap() error { return e.err }

// exitCode maps err to curiactl's exit code.
func exitCode(err error) int {
	var ue usageError
	var ce configError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		return exitUsage
	case errors.As(err, &ce):
		return exitConfig
	case errors.Is(err, context.DeadlineExceeded):
		return exitUnavailable
	case recoveryRefused(err):
		return exitRefused
	}
	st, ok := status.FromError(err)
	if !ok {
		return exitFailed
	}
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
		return exitUnavailable
	case codes.NotFound:
		return exitNotFound
	case codes.InvalidArgument, codes.OutOfRange:
		return exitInvalid
	case codes.FailedPrecondition, codes.Aborted, codes.AlreadyExists:
		return exitRefused
	case codes.PermissionDenied, codes.Unauthenticated:
		return exitDenied
	default:
		return exitFailed
	}
}

// renderError prints err for a person — for a gRPC status its code and
// message, the ErrorInfo reason and metadata, the RetryInfo delay and the
// field violations — and returns the exit code.
func renderError(w io.Writer, err error) int {
	fmt.Fprint(w, formatError(err))
	return exitCode(err)
}

func formatError(err error) string {
	var b strings.Builder
	st, ok := status.FromError(err)
	if !ok {
		fmt.Fprintf(&b, "Error: %v\n", err)
		return b.String()
	}
	fmt.Fprintf(&b, "Error: %s: %s\n", codeName(st.Code()), st.Message())
	if reason := rpcerr.Reason(err); reason != "" {
		fmt.Fprintf(&b, "  reason: %s\n", reason)
	}
	for _, kv := range errorMeta(st) {
		fmt.Fprintf(&b, "  %s\n", kv)
	}
	if d, ok := rpcerr.RetryDelay(err); ok {
		fmt.Fprintf(&b, "  retry after: %v\n", d.Round(time.Millisecond))
	}
	for _, v := range rpc.FieldViolations(err) {
		fmt.Fprintf(&b, "  field %s: %s", v.GetField(), v.GetDescription())
		if v.GetReason() != "" {
			fmt.Fprintf(&b, " (%s)", v.GetReason())
		}
		b.WriteString("\n")
	}
	return b.String()
}

// codeName is a gRPC code as the proto spells it (NOT_FOUND).
func codeName(c codes.Code) string {
	var b strings.Builder
	prevLower := false
	for _, r := range c.String() {
		upper := r >= 'A' && r <= 'Z'
		if upper && prevLower {
			b.WriteByte('_')
		}
		prevLower = !upper
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

// errorMeta is the ErrorInfo metadata of st as "key: value", sorted.
func errorMeta(st *status.Status) []string {
	var out []string
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			for k, v := range info.GetMetadata() {
				out = append(out, k+": "+v)
			}
		}
	}
	slices.Sort(out)
	return out
}
