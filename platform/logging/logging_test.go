package logging

import (
	"bytes"
	"encoding/json"
	"flag"
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	tests := map[string]struct {
		cfg       Config
		wantDebug bool
		wantJSON  bool
	}{
		"zero config is info text": {cfg: Config{}},
		"debug json":               {cfg: Config{Level: "debug", Format: "json"}, wantDebug: true, wantJSON: true},
		"upper-case level":         {cfg: Config{Level: "DEBUG"}, wantDebug: true},
		"warn text":                {cfg: Config{Level: "warn", Format: "text"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			logger, err := New(&buf, tc.cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			logger.With("component", "test").Debug("debug line", "node", "n1")
			if got := buf.Len() > 0; got != tc.wantDebug {
				t.Fatalf("debug line written = %v, want %v (output %q)", got, tc.wantDebug, buf.String())
			}
			if !tc.wantDebug {
				return
			}
			if tc.wantJSON {
				var line map[string]any
				if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
					t.Fatalf("output is not JSON: %v: %q", err, buf.String())
				}
				if line["component"] != "test" || line["node"] != "n1" {
					t.Fatalf("fields missing from %v", line)
				}
			} else if !strings.Contains(buf.String(), "component=test") {
				t.Fatalf("text output %q lacks component=test", buf.String())
			}
		})
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]Config{
		"bad level":  {Level: "loud"},
		"bad format": {Format: "xml"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := New(&bytes.Buffer{}, cfg); err == nil {
				t.Fatal("New accepted a bad config")
			}
		})
	}
}

func TestAddFlags(t *testing.T) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	cfg.AddFlags(fs)
	if err := fs.Parse([]string{"-log-level=debug", "-log-format=json"}); err != nil {
		t.Fatal(err)
	}
	if want := (Config{Level: "debug", Format: "json"}); cfg != want {
		t.Fatalf("cfg = %+v, want %+v", cfg, want)
	}

	var empty Config
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	empty.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if empty != DefaultConfig() {
		t.Fatalf("defaults = %+v, want %+v", empty, DefaultConfig())
	}
}
