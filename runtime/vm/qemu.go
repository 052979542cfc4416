package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/runtime/instances"
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
	// Volumes are the tenant's volumes attached as virtio disks
	// (volumes.go), after every other device.
	Volumes []machineVolume `json:"volumes,omitempty"`
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
	a = append(a, m.volumeArgs()...)
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

// startQEMU starts m's QEMU detached (it daemonizes once its sockets
// listen) in dir, and returns its process.
func (r *Runtime) startQEMU(ctx context.Context, dir string, m machine, incoming bool) (instances.Proc, error) {
	for _, f := range []string{qmpSock, agentSock, pidFile} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return instances.Proc{}, err
		}
	}
	logf, err := os.OpenFile(filepath.Join(dir, qemuLog), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return instances.Proc{}, err
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
		return instances.Proc{}, fmt.Errorf("start QEMU: %w: %s", err, instances.ReadTail(filepath.Join(dir, qemuLog), 2048))
	}
	pid, err := instances.ReadPidFile(filepath.Join(dir, pidFile))
	if err != nil {
		return instances.Proc{}, fmt.Errorf("start QEMU: %w", err)
	}
	p := instances.Proc{PID: pid}
	if p.Start, _, err = instances.Stat(pid); err != nil {
		return instances.Proc{}, fmt.Errorf("start QEMU: it exited at once: %s", instances.ReadTail(filepath.Join(dir, qemuLog), 2048))
	}
	return p, nil
}

// instance is the record of a sandbox's running QEMU.
type instance struct {
	instances.Proc
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
	return instances.WriteFileAtomic(r.sandboxPath(id, name), b, 0o600)
}
