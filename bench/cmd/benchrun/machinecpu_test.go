package main

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// A command may hold spaces and parentheses: the fields are counted from the
// last closing parenthesis, or a process named "a) (b" would read another
// field as its parent and its CPU time.
func TestParseProcStatCountsFromTheLastParenthesis(t *testing.T) {
	stat := "4242 (a) (b c) S 17 4242 4242 0 -1 4194304 100 0 0 0 250 30 7 3 20 0 4 0 1000 2000000 300 18446744073709551615\n"
	p, ok := parseProcStat([]byte(stat))
	if !ok {
		t.Fatal("parseProcStat refused a well-formed line")
	}
	if p.comm != "a) (b c" || p.ppid != 17 {
		t.Fatalf("comm %q, ppid %d; want \"a) (b c\", 17", p.comm, p.ppid)
	}
	if want := (250 + 30 + 7 + 3) * 10 * time.Millisecond; p.cpu != want {
		t.Fatalf("cpu %v, want %v (utime, stime and the reaped children's cutime and cstime)", p.cpu, want)
	}
	if _, ok := parseProcStat([]byte("4242 (cut short) S 17")); ok {
		t.Fatal("parseProcStat took a line without its time fields")
	}
}

func TestMachineTicksSplitsProcessesInterruptsAndSteal(t *testing.T) {
	stat := "cpu  100 5 40 9000 300 2 3 70 0 0\ncpu0 50 2 20 4500 150 1 1 35 0 0\n"
	busy, irq, steal := machineTicks([]byte(stat))
	if busy != 1450*time.Millisecond || irq != 50*time.Millisecond || steal != 700*time.Millisecond {
		t.Fatalf("busy %v irq %v steal %v, want 1.45s (user, nice, system), 50ms (irq, softirq) and 700ms; idle and iowait in none", busy, irq, steal)
	}
}

func TestDescendsFromFollowsParentsAndStopsOnACycle(t *testing.T) {
	procs := map[int]proc{1: {ppid: 0}, 10: {ppid: 1}, 11: {ppid: 10}, 12: {ppid: 11}, 20: {ppid: 1}, 30: {ppid: 31}, 31: {ppid: 30}}
	for pid, want := range map[int]bool{10: true, 11: true, 12: true, 20: false, 1: false, 30: false, 99: false} {
		if got := descendsFrom(procs, pid, 10); got != want {
			t.Errorf("descendsFrom(%d, 10) = %v, want %v", pid, got, want)
		}
	}
}

// What is neither the bench nor the server is the others'; the shares are of
// the machine's capacity over the span, and a flagged share says so.
func TestSharesSinceAreTheOthersShareOfTheMachine(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := cpuSample{at: t0, busy: 10 * time.Second, irq: time.Second, steal: time.Second, postgres: 4 * time.Second, bench: 3 * time.Second, kernel: time.Second}
	capacity := 10 * time.Second * time.Duration(runtime.NumCPU())
	b := cpuSample{at: t0.Add(10 * time.Second), busy: a.busy + capacity/2, irq: a.irq + capacity/20, steal: a.steal + capacity/100,
		postgres: a.postgres + capacity/5, bench: a.bench + capacity/10, kernel: a.kernel + capacity/20}
	s := b.sharesSince(a)
	if !near(s.Other, 0.15) || !near(s.Kernel, 0.1) || !near(s.Steal, 0.01) {
		t.Fatalf("shares %+v, want other 0.15 (0.5 busy − 0.2 server − 0.1 bench − 0.05 kernel threads), kernel 0.1 (threads and interrupts) and steal 0.01", s)
	}
	if got := s.String(); !strings.Contains(got, "15 %") || !strings.Contains(got, "quieter machine") {
		t.Fatalf("String() = %q: want the share and the flag past %.0f %%", got, 100*otherCPUFlag)
	}
	if got := (cpuShares{Other: 0.02}).String(); strings.Contains(got, "quieter machine") {
		t.Fatalf("String() = %q flags a quiet machine", got)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
