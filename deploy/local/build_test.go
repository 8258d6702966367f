package local_test

import (
	"os/exec"
	"testing"
)

// buildAll builds every binary curia-local runs, and those of extra (the
// dashboard's: curia-local starts it when it is there), into one
// directory.
func buildAll(t testing.TB, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	args := append([]string{"build", "-o", dir + "/",
		"curia.dev/services/consensus/cmd/consensus",
		"curia.dev/services/curator/cmd/curator",
		"curia.dev/services/reconciler/cmd/reconciler",
		"curia.dev/services/roleserve/cmd/roleserve",
		"curia.dev/deploy/local/cmd/curia-local"}, extra...)
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return dir
}
