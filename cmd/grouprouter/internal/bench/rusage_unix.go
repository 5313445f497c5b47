//go:build unix

package bench

import (
	"os"
	"runtime"
	"syscall"
	"time"
)

// selfUsage returns this process's CPU time (user, system) and peak RSS
// in bytes, from getrusage(RUSAGE_SELF).
func selfUsage() usage {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return usage{}
	}
	return fromRusage(&ru)
}

// processUsage returns the rusage of an exited child.
func processUsage(ps *os.ProcessState) usage {
	if ps == nil {
		return usage{}
	}
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok || ru == nil {
		return usage{User: ps.UserTime(), Sys: ps.SystemTime()}
	}
	return fromRusage(ru)
}

func fromRusage(ru *syscall.Rusage) usage {
	rss := int64(ru.Maxrss)
	if runtime.GOOS != "darwin" {
		rss *= 1024 // kilobytes everywhere but macOS
	}
	return usage{
		User:   time.Duration(ru.Utime.Nano()),
		Sys:    time.Duration(ru.Stime.Nano()),
		MaxRSS: rss,
	}
}

// terminate asks a child to stop (it drains).
func terminate(p *os.Process) error { return p.Signal(syscall.SIGTERM) }

// stopSignals are the signals a child drains on.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}
