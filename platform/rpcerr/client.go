package rpcerr

import (
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Is reports whether err is of kind k: locally (errors.Is), or as a status
// from another process, by k's reason, or by its code for kinds without one.
func Is(err error, k *Kind) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, k) {
		return true
	}
	st, ok := innerStatus(err)
	if !ok {
		return false
	}
	if k.reason != "" {
		return reasonOf(st) == k.reason
	}
	return st.Code() == k.code
}

// Reason is err's ErrorInfo reason ("" for none).
func Reason(err error) string {
	var k *Kind
	if errors.As(err, &k) {
		return k.reason
	}
	if st, ok := innerStatus(err); ok {
		return reasonOf(st)
	}
	return ""
}

// Meta is the ErrorInfo metadata value under key ("" for none).
func Meta(err error, key string) string {
	var d *detailed
	if errors.As(err, &d) {
		return d.meta[key]
	}
	if st, ok := innerStatus(err); ok {
		for _, x := range st.Details() {
			if info, ok := x.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
				return info.GetMetadata()[key]
			}
		}
	}
	return ""
}

// RetryDelay is the delay err's RetryInfo asks for.
func RetryDelay(err error) (time.Duration, bool) {
	var d *detailed
	if errors.As(err, &d) && d.retry > 0 {
		return d.retry, true
	}
	if st, ok := innerStatus(err); ok {
		for _, x := range st.Details() {
			if ri, ok := x.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
				return ri.GetRetryDelay().AsDuration(), true
			}
		}
	}
	return 0, false
}

// Retryable reports whether the same call may succeed later unchanged: it
// says when (RetryInfo), or its code says so (Unavailable, DeadlineExceeded,
// Aborted, ResourceExhausted).
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	if _, ok := RetryDelay(err); ok {
		return true
	}
	switch Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted:
		return true
	}
	return false
}

// Code is the gRPC code of err: a status's, or the one ToStatus would give
// (Internal for errors nothing explains).
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	var k *Kind
	if errors.As(err, &k) {
		return k.code
	}
	if st, ok := innerStatus(err); ok {
		return st.Code()
	}
	if c, _, ok := classify(err); ok {
		return c
	}
	return codes.Internal
}

func reasonOf(st *status.Status) string {
	for _, x := range st.Details() {
		if info, ok := x.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetReason()
		}
	}
	return ""
}
