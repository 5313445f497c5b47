//go:build !unix

package bench

import "os"

// selfUsage is not available here: CPU and RSS figures read 0.
func selfUsage() usage { return usage{} }

func processUsage(ps *os.ProcessState) usage {
	if ps == nil {
		return usage{}
	}
	return usage{User: ps.UserTime(), Sys: ps.SystemTime()}
}

func terminate(p *os.Process) error { return p.Kill() }

var stopSignals = []os.Signal{os.Interrupt}
