// Package scripttest runs data-driven test scripts, in the style of etcd
// raft's: a script is a series of blocks, each its commands, a line
// "----", the output they must give, and a blank line. Lines of commands
// starting with # are comments. With rewrite set, the file is written
// again with the outputs the commands gave (go test -run X -rewrite), to
// be read and committed.
package scripttest

import (
	"bufio"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// rewrite is the -rewrite flag of every test binary that runs scripts.
var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of testdata scripts")

// RunDir runs every script dir/*.txt as a subtest of its own, each with
// the command runner newRunner returns for it (a fresh state per script).
func RunDir(t *testing.T, dir string, newRunner func() func(cmd string) ([]string, error)) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts under %s: %v", dir, err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) { Run(t, file, *rewrite, newRunner()) })
	}
}

// Fields splits a command line into its name, its bare arguments and its
// key=value arguments.
func Fields(cmd string) (name string, bare []string, kv map[string]string) {
	fields := strings.Fields(cmd)
	if len(fields) == 0 {
		return "", nil, nil
	}
	kv = map[string]string{}
	for _, a := range fields[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			kv[k] = v
		} else {
			bare = append(bare, a)
		}
	}
	return fields[0], bare, kv
}

// Block is one block of a script: its command lines and its expected
// output lines.
type Block struct {
	Cmds []string
	Want []string
}

// Parse reads the blocks of a script.
func Parse(text string) []Block {
	var (
		blocks []Block
		cur    Block
		inWant bool
	)
	flush := func() {
		if len(cur.Cmds) > 0 || len(cur.Want) > 0 {
			blocks = append(blocks, cur)
		}
		cur, inWant = Block{}, false
	}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			flush()
		case line == "----":
			inWant = true
		case inWant:
			cur.Want = append(cur.Want, line)
		default:
			cur.Cmds = append(cur.Cmds, line)
		}
	}
	flush()
	return blocks
}

// Run runs the script in file: every command of a block (comments
// skipped) goes to run, and the lines they return, together, must be the
// block's expected output. A command run fails with is a fatal error.
func Run(t *testing.T, file string, rewrite bool, run func(cmd string) ([]string, error)) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for _, b := range Parse(string(data)) {
		var got []string
		for _, cmd := range b.Cmds {
			if strings.HasPrefix(cmd, "#") {
				continue
			}
			lines, err := run(cmd)
			if err != nil {
				t.Fatalf("%s: %q: %v", file, cmd, err)
			}
			got = append(got, lines...)
		}
		for _, cmd := range b.Cmds {
			out.WriteString(cmd + "\n")
		}
		if len(got) > 0 || len(b.Want) > 0 {
			out.WriteString("----\n")
			for _, l := range got {
				out.WriteString(l + "\n")
			}
		}
		out.WriteString("\n")
		if !rewrite && !slices.Equal(got, b.Want) {
			t.Errorf("%s:\n%s\ngot:\n  %s\nwant:\n  %s", file, strings.Join(b.Cmds, "\n"), strings.Join(got, "\n  "), strings.Join(b.Want, "\n  "))
		}
	}
	if rewrite {
		if err := os.WriteFile(file, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
