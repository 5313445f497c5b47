package router

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// engineDoor is what a shell may call on the engine (input.go): the one
// input method, the pulls and the views.
var engineDoor = map[string]bool{
	"step": true,
	// pulls
	"take": true, "askBatch": true, "fairRead": true, "reap": true, "checkpoint": true, "undecided": true,
	// views
	"full": true, "position": true, "nextDue": true, "busyGroups": true, "retryingGroups": true, "heldBack": true,
	"fenced": true, "takeoverFrom": true, "ungroupedDestination": true, "holds": true, "stopping": true,
	"publishing": true, "fairBusy": true, "readFrom": true,
}

// TestShellsUseTheEngineDoor: outside the engine's own methods, the
// production code reaches the engine (Router.eng) only by calling a method
// of its door: no field of it is read or written, and no input method is
// called but through step.
func TestShellsUseTheEngineDoor(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var bad []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		calls := map[*ast.SelectorExpr]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok {
				if s, ok := c.Fun.(*ast.SelectorExpr); ok {
					calls[s] = true
				}
			}
			return true
		})
		ast.Inspect(f, func(n ast.Node) bool {
			s, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			inner, ok := s.X.(*ast.SelectorExpr)
			if !ok || inner.Sel.Name != "eng" {
				return true
			}
			if !calls[s] || !engineDoor[s.Sel.Name] {
				bad = append(bad, fset.Position(s.Pos()).String()+": eng."+s.Sel.Name)
			}
			return true
		})
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Errorf("a shell reaches into the engine past its door (input.go): %s", b)
	}
}
