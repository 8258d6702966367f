package proctest

import (
	"testing"

	"curia.dev/platform/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }
