// Package docindex checks a package doc's "Files:" index against the
// package's directory: every file it names exists, and every non-test Go
// file of the package is named. An index that drifts misleads the next
// reader more than no index.
package docindex

import (
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var goFile = regexp.MustCompile(`\b[a-z0-9_]+\.go\b`)

// Check fails t when the package in the current directory (a test's
// working directory is its package's) has a "Files:" index in its package
// doc that names a file that is not there, or misses one that is.
func Check(t testing.TB) {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var index string
	var files []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		files = append(files, name)
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			t.Fatal(err)
		}
		if f.Doc == nil {
			continue
		}
		if doc := f.Doc.Text(); strings.Contains(doc, "Files:") {
			index = doc[strings.Index(doc, "Files:"):]
		}
	}
	if index == "" {
		t.Fatal("the package doc has no \"Files:\" index")
	}
	named := goFile.FindAllString(index, -1)
	for _, n := range named {
		if !slices.Contains(files, n) {
			t.Errorf("the package doc's Files: index names %s, which is not a file of the package", n)
		}
	}
	for _, f := range files {
		if !slices.Contains(named, f) {
			t.Errorf("%s is not in the package doc's Files: index: say what it holds", f)
		}
	}
}
