package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	profile := filepath.Join(t.TempDir(), "profile.out")
	if err := os.WriteFile(profile, []byte(`mode: atomic
curia.dev/platform/rpc/server.go:1.1,2.2 3 1
curia.dev/platform/rpc/server.go:3.1,4.2 1 0
curia.dev/services/curator/leader.go:1.1,2.2 4 0
curia.dev/services/curator/leader.go:1.1,2.2 4 2
curia.dev/services/curator/cmd/curator/main.go:1.1,2.2 2 0
curia.dev/services/curatorx/x.go:1.1,2.2 2 1
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(&out, profile, []string{"curia.dev/gen", "curia.dev/platform", "curia.dev/services/curator"}); err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"statement coverage per module:",
		"  curia.dev/gen                0.0%  (0 of 0 statements)",
		"  curia.dev/platform          75.0%  (3 of 4 statements)",
		"  curia.dev/services/curator  66.7%  (4 of 6 statements)",
		"  other                      100.0%  (2 of 2 statements)",
		"  total                       75.0%  (9 of 12 statements)",
		"",
	}, "\n")
	if got := out.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestParseRefusesGarbage(t *testing.T) {
	_, err := parse(strings.NewReader("mode: set\nnot a profile line\n"))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("err = %v, want one about line 2", err)
	}
}
