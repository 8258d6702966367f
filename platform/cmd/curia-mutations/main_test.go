package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"testing"
)

// TestCatalogNamesEveryMutation: every mutation platform/failpoint
// declares has a catching test in the catalog, and the catalog names none
// it does not declare.
func TestCatalogNamesEveryMutation(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../../failpoint/mutations.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var declared []string
	ast.Inspect(f, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			s, _ := strconv.Unquote(lit.Value)
			declared = append(declared, s)
		}
		return true
	})
	if len(declared) < 10 {
		t.Fatalf("found only %d mutations in mutations.go: %v", len(declared), declared)
	}
	var listed []string
	for _, e := range catalog {
		if slices.Contains(listed, e.Mutation) {
			t.Errorf("%s is listed twice", e.Mutation)
		}
		listed = append(listed, e.Mutation)
		if !slices.Contains(declared, e.Mutation) {
			t.Errorf("the catalog lists %s, which platform/failpoint does not declare", e.Mutation)
		}
		if e.Mechanism == "" || e.Package == "" || e.Test == "" {
			t.Errorf("%s: mechanism, package and test are all needed: %+v", e.Mutation, e)
		}
	}
	for _, d := range declared {
		if !slices.Contains(listed, d) {
			t.Errorf("platform/failpoint declares %s, and the catalog names no test that catches it", d)
		}
	}
}
