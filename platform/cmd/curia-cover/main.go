// Command curia-cover prints the statement coverage of each Go module of
// the workspace from one coverage profile, as `go test -coverprofile`
// writes it for many packages at once, and the total. `make test` runs it
// after the tests:
//
//	go test -race -cover -coverprofile .cover/profile.out work
//	curia-cover .cover/profile.out              # modules from `go list -m`
//	curia-cover .cover/profile.out curia.dev/platform curia.dev/gen
//
// With -covdata DIR, the counters that binaries built with -cover wrote to
// DIR (GOCOVERDIR: the service processes the tests started, see
// platform/proctest) count too: a second column gives each module's
// coverage with them, next to the tests' own.
//
//	curia-cover -covdata .cover/covdata .cover/profile.out
//
// A statement belongs to the module whose path is the longest prefix of its
// file's import path. A block listed more than once (one package's tests
// and another's, under -coverpkg) counts once, covered if any run covered
// it. Packages without tests count too, at zero: go test lists their
// statements in the profile. The processes' blocks add to them the same
// way: a block counts once, covered if a test or a process ran it.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

func main() {
	covdata := flag.String("covdata", "", "also count the counters binaries built with -cover wrote to this `dir` (their GOCOVERDIR)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: curia-cover [-covdata DIR] PROFILE [MODULE...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() < 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(os.Stdout, flag.Arg(0), *covdata, flag.Args()[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "curia-cover:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, profile, covdata string, modules []string) error {
	if len(modules) == 0 {
		out, err := exec.Command("go", "list", "-m").Output()
		if err != nil {
			return fmt.Errorf("go list -m: %w", err)
		}
		modules = strings.Fields(string(out))
	}
	blocks := map[string]block{}
	if err := parseFile(profile, blocks); err != nil {
		return err
	}
	if covdata == "" {
		writeRows(w, summarize(blocks, modules))
		return nil
	}
	tests := summarize(blocks, modules)
	if err := parseCovdata(covdata, blocks); err != nil {
		return err
	}
	writeColumns(w, tests, summarize(blocks, modules))
	return nil
}

func parseFile(profile string, blocks map[string]block) error {
	f, err := os.Open(profile) //nolint:gosec // G703: the profile is the path its user passes on the command line
	if err != nil {
		return err
	}
	defer f.Close()
	if err := parse(f, blocks); err != nil {
		return fmt.Errorf("%s: %w", profile, err)
	}
	return nil
}

// parseCovdata adds the blocks of the counters in dir, turned into a
// profile of the same format by `go tool covdata textfmt` (an empty one
// when no process wrote any).
func parseCovdata(dir string, blocks map[string]block) error {
	tmp, err := os.MkdirTemp("", "curia-cover-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	profile := filepath.Join(tmp, "processes.out")
	out, err := exec.Command("go", "tool", "covdata", "textfmt", "-i="+dir, "-o="+profile).CombinedOutput() //nolint:gosec // G204: dir is the path its user passes on the command line
	if err != nil {
		return fmt.Errorf("go tool covdata textfmt -i=%s: %w\n%s", dir, err, out)
	}
	return parseFile(profile, blocks)
}

// block is one line of a profile: statements in a range of a file.
type block struct {
	stmts   int
	covered bool
}

// parse reads a profile ("mode: atomic", then "file:l.c,l.c stmts count"
// lines) into blocks, keyed by file and range.
func parse(r io.Reader, blocks map[string]block) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "mode:") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			return fmt.Errorf("line %d: not file:range stmts count: %q", n, line)
		}
		stmts, err1 := strconv.Atoi(fields[1])
		count, err2 := strconv.Atoi(fields[2])
		if err := errors.Join(err1, err2); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
		key := fields[0]
		b := blocks[key]
		b.stmts = stmts
		b.covered = b.covered || count > 0
		blocks[key] = b
	}
	return sc.Err()
}

// row is one module's statements and how many of them ran.
type row struct {
	module         string
	stmts, covered int
}

// summarize sums the blocks per module (longest matching module path), in
// the modules' order, with the total last. Files of no listed module come
// under "other" (a row only when there are some).
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

func (r row) percent() float64 {
	if r.stmts == 0 {
		return 0
	}
	return 100 * float64(r.covered) / float64(r.stmts)
}

func width(rows []row) int {
	w := 0
	for _, r := range rows {
		w = max(w, len(r.module))
	}
	return w
}

func writeRows(w io.Writer, rows []row) {
	width := width(rows)
	fmt.Fprintln(w, "statement coverage per module:")
	for _, r := range rows {
		fmt.Fprintf(w, "  %-*s %5.1f%%  (%d of %d statements)\n", width, r.module, r.percent(), r.covered, r.stmts)
	}
}

// writeColumns writes each module's coverage in the test binaries alone
// and with the processes' counters, and the statements of the latter (a
// file only the processes built, behind a build tag, adds some).
func writeColumns(w io.Writer, tests, all []row) {
	byModule := map[string]row{}
	for _, r := range tests {
		byModule[r.module] = r
	}
	width := width(all)
	fmt.Fprintln(w, "statement coverage per module, in the test binaries (tests) and with the processes they started (+processes):")
	fmt.Fprintf(w, "  %-*s %7s  %10s\n", width, "", "tests", "+processes")
	for _, r := range all {
		fmt.Fprintf(w, "  %-*s %6.1f%%  %9.1f%%  (%d of %d statements)\n", width, r.module, byModule[r.module].percent(), r.percent(), r.covered, r.stmts)
	}
}
