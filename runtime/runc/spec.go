package runc

import (
	"runtime"
	"slices"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
)

// Paths inside the sandbox.
const (
	// initMount is where the torpor binary is bind-mounted read-only; it
	// runs as the sandbox's pid 1 and as the exec helper (see initBinary).
	initMount = "/.torpor/torpor"
	// runMount is init's run directory, bind-mounted read-write from
	// the host: reports and the entrypoint log.
	runMount = "/.torpor/run"
)

// Defaults the OCI config applies.
const (
	// defaultPids bounds the processes of a sandbox whose resources say 0,
	// so that a fork bomb cannot take the host down.
	defaultPids = 4096
	cpuPeriod   = 100000 // µs
)

// The subset of the OCI runtime spec (v1.0.2) that torpor writes.
type (
	ociSpec struct {
		OCIVersion string     `json:"ociVersion"`
		Process    ociProcess `json:"process"`
		Root       ociRoot    `json:"root"`
		Hostname   string     `json:"hostname"`
		Mounts     []ociMount `json:"mounts"`
		Linux      ociLinux   `json:"linux"`
	}
	ociProcess struct {
		Terminal        bool            `json:"terminal"`
		User            ociUser         `json:"user"`
		Args            []string        `json:"args"`
		Env             []string        `json:"env"`
		Cwd             string          `json:"cwd"`
		Capabilities    ociCapabilities `json:"capabilities"`
		Rlimits         []ociRlimit     `json:"rlimits"`
		NoNewPrivileges bool            `json:"noNewPrivileges"`
	}
	ociUser struct {
		UID uint32 `json:"uid"`
		GID uint32 `json:"gid"`
	}
	ociCapabilities struct {
		Bounding    []string `json:"bounding"`
		Effective   []string `json:"effective"`
		Permitted   []string `json:"permitted"`
		Ambient     []string `json:"ambient"`
		Inheritable []string `json:"inheritable,omitempty"`
	}
	ociRlimit struct {
		Type string `json:"type"`
		Hard uint64 `json:"hard"`
		Soft uint64 `json:"soft"`
	}
	ociRoot struct {
		Path     string `json:"path"`
		Readonly bool   `json:"readonly"`
	}
	ociMount struct {
		Destination string   `json:"destination"`
		Type        string   `json:"type,omitempty"`
		Source      string   `json:"source,omitempty"`
		Options     []string `json:"options,omitempty"`
	}
	ociLinux struct {
		Resources     ociResources   `json:"resources"`
		CgroupsPath   string         `json:"cgroupsPath"`
		Namespaces    []ociNamespace `json:"namespaces"`
		MaskedPaths   []string       `json:"maskedPaths"`
		ReadonlyPaths []string       `json:"readonlyPaths"`
		Seccomp       *ociSeccomp    `json:"seccomp,omitempty"`
	}
	ociResources struct {
		Devices []ociDevice `json:"devices"`
		Memory  *ociMemory  `json:"memory,omitempty"`
		CPU     *ociCPU     `json:"cpu,omitempty"`
		Pids    *ociPids    `json:"pids,omitempty"`
	}
	ociDevice struct {
		Allow  bool   `json:"allow"`
		Access string `json:"access"`
	}
	ociMemory struct {
		Limit int64 `json:"limit"`
		// Swap is memory plus swap, as in cgroup v1's memsw.
		Swap int64 `json:"swap,omitempty"`
	}
	ociCPU struct {
		Quota  int64  `json:"quota"`
		Period uint64 `json:"period"`
	}
	ociPids struct {
		Limit int64 `json:"limit"`
	}
	ociNamespace struct {
		Type string `json:"type"`
		// Path joins an existing namespace instead of making one.
		Path string `json:"path,omitempty"`
	}
	ociSeccomp struct {
		DefaultAction string           `json:"defaultAction"`
		Architectures []string         `json:"architectures"`
		Syscalls      []ociSyscallRule `json:"syscalls"`
	}
	ociSyscallRule struct {
		Names    []string     `json:"names"`
		Action   string       `json:"action"`
		ErrnoRet *uint        `json:"errnoRet,omitempty"`
		Args     []ociSyscArg `json:"args,omitempty"`
	}
	ociSyscArg struct {
		Index    uint   `json:"index"`
		Value    uint64 `json:"value"`
		ValueTwo uint64 `json:"valueTwo"`
		Op       string `json:"op"`
	}
)

// specInput is what the OCI config is made from.
type specInput struct {
	Boot   torpor.BootSpec
	RootFS string     // the overlay mount
	Init   initBinary // the torpor binary: how it runs, its mounts
	RunDir string     // host path of the run directory
	Cgroup string     // cgroupsPath, absolute in every hierarchy
	// SwapLimit: the host can limit memory+swap (no swap for sandboxes).
	SwapLimit bool
	// NetNS is the network namespace to join (made by the network
	// package, with eth0 on the host bridge); empty: a new one with only
	// a loopback.
	NetNS string
	// Volumes are the binds of the sandbox's volumes (volumeBinds).
	Volumes []ociMount
}

// defaultCaps are the capabilities `runc spec` gives a container.
var defaultCaps = []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}

// buildSpec makes the OCI config of a sandbox: own pid, mount, UTS, IPC
// and network namespaces (the one prepared at NetNS, else loopback only),
// root with `runc spec`'s default
// capabilities, masked and read-only paths, a seccomp profile that refuses
// the dangerous system calls, and the sandbox's resource limits.
func buildSpec(in specInput) ociSpec {
	b := in.Boot
	args := append(slices.Clip(in.Init.argv), "init", "-run", runMount)
	for _, s := range b.Setup {
		args = append(args, "-setup", s)
	}
	args = append(args, "--")
	args = append(args, b.Entrypoint...)

	hostname := b.Hostname
	if hostname == "" {
		hostname = b.SandboxID
	}
	mounts := []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
	}
	mounts = append(mounts, in.Init.mounts...)
	mounts = append(mounts, ociMount{Destination: runMount, Type: "bind", Source: in.RunDir, Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}})
	mounts = append(mounts, in.Volumes...)
	return ociSpec{
		OCIVersion: "1.0.2",
		Process: ociProcess{
			Args: args,
			Env:  initproc.SandboxEnv(b.Env),
			Cwd:  workingDir(b.Template),
			Capabilities: ociCapabilities{
				Bounding: defaultCaps, Effective: defaultCaps, Permitted: defaultCaps, Ambient: defaultCaps,
			},
			Rlimits:         []ociRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
			NoNewPrivileges: true,
		},
		Root:     ociRoot{Path: in.RootFS},
		Hostname: hostname,
		Mounts:   mounts,
		Linux: ociLinux{
			Resources:   buildResources(b.Resources, in.SwapLimit),
			CgroupsPath: in.Cgroup,
			Namespaces: []ociNamespace{
				{Type: "pid"}, {Type: "network", Path: in.NetNS}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"},
			},
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
				"/proc/scsi", "/sys/devices/virtual/powercap",
			},
			ReadonlyPaths: []string{
				"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
			},
			Seccomp: defaultSeccomp(),
		},
	}
}

// buildResources turns the sandbox's limits into cgroup settings: memory
// (and no swap where the host can say so), a CPU quota of vcpus periods,
// and a pids limit. The disk's size is the size of its file system (see
// prepareDisk).
func buildResources(r torpor.Resources, swapLimit bool) ociResources {
	res := ociResources{
		Devices: []ociDevice{{Allow: false, Access: "rwm"}},
		Pids:    &ociPids{Limit: defaultPids},
	}
	if r.Pids > 0 {
		res.Pids.Limit = r.Pids
	}
	if r.MemoryMiB > 0 {
		res.Memory = &ociMemory{Limit: r.MemoryMiB << 20}
		if swapLimit {
			res.Memory.Swap = res.Memory.Limit
		}
	}
	if r.VCPUs > 0 {
		quota := int64(r.VCPUs * cpuPeriod)
		if quota < 1000 {
			quota = 1000 // the kernel's minimum is 1ms
		}
		res.CPU = &ociCPU{Quota: quota, Period: cpuPeriod}
	}
	return res
}

// Seccomp errno values.
const (
	errnoEPERM   = 1
	errnoENOSYS  = 38
	cloneNewUser = 0x10000000
)

// deniedSyscalls fail with EPERM in every sandbox: they change the host
// (time, modules, swap, reboot, accounting), open kernel attack surface
// (bpf, perf, userfaultfd, keyrings, io_uring) or escape the namespaces
// (mount, setns, unshare, pivot_root, open_by_handle_at). Names the kernel
// or architecture does not know are ignored by runc.
var deniedSyscalls = []string{
	"acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module",
	"delete_module", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick",
	"get_kernel_syms", "init_module", "io_uring_enter", "io_uring_register",
	"io_uring_setup", "ioperm", "iopl", "kexec_file_load", "kexec_load", "keyctl",
	"lookup_dcookie", "mount", "mount_setattr", "move_mount", "nfsservctl",
	"open_by_handle_at", "open_tree", "perf_event_open", "pivot_root",
	"query_module", "quotactl", "quotactl_fd", "reboot", "request_key", "setns",
	"settimeofday", "stime", "swapoff", "swapon", "_sysctl", "sysfs", "syslog",
	"umount", "umount2", "unshare", "uselib", "userfaultfd", "ustat", "vm86",
	"vm86old",
}

// defaultSeccomp allows everything but deniedSyscalls, clone with
// CLONE_NEWUSER, and clone3 (ENOSYS: its flags cannot be filtered, and libc
// falls back to clone).
func defaultSeccomp() *ociSeccomp {
	eperm, enosys := uint(errnoEPERM), uint(errnoENOSYS)
	return &ociSeccomp{
		DefaultAction: "SCMP_ACT_ALLOW",
		Architectures: seccompArches(),
		Syscalls: []ociSyscallRule{
			{Names: deniedSyscalls, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm},
			{Names: []string{"clone3"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &enosys},
			{Names: []string{"clone"}, Action: "SCMP_ACT_ERRNO", ErrnoRet: &eperm,
				Args: []ociSyscArg{{Index: 0, Value: cloneNewUser, ValueTwo: cloneNewUser, Op: "SCMP_CMP_MASKED_EQ"}}},
		},
	}
}

func seccompArches() []string {
	switch runtime.GOARCH {
	case "amd64":
		return []string{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"}
	case "arm64":
		return []string{"SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"}
	case "386":
		return []string{"SCMP_ARCH_X86"}
	}
	return nil
}
