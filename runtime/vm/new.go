package vm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/runtime/instances"
)

// New checks the host (QEMU, qemu-img, mkfs.ext4, the guest kernel, a
// static agent), chooses the acceleration (probing KVM when cfg.Accel is
// auto; the answer is kept in Dir) and returns a Runtime over cfg.Dir.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.Dir == "" {
		return nil, errors.New("vm: Config.Dir is required")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	if cfg.AgentPath == "" {
		cfg.AgentPath = DefaultAgentPath
	}
	if err := checkStatic(cfg.AgentPath); err != nil {
		return nil, err
	}
	agentPath, err := filepath.Abs(cfg.AgentPath)
	if err != nil {
		return nil, fmt.Errorf("vm: %w", err)
	}
	kernelDir := cfg.KernelDir
	if kernelDir == "" {
		kernelDir = DefaultKernelDir
	}
	if kernelDir, err = filepath.EvalSymlinks(kernelDir); err != nil {
		return nil, fmt.Errorf("vm: no guest kernel in %s (%w): run scripts/install.sh, which fetches Debian's linux-image-cloud-amd64", cfg.KernelDir, err)
	}
	if _, err := os.Stat(filepath.Join(kernelDir, "vmlinux")); err != nil {
		return nil, fmt.Errorf("vm: no guest kernel: %w (run scripts/install.sh)", err)
	}
	r := &Runtime{dir: dir, agentPath: agentPath, kernelDir: kernelDir, lazy: cfg.LazyMemory, diskMiB: cfg.DiskMiB, net: cfg.Network, log: cfg.Logger}
	if r.net != nil {
		r.resolvConf = cfg.ResolvConf
		r.namesResolvConf = cfg.NamesResolvConf
	}
	r.code = instances.CodeServer{Who: Kind, CheckRef: checkRef, Conn: r.codeConn, Runtime: r}
	r.ProcessClient = initproc.ProcessClient{Send: r.code.Send, Who: Kind}
	if r.log == nil {
		r.log = slog.Default()
	}
	if r.diskMiB <= 0 {
		r.diskMiB = DefaultDiskMiB
	}
	if r.qemu, err = lookTool(cfg.QEMUPath, "qemu-system-x86_64", "qemu-system-x86"); err != nil {
		return nil, err
	}
	if r.qemuImg, err = lookTool(cfg.QEMUImgPath, "qemu-img", "qemu-utils"); err != nil {
		return nil, err
	}
	if _, err := lookTool("", "mkfs.ext4", "e2fsprogs"); err != nil {
		return nil, err
	}
	for _, d := range []string{"sandboxes", "images", "cache"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("vm: %w", err)
		}
	}
	if r.info.QEMUVersion, err = qemuVersion(ctx, r.qemu); err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(kernelDir, "version")); err == nil {
		r.info.Kernel = strings.TrimSpace(string(b))
	} else {
		r.info.Kernel = filepath.Base(kernelDir)
	}
	r.info.Memory = "eager"
	if r.lazy {
		r.info.Memory = "lazy"
	}
	r.tscKHz = hostTSCkHz()
	switch cfg.Accel {
	case AccelKVM, AccelTCG:
		r.info.Accel = cfg.Accel
	case "", AccelAuto:
		r.info.Accel, err = r.probeAccel(ctx)
		if err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("vm: unknown acceleration %q (kvm, tcg or auto)", cfg.Accel)
	}
	// A guest boots in well under a second on KVM and in a few seconds
	// under TCG; these bounds are far past a healthy boot on a loaded host.
	r.silentAfter = 20 * time.Second
	if r.info.Accel == AccelTCG {
		r.silentAfter = 60 * time.Second
	}
	return r, nil
}

// checkStatic makes sure the agent exists and is statically linked: it is
// the guest's init, with no libraries beside it.
func checkStatic(p string) error {
	if p == "" {
		return errors.New("vm: no guest agent: build cmd/torpor-agent with CGO_ENABLED=0 (scripts/install.sh does)")
	}
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("vm: agent binary: %w", err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("vm: agent %s is dynamically linked; build it with CGO_ENABLED=0", p)
		}
	}
	return nil
}

var qemuVersionRE = regexp.MustCompile(`version ([0-9][0-9.]*)`)

func qemuVersion(ctx context.Context, qemu string) (string, error) {
	out, err := exec.CommandContext(ctx, qemu, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("vm: %s --version: %w", qemu, err)
	}
	m := qemuVersionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("vm: cannot read QEMU's version from %q", out)
	}
	return string(m[1]), nil
}

// hostTSCkHz is the host's TSC rate, which a guest under TCG sees and
// must be told (tsc_early_khz): its own calibration against emulated
// timers is unreliable and hangs some boots. 0 when unknown.
func hostTSCkHz() int64 {
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 {
			return n
		}
	}
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	constant := false
	var mhz float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "flags":
			constant = strings.Contains(v, " constant_tsc")
		case "cpu MHz":
			if mhz == 0 {
				mhz, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
			}
		}
	}
	if !constant {
		return 0
	}
	return int64(mhz * 1000)
}

// accelRecord is the kept answer of the acceleration probe.
type accelRecord struct {
	Key   string `json:"key"`
	Accel string `json:"accel"`
	Error string `json:"error,omitempty"`
}

// probeAccel answers whether KVM can boot the guest here: a host's
// /dev/kvm may be a nested or paravirtual one that cannot run a stock
// kernel. It boots a throwaway guest with KVM and waits for its agent;
// failing that, TCG. The answer is kept for this QEMU, kernel and agent.
func (r *Runtime) probeAccel(ctx context.Context) (string, error) {
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		return AccelTCG, nil
	} else {
		f.Close()
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", r.info.QEMUVersion, r.kernelDir)
	if f, err := os.Open(r.agentPath); err == nil {
		_, _ = io.Copy(h, f)
		f.Close()
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	// The answer holds for the host, not for one data directory: keep it
	// next to the kernels when that can be written.
	recPath := filepath.Join(filepath.Dir(r.kernelDir), "accel-probe.json")
	if unix.Access(filepath.Dir(recPath), unix.W_OK) != nil {
		recPath = filepath.Join(r.dir, "accel.json")
	}
	var rec accelRecord
	if b, err := os.ReadFile(recPath); err == nil && json.Unmarshal(b, &rec) == nil && rec.Key == key {
		return rec.Accel, nil
	}
	rec = accelRecord{Key: key, Accel: AccelKVM}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if err := r.bootProbe(pctx, AccelKVM); err != nil {
		rec.Accel, rec.Error = AccelTCG, err.Error()
		r.log.Info("vm: KVM cannot boot the guest here; using TCG (software emulation)", "err", err)
	}
	b, _ := json.Marshal(rec)
	if err := instances.WriteFileAtomic(recPath, b, 0o600); err != nil {
		return "", fmt.Errorf("vm: %w", err)
	}
	return rec.Accel, nil
}

// probeTimeout bounds the KVM probe's boot; a guest that works boots in
// well under a second with KVM.
const probeTimeout = 15 * time.Second

// bootProbe boots a guest with accel on an empty disk and waits for its
// agent to answer, then ends it.
func (r *Runtime) bootProbe(ctx context.Context, accel string) error {
	dir, err := os.MkdirTemp(filepath.Join(r.dir, "cache"), "probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	empty := filepath.Join(dir, "root")
	if err := os.Mkdir(empty, 0o755); err != nil {
		return err
	}
	img := filepath.Join(dir, "disk.img")
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-d", empty, img, "16M").CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, bytes.TrimSpace(out))
	}
	initrd, err := r.initramfs()
	if err != nil {
		return err
	}
	m := machine{Accel: accel, VCPUs: 1, MemoryMiB: MinGuestMiB, Kernel: filepath.Join(r.kernelDir, "vmlinux"),
		Initramfs: initrd, TSCkHz: r.tscKHz, Disk: img, DiskFormat: "raw", QEMUVersion: r.info.QEMUVersion}
	p, err := r.startQEMU(ctx, dir, m, false)
	if err != nil {
		return err
	}
	defer p.Kill(context.Background())
	ac, err := dialAgent(ctx, filepath.Join(dir, agentSock))
	if err != nil {
		return fmt.Errorf("no answer from the guest agent: %w", err)
	}
	ac.close()
	return nil
}
