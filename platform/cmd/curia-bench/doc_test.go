package main

import (
	"os"
	"path/filepath"
	"testing"
)

// The generated tables of docs/operating/benchmarks.md are what doc renders
// from the committed bench/results.json: a hand edit or a stale table fails.
func TestBenchmarksPageUpToDate(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..", "..")
	rep, err := readReport(filepath.Join(root, "bench", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(root, "docs", "operating", "benchmarks.md"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := generatedSection(string(page))
	if err != nil {
		t.Fatal(err)
	}
	if want := renderDoc(rep, knownTargets); got != want {
		t.Errorf("docs/operating/benchmarks.md's generated tables differ from what bench/results.json renders: run make bench-doc (edit the prose outside the bench:begin/bench:end markers, not the tables)\n got:\n%s\nwant:\n%s", got, want)
	}
}
