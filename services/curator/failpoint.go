//go:build failpoints

package curator

import (
	"os"
	"slices"
	"strings"
)

// failpoint kills the process at the named point when CURIA_FAILPOINTS (a
// comma-separated list) names it. Tests build the curator with
// -tags failpoints to crash it, e.g., between a membership change and the
// role write that follows it; production builds compile it away.
func failpoint(name string) {
	if slices.Contains(strings.Split(os.Getenv("CURIA_FAILPOINTS"), ","), name) {
		os.Stderr.WriteString("failpoint " + name + ": exiting\n")
		os.Exit(86)
	}
}
