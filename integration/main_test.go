package integration

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// TestMain runs the parallel tests one more at a time than there are
// cores unless -parallel is given (doc.go says why), and removes the
// binary the upgrade tests built.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", strconv.Itoa(runtime.GOMAXPROCS(0)+1))
	}
	code := m.Run()
	if current.dir != "" {
		_ = os.RemoveAll(current.dir)
	}
	os.Exit(code)
}
