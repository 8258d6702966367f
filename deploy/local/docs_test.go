package local_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docPages are the pages whose commands the end-to-end tests run, relative
// to the repository root, in the order an operator reads them: the front
// page, then the operator's manual in the order of its index
// (docs/operating/README.md), which is the order these sections had when
// they were the README's. runDocCommands runs their grpcurl and curl
// commands in this order: the administration page's end by deleting a
// worker.
var docPages = []string{
	"README.md",
	"docs/operating/administration.md",
	"docs/operating/configuration.md",
	"docs/operating/snapshots.md",
	"docs/operating/scaling.md",
	"docs/operating/certificates.md",
	"docs/operating/recovery.md",
	"docs/operating/compose.md",
	"docs/operating/kubernetes.md",
	"docs/operating/dashboard.md",
	"docs/operating/testing.md",
	"docs/operating/benchmarks.md",
	"docs/operating/development.md",
}

// readDocs is the text of every page of docPages, one after the other.
func readDocs(t testing.TB) string {
	t.Helper()
	var b strings.Builder
	for _, p := range docPages {
		text, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(p)))
		if err != nil {
			t.Fatal(err)
		}
		b.Write(text)
		b.WriteString("\n")
	}
	return b.String()
}

// curlCommands are the curl command lines of text.
func curlCommands(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "curl ") {
			out = append(out, l)
		}
	}
	return out
}

// assignCommand is a line that sets a variable from a grpcurl command
// (SNAPSHOT=$(grpcurl ...)).
var assignCommand = regexp.MustCompile(`^([A-Z_]+)=\$\((grpcurl .*)\)$`)

// adminCommands are the lines of text that runDocCommands runs, in order:
// every grpcurl and curl command line, and every line that sets a
// variable from a grpcurl command (assignCommand).
func adminCommands(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if assignCommand.MatchString(line) || strings.HasPrefix(line, "grpcurl ") || strings.HasPrefix(line, "curl ") {
			out = append(out, line)
		}
	}
	return out
}

// composeRecoverCommands is the quorum-loss recovery on compose
// (docs/operating/recovery.md), the arguments after `docker compose`: the
// first command that runs curia-local recover in the init service, which
// says what it would do. The next one must be the same with --confirm.
func composeRecoverCommands(text string) ([]string, error) {
	var cmds [][]string
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		if f := strings.Fields(line); len(f) > 2 && f[0] == "docker" && f[1] == "compose" && slices.Contains(f, "recover") {
			cmds = append(cmds, f[2:])
		}
	}
	if len(cmds) < 2 || !slices.Equal(cmds[1][:len(cmds[1])-2], cmds[0]) || cmds[1][len(cmds[1])-2] != "--confirm" {
		return nil, fmt.Errorf("compose recovery: %q, want a command and then the same with --confirm <node>", cmds)
	}
	return cmds[0], nil
}

// TestDocCommands: the pages the end-to-end tests read have what those
// tests run: the curl commands, at least 10 grpcurl and curl commands,
// and the compose recovery. (Before the README's operator sections moved
// to docs/operating/, README.md alone had 2 curl commands, 30 commands
// runDocCommands ran and 1 assignment, and 2 compose recovery commands.)
func TestDocCommands(t *testing.T) {
	text := readDocs(t)
	curl := curlCommands(text)
	if len(curl) == 0 {
		t.Error("no curl command in the docs")
	}
	var run, assign int
	for _, l := range adminCommands(text) {
		if assignCommand.MatchString(l) {
			assign++
		} else {
			run++
		}
	}
	if run < 10 {
		t.Errorf("only %d grpcurl commands in the docs", run)
	}
	recoverCmd, err := composeRecoverCommands(text)
	if err != nil {
		t.Error(err)
	}
	t.Logf("%d curl commands, %d commands run and %d assignments, compose recovery: docker compose %s", len(curl), run, assign, strings.Join(recoverCmd, " "))
}
