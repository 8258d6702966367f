//go:build failpoints

// Package failpoint lets tests stop a process at a named point of its code:
// hold it there (to land a change from outside between two of its steps) or
// crash it (to leave a change half done). Only builds with the failpoints
// tag have them; in production builds every call is an empty function.
//
//	Hold(name)   while $CURIA_FAILPOINT_DIR/<name> exists: write <name>/reached, wait;
//	             when $CURIA_FAILPOINT_DIR/<name>.delay holds a duration: sleep that long
//	Crash(name)  once when $CURIA_FAILPOINT_DIR/<name>.crash exists: remove it, exit with code 86
//	Mutated(m)   when $CURIA_MUTATIONS (comma-separated) names it: a safety mechanism is
//	             switched off, so that a test can show the fault suite catches its absence
package failpoint

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Enabled says whether this build has failpoints.
const Enabled = true

// Hold waits at the named point while the test keeps the directory
// $CURIA_FAILPOINT_DIR/<name>; it writes <name>/reached when it gets there,
// so the test knows the process arrived. A file <name>.delay with a Go
// duration (at most a minute) instead widens the point by that long every
// time, so that a test's other actors land inside it by chance.
func Hold(name string) {
	dir := os.Getenv("CURIA_FAILPOINT_DIR")
	if dir == "" {
		return
	}
	if b, err := os.ReadFile(filepath.Join(dir, name+".delay")); err == nil {
		if d, err := time.ParseDuration(strings.TrimSpace(string(b))); err == nil && d > 0 {
			time.Sleep(min(d, time.Minute))
		}
	}
	point := filepath.Join(dir, name)
	if _, err := os.Stat(point); err != nil {
		return
	}
	if err := os.WriteFile(filepath.Join(point, "reached"), nil, 0o600); err != nil {
		// The test waits for the file in vain: its log says why.
		os.Stderr.WriteString("failpoint " + name + ": " + err.Error() + "\n")
	}
	for {
		if _, err := os.Stat(point); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Crash exits the process at the named point, as a machine failure there
// would, once when the file $CURIA_FAILPOINT_DIR/<name>.crash exists: the
// process that removes it crashes; a test arms it again by creating it
// again.
func Crash(name string) {
	dir := os.Getenv("CURIA_FAILPOINT_DIR")
	if dir == "" || os.Remove(filepath.Join(dir, name+".crash")) != nil {
		return
	}
	os.Stderr.WriteString("failpoint " + name + ": exiting\n")
	os.Exit(86)
}

// Mutated reports whether the named safety mechanism is switched off
// ($CURIA_MUTATIONS). Only tests that prove a checker catches the
// mechanism's absence set it.
func Mutated(mechanism string) bool {
	return slices.Contains(strings.Split(os.Getenv("CURIA_MUTATIONS"), ","), mechanism)
}
