package nvidia

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor/gpu"
)

// procStatus is what /proc/PID/status says of a task.
type procStatus struct {
	PID   int
	Tgid  int
	State byte // R, S, D, T (stopped), t (traced), Z, ...
}

// parseStatus reads the Pid, Tgid and State lines of a /proc status file.
func parseStatus(b []byte) (procStatus, error) {
	var st procStatus
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Pid":
			n, err := strconv.Atoi(v)
			if err != nil {
				return st, fmt.Errorf("status: Pid %q: %w", v, err)
			}
			st.PID = n
			seen++
		case "Tgid":
			n, err := strconv.Atoi(v)
			if err != nil {
				return st, fmt.Errorf("status: Tgid %q: %w", v, err)
			}
			st.Tgid = n
			seen++
		case "State":
			if v == "" {
				return st, errors.New("status: empty State")
			}
			st.State = v[0]
			seen++
		}
	}
	if seen < 3 {
		return st, errors.New("status: no Pid, Tgid and State lines")
	}
	return st, sc.Err()
}

// readStatus reads /proc/PID/status under procRoot.
func readStatus(procRoot string, pid int) (procStatus, error) {
	if pid <= 0 {
		return procStatus{}, fmt.Errorf("pid %d: %w", pid, gpu.ErrNoProcess)
	}
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "status"))
	if errors.Is(err, fs.ErrNotExist) {
		return procStatus{}, fmt.Errorf("pid %d: %w", pid, gpu.ErrNoProcess)
	}
	if err != nil {
		return procStatus{}, err
	}
	return parseStatus(b)
}

// ErrThread: a pid names a thread, not a process.
var ErrThread = errors.New("pid is a thread, not a process")

// checkProcess validates pid for a checkpoint or restore: it must be a
// live process (its own thread group leader, Tgid == Pid: a thread id
// would act on the wrong task), not a zombie, and not stopped. A frozen
// cgroup is checked by the caller.
func checkProcess(procRoot string, pid int) error {
	st, err := readStatus(procRoot, pid)
	if err != nil {
		return err
	}
	switch {
	case st.Tgid != st.PID:
		return fmt.Errorf("pid %d: %w (it is a thread of process %d)", pid, ErrThread, st.Tgid)
	case st.State == 'Z' || st.State == 'X':
		return fmt.Errorf("pid %d is a zombie: %w", pid, gpu.ErrNoProcess)
	case st.State == 'T' || st.State == 't':
		return fmt.Errorf("pid %d: %w (never checkpoint or restore a frozen process: checkpoint before freeze, thaw before restore)", pid, gpu.ErrStopped)
	}
	return nil
}

// alive reports whether pid is a live (non-zombie) process.
func alive(procRoot string, pid int) bool {
	st, err := readStatus(procRoot, pid)
	return err == nil && st.State != 'Z' && st.State != 'X'
}

// stopped reports whether pid is in the stopped state.
func stopped(procRoot string, pid int) bool {
	st, err := readStatus(procRoot, pid)
	return err == nil && (st.State == 'T' || st.State == 't')
}

// parseStat returns the process group of a /proc/PID/stat line: the
// fifth field, counted after the command name in parentheses (which may
// hold spaces and parentheses itself).
func parseStatPgrp(b []byte) (int, error) {
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("stat: no command name")
	}
	f := strings.Fields(s[i+1:])
	// state ppid pgrp ...
	if len(f) < 3 {
		return 0, errors.New("stat: too short")
	}
	return strconv.Atoi(f[2])
}

// pgroupMembers lists the live processes of process group pgid.
func pgroupMembers(procRoot string, pgid int) ([]int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "stat"))
		if err != nil {
			continue
		}
		if g, err := parseStatPgrp(b); err == nil && g == pgid && alive(procRoot, pid) {
			out = append(out, pid)
		}
	}
	return out, nil
}

// cgroupOf returns the path of pid's cgroup: in the v1 freezer hierarchy,
// or the v2 one ("0::/path"), from /proc/PID/cgroup.
func parseProcCgroup(b []byte, v2 bool) (string, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if v2 && parts[0] == "0" && parts[1] == "" {
			return parts[2], true
		}
		if !v2 {
			for _, c := range strings.Split(parts[1], ",") {
				if c == "freezer" {
					return parts[2], true
				}
			}
		}
	}
	return "", false
}
