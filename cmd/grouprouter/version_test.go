package main

import (
	"encoding/json"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionOf(t *testing.T) {
	stamped := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/grouprouter/grouprouter", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{{Key: "-buildmode", Value: "exe"}, {Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "58bf091c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a"}, {Key: "vcs.time", Value: "2026-12-06T05:50:00Z"},
			{Key: "vcs.modified", Value: "true"}}}
	for _, tt := range []struct {
		name     string
		bi       *debug.BuildInfo
		line     string
		revision string
	}{
		{"stamped", stamped,
			"grouprouter v1.2.3, revision 58bf091c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a, modified, committed 2026-12-06T05:50:00Z, go1.26.0",
			"58bf091c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a+modified"},
		{"checkout, clean", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "false"}}},
			"grouprouter (devel), revision abc, go1.26.0", "abc"},
		{"no version", &debug.BuildInfo{GoVersion: "go1.26.0"}, "grouprouter (devel), go1.26.0", ""},
		{"no build info", nil, "grouprouter (devel)", ""},
	} {
		v := versionOf(tt.bi)
		if v.String() != tt.line || v.revision() != tt.revision {
			t.Errorf("%s: %q, revision %q; want %q, %q", tt.name, v.String(), v.revision(), tt.line, tt.revision)
		}
	}
}

// TestVersionCommand: --version, -version and version print the line;
// version --json the object.
func TestVersionCommand(t *testing.T) {
	want := readVersion().String() + "\n"
	for _, args := range [][]string{{"--version"}, {"-version"}, {"version"}} {
		if code, stdout, stderr := runCommand(t, args...); code != exitOK || stdout != want || stderr != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %q", args, code, stdout, stderr, want)
		}
	}
	code, stdout, _ := runCommand(t, "version", "--json")
	var v buildVersion
	if err := json.Unmarshal([]byte(stdout), &v); code != exitOK || err != nil || v != readVersion() || !strings.HasPrefix(v.Go, "go") {
		t.Errorf("version --json: exit %d, %v, %q", code, err, stdout)
	}
	if code, _, stderr := runCommand(t, "version", "x"); code != exitUsage || !strings.Contains(stderr, `unexpected argument "x"`) {
		t.Errorf("version x: exit %d, %q", code, stderr)
	}
	if _, stdout, _ := runCommand(t, "help"); !strings.Contains(stdout, "\n  version ") {
		t.Errorf("help does not list version:\n%s", stdout)
	}
}
