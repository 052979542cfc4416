package initproc

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER of prctl(2).
const prSetChildSubreaper = 36

// setSubreaper makes the calling process adopt its orphaned descendants.
func setSubreaper() error {
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// reaped is an exited child.
type reaped struct {
	pid    int
	status syscall.WaitStatus
}

// reapAll collects every child that has exited, without blocking. It
// reports whether no child at all is left.
func reapAll() (exited []reaped, none bool) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.ECHILD):
			return exited, true
		case err != nil || pid <= 0:
			return exited, false
		}
		exited = append(exited, reaped{pid, ws})
	}
}

// killTree kills every descendant of this process and reaps them all. This
// process must be a child subreaper, so that descendants whose parent died
// are re-parented to it and stay in reach. It returns the status of the
// child want if it was among those reaped.
func killTree(want int) (status syscall.WaitStatus, found bool) {
	self := os.Getpid()
	for round := 0; round < 10000; round++ {
		for _, pid := range descendants(self) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		exited, none := reapAll()
		for _, r := range exited {
			if r.pid == want {
				status, found = r.status, true
			}
		}
		if none {
			return status, found
		}
		if len(exited) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return status, found
}

// descendants lists the pids below root in the process tree, read from /proc.
func descendants(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := make(map[int][]int)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentPID(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var out []int
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}

// parentPID reads the parent pid from /proc/pid/stat.
func parentPID(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	fields := bytes.Fields(b[i+1:])
	if len(fields) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(string(fields[1]))
	return ppid, err == nil
}

// Capabilities of capabilities(7), and the calls that change them.
const (
	capSetgid         = 6
	capSetuid         = 7
	capSetpcap        = 8
	linuxCapVersion3  = 0x20080522
	prCapbsetDrop     = 24
	prCapAmbient      = 47
	prCapAmbientLower = 3
)

// dropSetidBounding drops CAP_SETUID, CAP_SETGID and CAP_SETPCAP from the
// bounding set, then CAP_SETPCAP from every other set, on every thread (a
// thread's capabilities are its own, and a child gets those of the thread
// that forked it): this process keeps the power to switch the users of the
// processes it starts, but a process it starts as root gains none of the
// three when it runs its program (root gains the bounding set;
// no_new_privs does not stop that). A binary built with cgo cannot change
// every thread (ENOTSUP).
func dropSetidBounding() error {
	for _, c := range []uintptr{capSetuid, capSetgid, capSetpcap} {
		if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, prCapbsetDrop, c, 0); errno != 0 {
			return errno
		}
	}
	hdr := struct {
		version uint32
		pid     int32
	}{version: linuxCapVersion3}
	var data [2]struct{ effective, permitted, inheritable uint32 }
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return errno
	}
	data[0].effective &^= 1 << capSetpcap
	data[0].permitted &^= 1 << capSetpcap
	data[0].inheritable &^= 1 << capSetpcap
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return errno
	}
	// EINVAL: a kernel without ambient capabilities has none to drop.
	if _, _, errno := syscall.AllThreadsSyscall6(syscall.SYS_PRCTL, prCapAmbient, prCapAmbientLower, capSetpcap, 0, 0, 0); errno != 0 && errno != syscall.EINVAL {
		return errno
	}
	return nil
}
