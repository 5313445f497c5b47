package main

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// modulePath is the module's import path (go.mod).
const modulePath = "github.com/grouprouter/grouprouter"

// layers are the module's packages from the ground up: a package's
// production code imports only packages of layers below its own (or of
// its own directory's internal ones). internal/ is the ground floor, what
// every library package stands on; the command, its internal packages and
// the integration tests sit at the top.
var layers = [][]string{
	{"internal/"},
	{"wire"},
	{"kvbinding"},
	{"proposals"},
	{"router"},
	{"consumer", "router/routertest"},
	{"permissions"},
	{"permissions/permtest"},
	{"cmd/grouprouter/internal/"},
	{"cmd/grouprouter"},
}

// layerOf returns the layer of the package in directory dir (relative to
// the module's root, slash-separated), -1 when no layer names it.
func layerOf(dir string) int {
	best, bestLen := -1, -1
	for i, names := range layers {
		for _, n := range names {
			prefix := strings.HasSuffix(n, "/") && strings.HasPrefix(dir+"/", n)
			if (dir == n || prefix) && len(n) > bestLen {
				best, bestLen = i, len(n)
			}
		}
	}
	return best
}

// TestImportLayers reads the import lines of every production file in the
// module and fails on an import that runs back up the house (issue 33:
// internal/ had five arrows into router, proposals and consumer).
func TestImportLayers(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	seen := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "integration") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(rel)
		from := layerOf(dir)
		if from < 0 {
			t.Errorf("%s: package directory %s is in no layer (add it to layers)", path, dir)
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		seen++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if !strings.HasPrefix(p, modulePath+"/") {
				continue
			}
			to := strings.TrimPrefix(p, modulePath+"/")
			switch l := layerOf(to); {
			case l < 0:
				t.Errorf("%s imports %s, which is in no layer", path, to)
			case l < from, l == 0 && from == 0:
				// down the house, or one foundation on another
			default:
				t.Errorf("%s (layer %v) imports %s (layer %v): an import must run down the house", path, layers[from], to, layers[l])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 50 {
		t.Fatalf("read %d files under %s: not the module", seen, root)
	}
}
