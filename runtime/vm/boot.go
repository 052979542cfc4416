package vm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/instances"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// cleanupTimeout bounds the cleanup after a failed or cancelled boot.
const cleanupTimeout = 30 * time.Second

// Boot starts a fresh VM on the sandbox's disk (made on first boot from
// the template's image): it ends any earlier instance (flushing its
// disk), drops any snapshot, starts QEMU, waits for the agent and has it
// run the setup commands and start the entrypoint. A failed setup leaves
// a stopped instance (Inspect tells why) and returns an invalid_argument
// *torpor.Error with Reason torpor.FailureSetup.
func (r *Runtime) Boot(ctx context.Context, spec torpor.BootSpec) (string, error) {
	if err := validateBoot(spec); err != nil {
		return "", err
	}
	if spec.AllowInternet && r.net == nil {
		return "", torpor.Invalid("allow_internet", "this server runs VMs without a sandbox network: they have no way to the internet")
	}
	id := spec.SandboxID
	defer r.locks.Lock(id)()
	if err := r.removeInstance(ctx, id); err != nil {
		return "", fmt.Errorf("vm: boot %s: remove the previous instance: %w", id, err)
	}
	if err := os.MkdirAll(r.sandboxDir(id), 0o700); err != nil {
		return "", fmt.Errorf("vm: boot %s: %w", id, err)
	}
	if err := r.dropSnapshot(id); err != nil {
		return "", fmt.Errorf("vm: boot %s: %w", id, err)
	}
	in, err := r.bootInstance(ctx, spec)
	var te *torpor.Error
	if err != nil && !errors.As(err, &te) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if cerr := r.removeInstance(cctx, id); cerr != nil {
			r.log.Warn("vm: cleanup after failed boot", "sandbox", id, "err", cerr)
		}
		return "", fmt.Errorf("vm: boot %s: %w", id, err)
	}
	if err != nil {
		return "", err
	}
	return in.handle(id), nil
}

func (r *Runtime) bootInstance(ctx context.Context, spec torpor.BootSpec) (instance, error) {
	id := spec.SandboxID
	if err := r.ensureDisk(ctx, id, spec.Template, spec.Resources.DiskMiB); err != nil {
		return instance{}, err
	}
	initrd, err := r.initramfs()
	if err != nil {
		return instance{}, err
	}
	m := r.machineFor(id, spec.Resources, initrd)
	// Held from here (VolumeHolder), so that the host mounts none of
	// them between the take and QEMU's start.
	r.setBooting(id, true)
	defer r.setBooting(id, false)
	var vols []proto.Volume
	if m.Volumes, vols, err = r.takeVolumes(ctx, spec.Volumes); err != nil {
		return instance{}, err
	}
	if r.net != nil {
		if err := r.saveRules(id, spec.Network); err != nil {
			return instance{}, err
		}
		// Not QEMU's user-mode network: it would let the guest reach the
		// host's loopback services. A tap in a namespace of the
		// sandbox's own puts it under the sandbox network's rules.
		if m.Net, err = r.attach(ctx, id, spec.AllowInternet, spec.Network, netip.Addr{}); err != nil {
			return instance{}, err
		}
	}
	if m.Lazy {
		if err := makeMemFile(m.MemPath, m.MemoryMiB); err != nil {
			return instance{}, err
		}
	}
	if err := r.saveJSON(id, "machine.json", m); err != nil {
		return instance{}, err
	}
	in, ac, release, err := r.startAndConnect(ctx, id, m)
	if err != nil {
		return instance{}, err
	}
	defer release()
	start := proto.Start{
		Hostname:   spec.Hostname,
		Env:        spec.Env,
		Setup:      spec.Setup,
		Entrypoint: spec.Entrypoint,
		PidsMax:    spec.Resources.Pids,
		Now:        time.Now().UTC(),
		Volumes:    vols,
	}
	start.ResolvConf = r.resolvConfOf(spec.AllowInternet, spec.Network)
	if start.PidsMax == 0 {
		start.PidsMax = defaultPids
	}
	if spec.Resources.MemoryMiB > 0 {
		start.MemoryMax = spec.Resources.MemoryMiB << 20
	}
	if v := spec.Resources.VCPUs; v > 0 && v < float64(m.VCPUs) {
		start.CPUQuota = v
	}
	var res proto.StartResult
	if err := ac.call(ctx, proto.OpStart, start, &res); err != nil {
		return instance{}, agentError(id, err)
	}
	if f := res.Failed; f != nil {
		r.recordResult(id, *f)
		release()
		r.endQEMU(ctx, id, in)
		return instance{}, bootFailure(failureOf(f))
	}
	return in, nil
}

// errSilentAgent is the cause of a first boot's wait that outlasted
// Runtime.silentAfter.
var errSilentAgent = errors.New("the guest agent stayed silent")

// startAndConnect starts QEMU on m and waits for the guest's agent. Under
// heavy load a TCG guest has been seen to hang early in its boot, its
// agent never answering (about one boot in thirty of the VM test suite on
// a loaded two-core host). A first guest silent for r.silentAfter is
// therefore ended and booted once more; the second wait has no bound but
// the caller's.
func (r *Runtime) startAndConnect(ctx context.Context, id string, m machine) (instance, *agentConn, func(), error) {
	for attempt := 1; ; attempt++ {
		p, err := r.startQEMU(ctx, r.sandboxDir(id), m, false)
		if err != nil {
			return instance{}, nil, nil, err
		}
		in := instance{Proc: p, Boot: time.Now().UnixNano()}
		if err := r.saveJSON(id, "instance.json", in); err != nil {
			_ = p.Kill(context.Background())
			return instance{}, nil, nil, err
		}
		if r.started != nil {
			r.started(id, attempt)
		}
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if attempt == 1 && r.silentAfter > 0 {
			wctx, cancel = context.WithTimeoutCause(ctx, r.silentAfter, errSilentAgent)
		}
		ac, release, err := r.connectBooting(wctx, id, in)
		silent := err != nil && ctx.Err() == nil && errors.Is(context.Cause(wctx), errSilentAgent)
		cancel()
		switch {
		case err == nil:
			return in, ac, release, nil
		case !silent:
			return instance{}, nil, nil, err
		}
		r.log.Warn("vm: the guest agent did not answer; booting the guest once more",
			"sandbox", id, "waited", r.silentAfter, "console", r.consoleTail(id))
		r.endQEMU(ctx, id, in)
		if m.Lazy {
			// The first guest's memory is not the second's.
			if err := makeMemFile(m.MemPath, m.MemoryMiB); err != nil {
				return instance{}, nil, nil, err
			}
		}
	}
}

// defaultPids bounds the processes of a sandbox whose resources say 0.
const defaultPids = 4096

// machineFor sizes the sandbox's VM: whole vCPUs (a fraction is a CPU
// quota inside), memory at least MinGuestMiB.
func (r *Runtime) machineFor(id string, res torpor.Resources, initrd string) machine {
	vcpus := int(math.Ceil(res.VCPUs))
	if vcpus < 1 {
		vcpus = 1
	}
	mem := res.MemoryMiB
	if mem == 0 {
		mem = DefaultMemoryMiB
	}
	mem = max(mem, MinGuestMiB)
	m := machine{
		Accel:       r.info.Accel,
		VCPUs:       vcpus,
		MemoryMiB:   mem,
		Kernel:      filepath.Join(r.kernelDir, "vmlinux"),
		Initramfs:   initrd,
		TSCkHz:      r.tscKHz,
		Disk:        r.diskPath(id),
		DiskFormat:  "qcow2",
		QEMUVersion: r.info.QEMUVersion,
	}
	if r.lazy {
		m.Lazy, m.MemPath = true, r.sandboxPath(id, memFile)
	}
	return m
}

// makeMemFile makes the (sparse) file that backs a lazy guest's memory.
func makeMemFile(p string, mib int64) error {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Truncate(mib << 20)
}

// connectBooting waits for a booting guest's agent, failing early when
// the guest stops (its kernel panicked, its agent could not start).
func (r *Runtime) connectBooting(ctx context.Context, id string, in instance) (*agentConn, func(), error) {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			if !in.Alive() {
				cancel(errors.New("QEMU exited during boot"))
				return
			}
			sctx, scancel := context.WithTimeout(wctx, 5*time.Second)
			s, err := vmStatus(sctx, r.sandboxPath(id, qmpSock))
			scancel()
			if err == nil && stoppedStatus(s) {
				cancel(fmt.Errorf("the guest stopped during boot (%s)", s))
				return
			}
		}
	}()
	ac, release, err := r.agents.get(wctx, r.sandboxPath(id, agentSock))
	if err != nil {
		if cause := context.Cause(wctx); cause != nil && ctx.Err() == nil {
			err = cause
		}
		return nil, nil, fmt.Errorf("waiting for the guest agent: %w%s", err, r.consoleTail(id))
	}
	return ac, release, nil
}

// consoleTail returns the end of the guest's console, for error messages.
func (r *Runtime) consoleTail(id string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	q, err := dialQMP(ctx, r.sandboxPath(id, qmpSock))
	if err != nil {
		return ""
	}
	defer q.close()
	s, err := q.ringbufRead(ctx, "console")
	if err != nil || strings.TrimSpace(s) == "" {
		return ""
	}
	if len(s) > 2048 {
		s = s[len(s)-2048:]
	}
	return "; guest console:\n" + strings.TrimSpace(strings.ToValidUTF8(s, "\uFFFD"))
}

// bootFailure turns the failure of a boot into the error Boot returns.
func bootFailure(f *torpor.Failure) error {
	param := "setup"
	switch f.Code {
	case torpor.FailureEntrypoint:
		param = "entrypoint"
	case torpor.FailureOOM:
		param = "resources.memory_mib"
	}
	return &torpor.Error{Code: torpor.EInvalid, Param: param, Reason: f.Code, Message: f.Message}
}

// validateBoot refuses bad input before anything touches the disk.
func validateBoot(spec torpor.BootSpec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if spec.Resources.VCPUs > 64 {
		return torpor.Invalid("resources.vcpus", "a VM has at most 64 vCPUs")
	}
	return instances.ValidateTemplate(spec.Template)
}

// removeFiles removes files of the sandbox's directory; missing is fine.
func (r *Runtime) removeFiles(id string, names ...string) error {
	for _, n := range names {
		if err := os.Remove(r.sandboxPath(id, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
