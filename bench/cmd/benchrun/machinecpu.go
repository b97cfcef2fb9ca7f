package main

// Who else used the machine during a workload. Every figure of the suite is a
// ratio against a peer run on the same machine in the same minutes, which
// cancels a steady load but not one that comes and goes: another engineer's
// test suite starting half-way through R1 slows one system's runs and not
// its peer's. The bench cannot stop that, but it can say so. Each workload's
// note gives the share of the machine's CPU used by processes that are
// neither the bench (its process and every process it started: relays,
// consoles, pgbench) nor the PostgreSQL server nor the kernel, and the share
// the hypervisor took (steal), and flags a workload where either was large
// enough to move its figures. The kernel's share (its threads, interrupts
// and soft interrupts: the disk's completions and write-back of the
// workload's own pages, mostly) is given apart and not flagged.

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Above these shares of the machine's CPU a workload's figures are flagged:
// a tenth of the machine taken by others moves a CPU-bound rate by about as
// much as the runs' own spread.
const otherCPUFlag, stealCPUFlag = 0.10, 0.05

// cpuSample is the machine's CPU time so far, split by whose it is.
type cpuSample struct {
	at       time.Time
	busy     time.Duration // every CPU's time in processes (user, nice, system)
	irq      time.Duration // in interrupts and soft interrupts
	steal    time.Duration
	postgres time.Duration
	bench    time.Duration
	kernel   time.Duration // kernel threads (kthreadd, pid 2, and its children)
}

// cpuShares is what a workload's span of time used, as shares of the
// machine's capacity (elapsed time × CPUs).
type cpuShares struct {
	Other  float64 `json:"other_cpu_share"`
	Kernel float64 `json:"kernel_cpu_share"`
	Steal  float64 `json:"steal_cpu_share"`
}

func (s cpuShares) String() string {
	t := fmt.Sprintf("other processes used %.0f %% of the machine's CPU, the kernel %.0f %%, steal %.0f %%", 100*s.Other, 100*s.Kernel, 100*s.Steal)
	if s.Other > otherCPUFlag || s.Steal > stealCPUFlag {
		t += " (enough to move this workload's figures: run it again on a quieter machine)"
	}
	return t
}

// sampleCPU reads /proc: the machine's counters, then every process's.
func sampleCPU() cpuSample {
	s := cpuSample{at: time.Now()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		s.busy, s.irq, s.steal = machineTicks(b)
	}
	procs := readProcs()
	self := os.Getpid()
	for pid, p := range procs {
		switch {
		case p.comm == "postgres":
			s.postgres += p.cpu
		case descendsFrom(procs, pid, self):
			s.bench += p.cpu
		case descendsFrom(procs, pid, kthreadd):
			s.kernel += p.cpu
		}
	}
	return s
}

// sharesSince is what was used between a and s.
func (s cpuSample) sharesSince(a cpuSample) cpuShares {
	capacity := float64(s.at.Sub(a.at)) * float64(runtime.NumCPU())
	if capacity <= 0 {
		return cpuShares{}
	}
	kernel := (s.kernel - a.kernel) + (s.irq - a.irq)
	other := (s.busy - a.busy) - (s.postgres - a.postgres) - (s.bench - a.bench) - (s.kernel - a.kernel)
	return cpuShares{Other: max(float64(other), 0) / capacity, Kernel: float64(kernel) / capacity, Steal: float64(s.steal-a.steal) / capacity}
}

// kthreadd is the kernel threads' parent.
const kthreadd = 2

// machineTicks reads /proc/stat's first line (every CPU): user, nice,
// system, idle, iowait, irq, softirq, steal, …, in clock ticks of 10 ms.
// Busy is user, nice and system (guest time is inside user), which the
// processes' own times add up to; interrupts are no process's.
func machineTicks(stat []byte) (busy, irq, steal time.Duration) {
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, 0
	}
	n := make([]int64, 8)
	for i := range n {
		n[i], _ = strconv.ParseInt(f[i+1], 10, 64)
	}
	tick := 10 * time.Millisecond
	return time.Duration(n[0]+n[1]+n[2]) * tick, time.Duration(n[5]+n[6]) * tick, time.Duration(n[7]) * tick
}

// proc is one process as /proc/PID/stat gives it.
type proc struct {
	comm string
	ppid int
	cpu  time.Duration // user + system, its own and its reaped children's
}

func readProcs() map[int]proc {
	dirs, _ := os.ReadDir("/proc")
	procs := make(map[int]proc, len(dirs))
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/stat")
		if err != nil {
			continue
		}
		if p, ok := parseProcStat(b); ok {
			procs[pid] = p
		}
	}
	return procs
}

// parseProcStat reads "PID (COMM) STATE PPID … UTIME STIME CUTIME CSTIME …":
// the command may hold spaces and parentheses, so the fields are counted
// from its last closing parenthesis; PPID is the 2nd field after it, the
// times the 12th to 15th (clock ticks of 10 ms). A child's time moves into
// its parent's CUTIME and CSTIME when the parent reaps it, so a process
// tree's sum stays whole as its members exit.
func parseProcStat(b []byte) (proc, bool) {
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return proc{}, false
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 15 {
		return proc{}, false
	}
	p := proc{comm: string(b[open+1 : end])}
	p.ppid, _ = strconv.Atoi(f[1])
	var ticks int64
	for _, v := range f[11:15] {
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	p.cpu = time.Duration(ticks) * 10 * time.Millisecond
	return p, true
}

// descendsFrom says whether pid is root or one of its descendants.
func descendsFrom(procs map[int]proc, pid, root int) bool {
	for range len(procs) + 1 { // bounded: a cycle would be a torn read
		if pid == root {
			return true
		}
		p, ok := procs[pid]
		if !ok || p.ppid == 0 {
			return false
		}
		pid = p.ppid
	}
	return false
}
