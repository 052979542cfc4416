package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Memory watchdog. A sandbox at its memory limit does not always meet the
// kernel's OOM killer: the kernel keeps reclaiming the page cache its
// programs run from and reading it back, which makes progress in its
// eyes, and under emulation (TCG) each of those reads is slow enough to
// stall the sandbox for minutes. The watchdog ends such a stall as the
// OOM killer would: when the sandbox's memory is nearly full and its
// processes spend most of their time stalled on memory (PSI "full"), it
// kills the largest of them and counts an OOM kill.
const (
	memWatchEvery = 250 * time.Millisecond
	// memStallPct is the share of time (PSI full avg10, percent) the
	// sandbox stalls on memory above which it counts as thrashing.
	memStallPct = 20
	// memStallTicks is how many checks in a row must see it.
	memStallTicks = 4
)

// watchMemory runs until the sandbox ends.
func (s *sandbox) watchMemory(limit int64) {
	t := time.NewTicker(memWatchEvery)
	defer t.Stop()
	stalled := 0
	for {
		select {
		case <-s.exited:
			return
		case <-t.C:
		}
		cur := readInt(sandboxCgroup + "/memory.current")
		if cur*10 >= limit*9 && memStall() >= memStallPct {
			stalled++
		} else {
			stalled = 0
		}
		if stalled >= memStallTicks {
			if killLargest(sandboxCgroup) {
				s.watchdogKills.Add(1)
			}
			stalled = 0
		}
	}
}

func readInt(p string) int64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// memStall reads the sandbox's "full" memory pressure over 10 seconds.
func memStall() float64 {
	b, err := os.ReadFile(sandboxCgroup + "/memory.pressure")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "full ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "avg10="); ok {
				x, _ := strconv.ParseFloat(v, 64)
				return x
			}
		}
	}
	return 0
}

// killLargest kills the process with the most resident memory in cg or
// below it.
func killLargest(cg string) bool {
	best, bestRSS := 0, int64(-1)
	_ = filepath.WalkDir(cg, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			statm, err := os.ReadFile("/proc/" + f + "/statm")
			if err != nil || pid <= 1 {
				continue
			}
			fields := strings.Fields(string(statm))
			if len(fields) < 2 {
				continue
			}
			rss, _ := strconv.ParseInt(fields[1], 10, 64)
			if rss > bestRSS {
				best, bestRSS = pid, rss
			}
		}
		return nil
	})
	if best == 0 {
		return false
	}
	return syscall.Kill(best, syscall.SIGKILL) == nil
}
