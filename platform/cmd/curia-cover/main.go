// Command curia-cover prints the statement coverage of each Go module of
// the workspace from one coverage profile, as `go test -coverprofile`
// writes it for many packages at once, and the total. `make test` runs it
// after the tests:
//
//	go test -race -cover -coverprofile .cover/profile.out work
//	curia-cover .cover/profile.out              # modules from `go list -m`
//	curia-cover .cover/profile.out curia.dev/platform curia.dev/gen
//
// A statement belongs to the module whose path is the longest prefix of its
// file's import path. A block listed more than once (one package's tests
// and another's, under -coverpkg) counts once, covered if any run covered
// it. Packages without tests count too, at zero: go test lists their
// statements in the profile.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) < 2 || strings.HasPrefix(os.Args[1], "-") {
		fmt.Fprintln(os.Stderr, "usage: curia-cover PROFILE [MODULE...]")
		os.Exit(2)
	}
	if err := run(os.Stdout, os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "curia-cover:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, profile string, modules []string) error {
	if len(modules) == 0 {
		out, err := exec.Command("go", "list", "-m").Output()
		if err != nil {
			return fmt.Errorf("go list -m: %w", err)
		}
		modules = strings.Fields(string(out))
	}
	f, err := os.Open(profile) //nolint:gosec // G703: the profile is the path its user passes on the command line
	if err != nil {
		return err
	}
	defer f.Close()
	blocks, err := parse(f)
	if err != nil {
		return fmt.Errorf("%s: %w", profile, err)
	}
	writeRows(w, summarize(blocks, modules))
	return nil
}

// block is one line of a profile: statements in a range of a file.
type block struct {
	stmts   int
	covered bool
}

// parse reads a profile ("mode: atomic", then "file:l.c,l.c stmts count"
// lines) into its blocks, keyed by file and range.
func parse(r io.Reader) (map[string]block, error) {
	blocks := map[string]block{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "mode:") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			return nil, fmt.Errorf("line %d: not file:range stmts count: %q", n, line)
		}
		stmts, err1 := strconv.Atoi(fields[1])
		count, err2 := strconv.Atoi(fields[2])
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		key := fields[0]
		b := blocks[key]
		b.stmts = stmts
		b.covered = b.covered || count > 0
		blocks[key] = b
	}
	return blocks, sc.Err()
}

// row is one module's statements and how many of them ran.
type row struct {
	module         string
	stmts, covered int
}

// summarize sums the blocks per module (longest matching module path), in
// the modules' order, with the total last. Files of no listed module come
// under "other".
func summarize(blocks map[string]block, modules []string) []row {
	byLength := slices.Clone(modules)
	slices.SortFunc(byLength, func(a, b string) int { return len(b) - len(a) })
	sums := map[string]*row{}
	for _, m := range append(slices.Clone(modules), "other") {
		sums[m] = &row{module: m}
	}
	total := row{module: "total"}
	for key, b := range blocks {
		file, _, _ := strings.Cut(key, ":")
		m := "other"
		for _, mod := range byLength {
			if strings.HasPrefix(file, mod+"/") {
				m = mod
				break
			}
		}
		s := sums[m]
		s.stmts += b.stmts
		total.stmts += b.stmts
		if b.covered {
			s.covered += b.stmts
			total.covered += b.stmts
		}
	}
	var rows []row
	for _, m := range append(slices.Clone(modules), "other") {
		if s := sums[m]; s.stmts > 0 || m != "other" {
			rows = append(rows, *s)
		}
	}
	return append(rows, total)
}

func writeRows(w io.Writer, rows []row) {
	width := 0
	for _, r := range rows {
		width = max(width, len(r.module))
	}
	fmt.Fprintln(w, "statement coverage per module:")
	for _, r := range rows {
		pct := 0.0
		if r.stmts > 0 {
			pct = 100 * float64(r.covered) / float64(r.stmts)
		}
		fmt.Fprintf(w, "  %-*s %5.1f%%  (%d of %d statements)\n", width, r.module, pct, r.covered, r.stmts)
	}
}
