package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/network"
)

// Files in a sandbox's (or probe's) directory that QEMU makes.
const (
	qmpSock   = "qmp.sock"
	agentSock = "agent.sock"
	pidFile   = "qemu.pid"
	qemuLog   = "qemu.log"
	memFile   = "mem"
)

// machine is how a sandbox's QEMU is started; it is kept in the
// sandbox's directory so that Restore starts the very same machine.
type machine struct {
	Accel     string `json:"accel"`
	VCPUs     int    `json:"vcpus"`
	MemoryMiB int64  `json:"memory_mib"`
	// Lazy backs the memory with the file MemPath (shared while running).
	Lazy        bool   `json:"lazy,omitempty"`
	MemPath     string `json:"mem_path,omitempty"`
	Kernel      string `json:"kernel"`
	Initramfs   string `json:"initramfs"`
	TSCkHz      int64  `json:"tsc_khz,omitempty"`
	Disk        string `json:"disk"`
	DiskFormat  string `json:"disk_format"`
	QEMUVersion string `json:"qemu_version"`
	// Net puts the guest on the sandbox network: a virtio-net card on
	// the tap in the sandbox's namespace, where QEMU runs.
	Net *machineNet `json:"net,omitempty"`
}

// cmdline is the guest kernel's command line.
func (m machine) cmdline() string {
	args := []string{"console=ttyS0", "quiet", "panic=-1", "reboot=t", "rw",
		"cryptomgr.notests", "random.trust_cpu=on", "i8042.noaux", "i8042.nomux", "i8042.nopnp"}
	if m.Accel == AccelTCG && m.TSCkHz > 0 {
		args = append(args, "tsc_early_khz="+strconv.FormatInt(m.TSCkHz, 10))
	}
	if m.Net != nil {
		args = append(args, m.Net.Guest.Param())
	}
	return strings.Join(args, " ")
}

// args is QEMU's command line; incoming adds -incoming defer (Restore).
func (m machine) args(incoming bool) []string {
	cpu := "max"
	if m.Accel == AccelKVM {
		cpu = "host"
	}
	a := []string{
		"-name", "torpor",
		"-machine", "microvm,accel=" + m.Accel,
		"-cpu", cpu,
		"-smp", strconv.Itoa(m.VCPUs),
		"-m", strconv.FormatInt(m.MemoryMiB, 10) + "M",
		"-nodefaults", "-no-user-config", "-display", "none",
		"-kernel", m.Kernel, "-initrd", m.Initramfs, "-append", m.cmdline(),
		"-chardev", "ringbuf,id=console,size=65536", "-serial", "chardev:console",
		"-drive", "id=disk,if=none,format=" + m.DiskFormat + ",file=" + m.Disk + ",discard=unmap",
		"-device", "virtio-blk-device,drive=disk",
		"-device", "virtio-serial-device,max_ports=4",
		"-chardev", "socket,id=agent,path=" + agentSock + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=torpor.agent",
		"-chardev", "ringbuf,id=status,size=65536",
		"-device", "virtserialport,chardev=status,name=torpor.status",
		"-qmp", "unix:" + qmpSock + ",server=on,wait=off",
		// A guest that powers off or reboots (its agent reports first)
		// stops instead of ending QEMU, so that the host can read why.
		"-action", "reboot=shutdown,shutdown=pause",
		"-daemonize", "-pidfile", pidFile,
	}
	if m.Lazy {
		a = append(a, "-object", fmt.Sprintf("memory-backend-file,id=ram,size=%dM,mem-path=%s,share=on", m.MemoryMiB, m.MemPath),
			"-machine", "memory-backend=ram")
	}
	if m.Net != nil {
		a = append(a, "-netdev", "tap,id=net,ifname="+m.Net.Tap+",script=no,downscript=no",
			"-device", "virtio-net-device,netdev=net,mac="+m.Net.MAC)
	}
	if incoming {
		a = append(a, "-incoming", "defer")
	}
	return a
}

// fingerprint identifies what a snapshot must be restored into: the same
// QEMU and the same machine.
func (m machine) fingerprint() string {
	b, _ := json.Marshal(m)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// proc is a running QEMU: its pid and its start time (so that a recycled
// pid is never taken for it).
type proc struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// startQEMU starts m's QEMU detached (it daemonizes once its sockets
// listen) in dir, and returns its process.
func (r *Runtime) startQEMU(ctx context.Context, dir string, m machine, incoming bool) (proc, error) {
	for _, f := range []string{qmpSock, agentSock, pidFile} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return proc{}, err
		}
	}
	logf, err := os.OpenFile(filepath.Join(dir, qemuLog), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return proc{}, err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, r.qemu, m.args(incoming)...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own session: QEMU must outlive the daemon and its signals.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	run := cmd.Run
	if m.Net != nil {
		// QEMU opens its tap in the sandbox's namespace, and stays there.
		run = func() error { return network.In(m.Net.NetNS, cmd.Run) }
	}
	if err := run(); err != nil {
		return proc{}, fmt.Errorf("start QEMU: %w: %s", err, readTail(filepath.Join(dir, qemuLog), 2048))
	}
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return proc{}, fmt.Errorf("start QEMU: no pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return proc{}, fmt.Errorf("start QEMU: bad pid file %q", b)
	}
	p := proc{PID: pid}
	if p.Start, _, err = procStat(pid); err != nil {
		return proc{}, fmt.Errorf("start QEMU: it exited at once: %s", readTail(filepath.Join(dir, qemuLog), 2048))
	}
	return p, nil
}

// procStat returns a process's start time (clock ticks since boot) and
// state letter from /proc/pid/stat.
func procStat(pid int) (start uint64, state byte, err error) {
	if pid <= 0 {
		return 0, 0, fs.ErrNotExist
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("malformed /proc stat")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, errors.New("malformed /proc stat")
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	return start, f[0][0], err
}

// alive reports whether the process still runs (a zombie does not).
func (p proc) alive() bool {
	start, state, err := procStat(p.PID)
	return err == nil && start == p.Start && state != 'Z' && state != 'X'
}

// pidfd opens a pidfd on the process, checked to be it; nil if it is gone.
func (p proc) pidfd() (*os.File, error) {
	fd, err := unix.PidfdOpen(p.PID, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	if !p.alive() {
		f.Close()
		return nil, nil
	}
	return f, nil
}

// signal sends sig to the process if it is still the one started.
func (p proc) signal(sig syscall.Signal) error {
	f, err := p.pidfd()
	if err != nil || f == nil {
		return err
	}
	defer f.Close()
	err = unix.PidfdSendSignal(int(f.Fd()), sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

// wait blocks until the process has exited or ctx ends. It polls the
// pidfd through Go's netpoller, so it works for a QEMU an earlier daemon
// started (not this process's child).
func (p proc) wait(ctx context.Context) error {
	f, err := p.pidfd()
	if err != nil {
		return p.pollWait(ctx)
	}
	if f == nil {
		return nil
	}
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return p.pollWait(ctx)
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	err = rc.Read(func(fd uintptr) bool {
		pf := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(pf, 0)
		return n > 0
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return p.pollWait(ctx)
	}
	return nil
}

func (p proc) pollWait(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for p.alive() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// kill ends the process at once and waits for it (bounded).
func (p proc) kill() {
	_ = p.signal(syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	_ = p.wait(ctx)
}

// killTimeout bounds waiting for a QEMU to exit.
const killTimeout = 10 * time.Second

// instance is the record of a sandbox's running QEMU.
type instance struct {
	proc
	// Boot counts the sandbox's boots and restores; it is in the handle.
	Boot int64 `json:"boot"`
}

// handle encodes the instance as Boot's opaque handle.
func (in instance) handle(id string) string {
	return fmt.Sprintf("vm:%s:%d:%d:%d", id, in.Boot, in.PID, in.Start)
}

// parseHandle checks that h is a handle of sandbox id; an empty handle is
// fine (the runtime finds the instance by sandbox id alone).
func parseHandle(id, h string) error {
	if h == "" {
		return nil
	}
	f := strings.Split(h, ":")
	if len(f) != 5 || f[0] != Kind || f[1] != id {
		return torpor.Invalid("handle", "not a vm handle of sandbox %s", id)
	}
	for _, n := range f[2:] {
		if _, err := strconv.ParseUint(n, 10, 64); err != nil {
			return torpor.Invalid("handle", "malformed vm handle")
		}
	}
	return nil
}

func (r *Runtime) loadJSON(id, name string, v any) (bool, error) {
	b, err := os.ReadFile(r.sandboxPath(id, name))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("%s of %s is corrupt: %w", name, id, err)
	}
	return true, nil
}

func (r *Runtime) saveJSON(id, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeFileAtomic(r.sandboxPath(id, name), b, 0o600)
}

// readTail returns the last max bytes of a file ("" if unreadable).
func readTail(name string, max int64) string {
	f, err := os.Open(name)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(-max, io.SeekEnd)
	}
	b, _ := io.ReadAll(io.LimitReader(f, max))
	return strings.TrimSpace(strings.ToValidUTF8(string(b), "\uFFFD"))
}
