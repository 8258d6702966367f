package version

import (
	"runtime/debug"
	"testing"
)

func TestFromBuild(t *testing.T) {
	build := func(main string, settings ...string) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			bi := &debug.BuildInfo{Main: debug.Module{Version: main}}
			for i := 0; i+1 < len(settings); i += 2 {
				bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
			}
			return bi, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	tests := map[string]struct {
		stamped      string
		read         func() (*debug.BuildInfo, bool)
		wantVersion  string
		wantRevision string
	}{
		"stamped wins":              {stamped: "v1.2.3-4-gabc", read: build("v1.0.0", "vcs.revision", "abc123"), wantVersion: "v1.2.3-4-gabc", wantRevision: "abc123"},
		"module version":            {read: build("v1.0.0"), wantVersion: "v1.0.0"},
		"devel falls to revision":   {read: build("(devel)", "vcs.revision", "abc123", "vcs.modified", "true"), wantVersion: "abc123-dirty", wantRevision: "abc123-dirty"},
		"nothing known":             {read: build("(devel)"), wantVersion: "unknown"},
		"no build info":             {read: none, wantVersion: "unknown"},
		"clean tree, stamped dirty": {stamped: "v2-dirty", read: build("(devel)", "vcs.revision", "abc", "vcs.modified", "false"), wantVersion: "v2-dirty", wantRevision: "abc"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := fromBuild(tc.stamped, tc.read)
			if got.Version != tc.wantVersion || got.Revision != tc.wantRevision || got.GoVersion == "" {
				t.Fatalf("fromBuild = %+v, want version %q revision %q", got, tc.wantVersion, tc.wantRevision)
			}
		})
	}
}
