package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"runtime/debug"
	"strings"
)

// buildVersion is what the binary says of its build: the module version
// and the VCS stamp the go command records (go build and go install in a
// repository; none in tests or with -buildvcs=false).
type buildVersion struct {
	// Version is the module version, "(devel)" for a build from a
	// checkout without a version.
	Version string `json:"version"`
	// Revision is the commit (vcs.revision), Modified whether the work
	// tree had changes (vcs.modified), Time the commit's time (vcs.time).
	Revision string `json:"revision,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Time     string `json:"time,omitempty"`
	Go       string `json:"go"`
}

// readVersion reads the running binary's build information.
func readVersion() buildVersion {
	bi, _ := debug.ReadBuildInfo()
	return versionOf(bi)
}

// versionOf extracts the version of bi (nil: none recorded).
func versionOf(bi *debug.BuildInfo) buildVersion {
	v := buildVersion{Version: "(devel)"}
	if bi == nil {
		return v
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	v.Go = bi.GoVersion
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		case "vcs.time":
			v.Time = s.Value
		}
	}
	return v
}

// String is the one line of grouprouter --version, e.g.
// "grouprouter (devel), revision 58bf091..., modified, committed 2026-12-06T05:50:00Z, go1.26.0".
func (v buildVersion) String() string {
	parts := []string{"grouprouter " + v.Version}
	if v.Revision != "" {
		parts = append(parts, "revision "+v.Revision)
	}
	if v.Modified {
		parts = append(parts, "modified")
	}
	if v.Time != "" {
		parts = append(parts, "committed "+v.Time)
	}
	if v.Go != "" {
		parts = append(parts, v.Go)
	}
	return strings.Join(parts, ", ")
}

// revision is the start line's revision: the commit, "+modified" when
// the work tree had changes, "" without a VCS stamp.
func (v buildVersion) revision() string {
	if v.Revision != "" && v.Modified {
		return v.Revision + "+modified"
	}
	return v.Revision
}

// versionOptions are the version command's flags.
type versionOptions struct {
	asJSON bool
}

func newVersionFlags(fs *flag.FlagSet) *versionOptions {
	o := &versionOptions{}
	fs.BoolVar(&o.asJSON, "json", false, "print a JSON object instead of a line")
	return o
}

const versionHelp = `Usage: grouprouter version [flags]
       grouprouter --version

Prints the module version ("(devel)" for a build from a checkout), the
VCS revision it was built from (with "modified" when the work tree had
changes) and that commit's time, as the go command recorded them, and the
Go version.

Flags:
`

func (o *versionOptions) check(*invocation) error { return nil }

func (o *versionOptions) run(_ context.Context, in *invocation) error {
	v := readVersion()
	if o.asJSON {
		enc := json.NewEncoder(in.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	_, err := fmt.Fprintln(in.stdout, v)
	return err
}
