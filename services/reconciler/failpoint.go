//go:build failpoints

package reconciler

import (
	"os"
	"path/filepath"
	"time"
)

// failpoint holds the reconciler at the named point while the directory
// $CURIA_FAILPOINT_DIR/<name> exists: it writes <name>/reached, then waits
// until the test removes the directory. Tests use it to land a change
// between a pass's read and its write. Production builds compile it away.
func failpoint(name string) {
	dir := os.Getenv("CURIA_FAILPOINT_DIR")
	if dir == "" {
		return
	}
	point := filepath.Join(dir, name)
	if _, err := os.Stat(point); err != nil {
		return
	}
	os.WriteFile(filepath.Join(point, "reached"), nil, 0o600)
	for {
		if _, err := os.Stat(point); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
