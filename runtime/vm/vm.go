// Package vm runs torpor sandboxes as microVMs on QEMU (Debian's
// qemu-system-x86, machine type microvm), with a guest agent
// (runtime/vm/agent) as the guest's init. Its pause writes the whole VM —
// memory, vCPU and device state — to a file in the sandbox's directory and
// ends QEMU, so a paused sandbox holds no CPU and no memory; Restore
// continues it exactly where it stopped. See docs/vm.md.
//
// Layout under Config.Dir:
//
//	images/<key>.img        read-only ext4 image of a template (shared)
//	cache/initramfs-*.gz    the guest's initramfs (agent, modules)
//	sandboxes/<id>/         one sandbox:
//	    disk.qcow2          its disk: a copy-on-write overlay on the image,
//	                        of the sandbox's disk_mib
//	    netns               its network namespace (with a Network, while
//	                        QEMU runs): eth0 and QEMU's tap on a bridge
//	    machine.json        how its QEMU is started (kept for Restore)
//	    instance.json       the running QEMU: pid and start time
//	    result.json         why its instance stopped by itself
//	    qmp.sock agent.sock QEMU's monitor and the agent's port
//	    qemu.log            QEMU's own errors
//	    snapshot/           state (device state and, eager, the memory),
//	                        mem (lazy: the guest's memory file), meta.json
//
// QEMU runs detached (-daemonize, its own session), so it outlives the
// daemon; a new Runtime over the same Dir finds every instance from the
// files above and reconnects.
package vm

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/keyedmutex"
	"github.com/torpor-dev/torpor/runtime/instances"
)

// Kind is the runtime's name.
const Kind = "vm"

// DefaultKernelDir is where scripts/install.sh (ensure_vm_support) puts
// the guest kernel: vmlinux and modules/.
const DefaultKernelDir = "/var/lib/torpor/vm-kernel/current"

// DefaultAgentPath is where scripts/install.sh installs the guest agent.
const DefaultAgentPath = "/usr/local/lib/torpor/torpor-agent"

// Acceleration choices.
const (
	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// Defaults.
const (
	// DefaultMemoryMiB is the guest memory of a sandbox whose resources
	// say 0.
	DefaultMemoryMiB = 512
	// MinGuestMiB is the least memory a guest gets: a sandbox asking for
	// less gets this much, with its processes held to what it asked by
	// the guest's memory cgroup.
	MinGuestMiB = 128
	// DefaultDiskMiB is the size of the disk of a sandbox whose
	// resources say 0.
	DefaultDiskMiB = 4096
)

// Config configures a Runtime.
type Config struct {
	// Dir holds the runtime's state. Required.
	Dir string
	// AgentPath is the static guest agent (cmd/torpor-agent, built with
	// CGO_ENABLED=0); empty: DefaultAgentPath, where scripts/install.sh
	// installs it.
	AgentPath string
	// KernelDir holds the guest kernel (vmlinux) and its modules; empty:
	// DefaultKernelDir.
	KernelDir string
	// QEMUPath and QEMUImgPath: empty looks up qemu-system-x86_64 and
	// qemu-img in PATH.
	QEMUPath    string
	QEMUImgPath string
	// Accel is AccelKVM, AccelTCG or AccelAuto (empty): KVM when a probe
	// boots a guest with it, otherwise TCG.
	Accel string
	// LazyMemory backs each guest's memory with a file in its sandbox's
	// directory: a snapshot then writes only the device state, and a
	// restore maps the file and loads pages as the guest touches them.
	// Without it (eager), a snapshot writes the memory into the state
	// file and a restore reads it all back.
	LazyMemory bool
	// DiskMiB is the size of the disk of a sandbox whose resources say
	// 0; 0: DefaultDiskMiB.
	DiskMiB int64
	// Network, when set, puts each VM on the host's sandbox network
	// (package network): an address of its own that the host reaches,
	// and the internet with allow_internet. Without it a VM has only a
	// loopback, reached through its agent.
	Network Network
	// ResolvConf, when set, is written to /etc/resolv.conf on the disk
	// of each sandbox allowed the internet, by its agent at every boot
	// (with a Network only); the file of any other sandbox stays as it is.
	ResolvConf string
	// NamesResolvConf, when set, is the /etc/resolv.conf of each sandbox
	// with host name egress rules (torpor's resolver, network.ResolverConf),
	// written by its agent at every boot and when a PATCH gives it names
	// (with a Network only).
	NamesResolvConf string
	// Logger receives the runtime's diagnostics; default slog.Default().
	Logger *slog.Logger
}

// Runtime is a torpor.Runtime of microVMs.
type Runtime struct {
	// ProcessClient gives the runtime its background processes
	// (torpor.ProcessRunner), through the guest's code server.
	initproc.ProcessClient

	dir       string
	agentPath string
	kernelDir string
	qemu      string
	qemuImg   string
	lazy      bool
	diskMiB   int64
	net       Network
	// resolvConf is Config.ResolvConf.
	resolvConf string
	// namesResolvConf is Config.NamesResolvConf.
	namesResolvConf string
	info            Info
	tscKHz          int64
	log             *slog.Logger

	locks   keyedmutex.Mutex
	buildMu sync.Mutex
	imageMu keyedmutex.Mutex
	// code is the host's side of the guests' code servers.
	code instances.CodeServer
	// codeStarts serialises starting a sandbox's code server.
	codeStarts keyedmutex.Mutex
	agents     agentPool
	// silentAfter bounds the wait for a first boot's agent (see
	// startAndConnect); 0 waits as long as the caller does.
	silentAfter time.Duration
	// started, when set (by tests), is told of each QEMU a boot starts.
	started func(id string, attempt int)
	// hostState is Host, worked out once.
	hostState

	// volMu guards volDevs (the volume host, UseVolumeDevices) and
	// booting (the sandboxes booting or restoring, whose volumes are
	// held before their QEMU runs): volumes.go.
	volMu   sync.Mutex
	volDevs torpor.VolumeDevices
	booting map[string]bool
}

// Info describes what the runtime runs on.
type Info struct {
	// Accel is "kvm" or "tcg".
	Accel string `json:"accel"`
	// QEMUVersion is the version QEMU reports, e.g. "7.2.22".
	QEMUVersion string `json:"qemu_version"`
	// Kernel is the guest kernel's version.
	Kernel string `json:"kernel"`
	// Memory is "eager" or "lazy" (Config.LazyMemory).
	Memory string `json:"memory"`
}

var (
	_ torpor.Runtime     = (*Runtime)(nil)
	_ torpor.Snapshotter = (*Runtime)(nil)
	_ torpor.Describer   = (*Runtime)(nil)
	_ torpor.Addresser   = (*Runtime)(nil)
)

// Kind returns "vm".
func (r *Runtime) Kind() string { return Kind }

// PauseModes returns snapshot (the default for VMs) and freeze.
func (r *Runtime) PauseModes() []torpor.PauseMode {
	return []torpor.PauseMode{torpor.PauseSnapshot, torpor.PauseFreeze}
}

// Info says the acceleration, QEMU's version and the guest kernel.
func (r *Runtime) Info() Info { return r.info }

// Describe says what GET /v1/runtimes shows of the runtime.
func (r *Runtime) Describe() torpor.RuntimeInfo {
	return torpor.RuntimeInfo{
		Kind:       Kind,
		Isolation:  torpor.IsolationVM,
		PauseModes: r.PauseModes(),
		Details: map[string]string{
			"accel":        r.info.Accel,
			"qemu_version": r.info.QEMUVersion,
			"kernel":       r.info.Kernel,
			"memory":       r.info.Memory,
		},
	}
}

func (r *Runtime) sandboxDir(id string) string        { return filepath.Join(r.dir, "sandboxes", id) }
func (r *Runtime) sandboxPath(id, name string) string { return filepath.Join(r.sandboxDir(id), name) }
func (r *Runtime) diskPath(id string) string          { return r.sandboxPath(id, "disk.qcow2") }
func (r *Runtime) snapshotDir(id string) string       { return r.sandboxPath(id, "snapshot") }

func (r *Runtime) diskExists(id string) bool {
	_, err := os.Stat(r.diskPath(id))
	return err == nil
}

// checkRef validates the sandbox id (before it reaches any path) and the
// handle.
func checkRef(ref torpor.InstanceRef) (string, error) { return instances.CheckRef(ref, parseHandle) }

// lookTool finds a binary: p if given, else name in PATH.
func lookTool(p, name, pkg string) (string, error) {
	if p == "" {
		p = name
	}
	found, err := exec.LookPath(p)
	if err != nil {
		return "", fmt.Errorf("vm: no %s (%w): install Debian's %s package (scripts/install.sh does)", name, err, pkg)
	}
	return found, nil
}
