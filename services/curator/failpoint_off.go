//go:build !failpoints

package curator

// failpoint is a no-op outside test builds (see failpoint.go).
func failpoint(string) {}
