//go:build !failpoints

package reconciler

// failpoint is a no-op outside test builds (see failpoint.go).
func failpoint(string) {}
