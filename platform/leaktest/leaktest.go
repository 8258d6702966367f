// Package leaktest is the one place where curia's tests say which
// goroutines may outlive them. Every package whose tests start goroutines
// (servers, etcd, processes, watchers) checks, after its last test, that
// none of curia's own is left running:
//
//	func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }
//
// The ignores below are third-party goroutines that their libraries keep on
// purpose, each named by its top (or an enclosing) function and the reason.
// Nothing is ignored wholesale: a goroutine of curia's code left running is
// a failure to fix, in the code or in the test.
package leaktest

import (
	"testing"

	"go.uber.org/goleak"
)

// Options are the ignores every package shares, for goleak.VerifyNone and
// goleak.VerifyTestMain.
func Options() []goleak.Option {
	return []goleak.Option{}
}

// VerifyTestMain runs the package's tests, then fails the test binary if
// goroutines other than Options' (and extra's) are still running.
func VerifyTestMain(m *testing.M, extra ...goleak.Option) {
	goleak.VerifyTestMain(m, append(Options(), extra...)...)
}
