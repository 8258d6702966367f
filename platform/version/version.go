// Package version names the build of a curia binary: every command prints
// it for --version, nodes report it to the curator, and /metrics carries it
// as curia_build_info.
//
// Where it comes from, first match wins:
//
//  1. -ldflags "-X curia.dev/platform/version.version=..." (make build
//     stamps `git describe --always --dirty`);
//  2. the main module's version from the build info (go install m@v1.2.3);
//  3. the VCS revision the go command recorded (unless -buildvcs=false);
//  4. "unknown" (go test, go run with -buildvcs=false).
package version

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// version is set by the linker (make build).
var version string

// Info describes one build.
type Info struct {
	// Version is the release or `git describe` name, or the revision.
	Version string
	// Revision is the VCS revision, "-dirty" appended for a modified tree,
	// when the go command recorded one.
	Revision string
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Get returns the build of this binary.
var Get = sync.OnceValue(func() Info { return fromBuild(version, debug.ReadBuildInfo) })

func fromBuild(stamped string, read func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: stamped, GoVersion: runtime.Version()}
	if bi, ok := read(); ok {
		var dirty bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Revision = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if info.Revision != "" && dirty {
			info.Revision += "-dirty"
		}
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
	}
	if info.Version == "" {
		info.Version = info.Revision
	}
	if info.Version == "" {
		info.Version = "unknown"
	}
	return info
}

// String is the version alone, e.g. "v0.3.0-12-g1a2b3c4-dirty".
func String() string { return Get().Version }

// Print writes the line --version prints: "<name> <version> (<revision>, <go>)".
func Print(w io.Writer, name string) {
	i := Get()
	if i.Revision != "" && i.Revision != i.Version {
		fmt.Fprintf(w, "%s %s (revision %s, %s)\n", name, i.Version, i.Revision, i.GoVersion)
		return
	}
	fmt.Fprintf(w, "%s %s (%s)\n", name, i.Version, i.GoVersion)
}

// Collector is curia_build_info: a gauge of 1 labelled with the build.
func Collector() prometheus.Collector {
	i := Get()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "curia_build_info",
		Help:        "The build of this binary (always 1).",
		ConstLabels: prometheus.Labels{"version": i.Version, "revision": i.Revision, "goversion": i.GoVersion},
	}, func() float64 { return 1 })
}
