//go:build !e2e

// The e2e tier (-tags e2e, make test-e2e) runs without the check: it is
// not make test's, and its clusters run for minutes as processes.

package local_test

import (
	"testing"

	"curia.dev/platform/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }
