// Package rpcerrtest holds the assertions tests make on the errors curia's
// services return: the code, the message a human reads, and for the
// failures a caller branches on, the ErrorInfo reason.
package rpcerrtest

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"curia.dev/platform/rpcerr"
)

// WantCode fails the test unless err has code and, for a failure, a message
// containing contains (any message when contains is empty).
func WantCode(t testing.TB, err error, code codes.Code, contains string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != code {
		t.Fatalf("got %v, want code %v", err, code)
	}
	if code != codes.OK && !strings.Contains(st.Message(), contains) {
		t.Fatalf("error %q does not say %q", st.Message(), contains)
	}
}

// WantKind is WantCode for the failures a caller branches on: the kind's
// code and its ErrorInfo reason, and for a stale fence the part that went
// stale (empty for other kinds).
func WantKind(t testing.TB, err error, k *rpcerr.Kind, part, contains string) {
	t.Helper()
	WantCode(t, err, k.Code(), contains)
	if got := rpcerr.Reason(err); got != k.Reason() {
		t.Fatalf("reason %q, want %q (%v)", got, k.Reason(), err)
	}
	if got := rpcerr.Meta(err, "part"); got != part {
		t.Fatalf("stale part %q, want %q (%v)", got, part, err)
	}
}
