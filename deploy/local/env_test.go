package local

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnvFileFindsGrpcurl: a fresh shell (no tools on PATH) that sources
// the env file runs the grpcurl make run passed, even from a directory
// whose name a shell would mangle, and has every variable the README's
// commands use.
func TestEnvFileFindsGrpcurl(t *testing.T) {
	tools := filepath.Join(t.TempDir(), `tools "$HOME" a\b`)
	if err := os.MkdirAll(tools, 0o700); err != nil {
		t.Fatal(err)
	}
	grpcurl := filepath.Join(tools, "grpcurl")
	if err := os.WriteFile(grpcurl, []byte("#!/bin/sh\necho pinned grpcurl \"$@\"\n"), 0o700); err != nil { //nolint:gosec // G306: an executable
		t.Fatal(err)
	}
	c := New(Config{State: t.TempDir(), Cluster: "curia", ControlPlane: 3, Workers: 1, Curators: 2, Reconcilers: 2, Grpcurl: grpcurl,
		Out: io.Discard, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := c.writeEnv(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "--noprofile", "--norc", "-c", `source "$1" && command -v grpcurl && grpcurl $CURIA_TLS $CURIA_CURATOR list && echo "$CURIA_CURATOR_HTTP"`, "bash", c.path("env"))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []string{
		grpcurl,
		"pinned grpcurl -cacert " + c.AdminFiles().CA + " -cert " + c.AdminFiles().Cert + " -key " + c.AdminFiles().Key + " 127.0.0.21:7200 list",
		"https://127.0.0.21:7201",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("in a fresh shell after source env:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}

	// Without --grpcurl the env file leaves PATH alone.
	c.cfg.Grpcurl = ""
	if err := c.writeEnv(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(c.path("env"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "PATH") {
		t.Fatalf("env file without --grpcurl sets PATH:\n%s", b)
	}
}

// TestEnvFilePutsBinOnPath: with --bin (make run passes bin/), a fresh shell
// that sources the env file runs curiactl from there, and has the cluster's
// name for it.
func TestEnvFilePutsBinOnPath(t *testing.T) {
	bin := filepath.Join(t.TempDir(), `bin "$HOME"`)
	if err := os.MkdirAll(bin, 0o700); err != nil {
		t.Fatal(err)
	}
	curiactl := filepath.Join(bin, "curiactl")
	if err := os.WriteFile(curiactl, []byte("#!/bin/sh\necho curiactl \"$@\"\n"), 0o700); err != nil { //nolint:gosec // G306: an executable
		t.Fatal(err)
	}
	c := New(Config{State: t.TempDir(), Bin: bin, Cluster: "curia", ControlPlane: 3, Workers: 1, Curators: 2, Reconcilers: 2,
		Out: io.Discard, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := c.writeEnv(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "--noprofile", "--norc", "-c", `source "$1" && command -v curiactl && curiactl status && echo "$CURIA_CLUSTER $CURIA_CURATORS"`, "bash", c.path("env"))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := curiactl + "\ncuriactl status\ncuria 127.0.0.21:7200,127.0.0.22:7200"
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("in a fresh shell after source env:\n%s\nwant:\n%s", got, want)
	}
}
