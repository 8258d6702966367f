// Package leaktest is the one place where curia's tests say which
// goroutines may outlive them. Every package whose tests start goroutines
// (servers, etcd, processes, watchers) checks, after its last test, that no
// goroutine is left running but those Options allows:
//
//	func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }
//
// Options is where a third-party goroutine that its library keeps on
// purpose would be ignored, named by its top function
// (goleak.IgnoreTopFunction) with the reason. None is needed today: the
// tests close what they open (etcd's embed, gRPC connections and servers,
// zap loggers, HTTP clients' idle connections) and wait for it. Nothing is
// ignored wholesale: a goroutine of curia's code left running is a failure
// to fix, in the code or in the test.
package leaktest

import (
	"testing"

	"go.uber.org/goleak"
)

// Options are the ignores every package shares, for goleak.VerifyNone and
// goleak.VerifyTestMain: none yet (see the package comment).
func Options() []goleak.Option {
	return nil
}

// VerifyTestMain runs the package's tests, then fails the test binary if
// goroutines other than Options' (and extra's) are still running.
func VerifyTestMain(m *testing.M, extra ...goleak.Option) {
	goleak.VerifyTestMain(m, append(Options(), extra...)...)
}
