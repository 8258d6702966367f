package registry_test

import (
	"testing"

	"curia.dev/platform/docindex"
)

// TestFilesIndex: the package doc's "Files:" index names every file of the
// package, and no other.
func TestFilesIndex(t *testing.T) { docindex.Check(t) }
