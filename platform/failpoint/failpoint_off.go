//go:build !failpoints

package failpoint

// Enabled says whether this build has failpoints.
const Enabled = false

// Hold does nothing outside builds with the failpoints tag.
func Hold(string) {}

// Crash does nothing outside builds with the failpoints tag.
func Crash(string) {}

// Mutated is always false outside builds with the failpoints tag: no
// production build can switch a safety mechanism off.
func Mutated(string) bool { return false }
