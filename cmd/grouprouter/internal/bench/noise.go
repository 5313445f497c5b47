package bench

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"time"
)

// machineBusy returns the CPU time all processes of the machine have used
// since boot (user, nice, system, irq, softirq, steal from /proc/stat), or
// false where there is no /proc/stat. Together with this process's and its
// children's own CPU time it tells how much of the machine other processes
// took during a run: the benchmark shares its cores with them.
func machineBusy() (time.Duration, bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, false
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0, false
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system irq softirq steal
		v, err := strconv.ParseInt(fields[i], 10, 64)
		if err != nil {
			return 0, false
		}
		ticks += v
	}
	const userHZ = 100 // USER_HZ, 100 on every Linux configuration in use
	return time.Duration(ticks) * (time.Second / userHZ), true
}

// cpuWatch measures, over an interval, the CPU time of the machine, of this
// process and of measured children.
type cpuWatch struct {
	machine  time.Duration
	ok       bool
	self     time.Duration
	syscalls uint64 // this process's read and write system calls
	start    time.Time
}

func startCPUWatch() cpuWatch {
	m, ok := machineBusy()
	return cpuWatch{machine: m, ok: ok, self: selfUsage().CPU(), syscalls: ioSyscalls(), start: time.Now()}
}

// ioSyscalls returns the read and write system calls this process made so
// far (syscr + syscw of /proc/self/io), 0 where there is no such file.
func ioSyscalls() uint64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	var n uint64
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if ok && (k == "syscr" || k == "syscw") {
			c, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			n += c
		}
	}
	return n
}

// foreign returns the share of the machine's capacity (0..1) used by other
// processes since the watch started, given the CPU time the measured
// children used meanwhile; -1 when unknown.
func (w cpuWatch) foreign(children time.Duration, cpus int) float64 {
	m, ok := machineBusy()
	el := time.Since(w.start)
	if !ok || !w.ok || el <= 0 || cpus <= 0 {
		return -1
	}
	other := (m - w.machine) - (selfUsage().CPU() - w.self) - children
	return max(float64(other)/(float64(el)*float64(cpus)), 0)
}

// peakRSS returns this process's peak resident set size in bytes from
// /proc/self/status (VmHWM), or false where there is none. It is preferred
// to getrusage's ru_maxrss: a child started by os/exec (clone with
// CLONE_VM|CLONE_VFORK) inherits its parent's high-water mark there, so
// every child would report at least the parent's peak.
func peakRSS() (int64, bool) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, false
			}
			return kb * 1024, true
		}
	}
	return 0, false
}
