package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/runtime/instances"
)

// readyPoll is how often Boot looks for init's ready report.
const readyPoll = time.Millisecond

// spareAfter is how long after a boot its spare disk is begun.
const spareAfter = 50 * time.Millisecond

// cleanupTimeout bounds the cleanup after a failed or cancelled boot.
const cleanupTimeout = 30 * time.Second

// Boot starts a fresh instance on the sandbox's disk: it removes any
// leftover instance, mounts the overlay, writes the OCI config, runs
// `runc run -d`, and waits for init to report that setup is done and the
// entrypoint started (when there is either). A failed setup leaves a stopped instance (Inspect
// tells why) and returns an invalid_argument *torpor.Error with Reason
// torpor.FailureSetup.
func (r *Runtime) Boot(ctx context.Context, spec torpor.BootSpec) (string, error) {
	if err := validateBoot(spec); err != nil {
		return "", err
	}
	id := spec.SandboxID
	defer r.locks.Lock(id)()

	steps := newBootSteps()
	ctx = withSteps(ctx, steps)
	t := steps.start
	if err := r.removeInstance(ctx, id); err != nil {
		return "", fmt.Errorf("runc: boot %s: remove the previous instance: %w", id, err)
	}
	t = steps.since("remove", t)
	in, err := r.start(ctx, spec)
	// A boot with neither setup nor an entrypoint is running once runc
	// has started init, as a bare `runc run -d` is: init has nothing to
	// report but that its Go runtime came up (some 10 ms). An init that
	// dies after that fails the sandbox the way any later death does.
	if err == nil && (len(spec.Setup) > 0 || len(spec.Entrypoint) > 0) {
		t = time.Now()
		err = r.awaitReady(ctx, id, in)
		steps.since("ready", t)
	}
	var te *torpor.Error
	if err != nil && !errors.As(err, &te) {
		// Leave no half-started instance behind (a failed setup stays
		// for Inspect to explain).
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if cerr := r.removeInstance(cctx, id); cerr != nil {
			r.log.Warn("runc: cleanup after failed boot", "sandbox", id, "err", cerr)
		}
		return "", fmt.Errorf("runc: boot %s: %w", id, err)
	}
	if err != nil {
		return "", err
	}
	steps.log(ctx, r.log, id)
	// The next boot of a disk of this size finds one ready. Not at once:
	// the spare's writes beside the caller's commit of this boot made
	// that fsync some 3× slower.
	time.AfterFunc(spareAfter, func() { r.fillSpare(spec.Resources.DiskMiB) })
	return in.handle(id), nil
}

// validateBoot refuses bad input before anything touches the disk.
func validateBoot(spec torpor.BootSpec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	return instances.ValidateTemplate(spec.Template)
}

// start prepares the sandbox's disk and directories, mounts its root and
// its network and runs the container detached.
func (r *Runtime) start(ctx context.Context, spec torpor.BootSpec) (instance, error) {
	id := spec.SandboxID
	steps := stepsOf(ctx)
	if err := os.MkdirAll(r.sandboxDir(id), 0o755); err != nil {
		return instance{}, err
	}
	// The network namespace is made while the root is mounted: neither
	// needs the other, and each takes a few milliseconds.
	var netns string
	attached := make(chan error, 1)
	if r.net != nil {
		netns = r.netnsPath(id)
		go func() {
			t := time.Now()
			_, err := r.net.Attach(ctx, network.Endpoint{NetNS: netns, Internet: spec.AllowInternet, Egress: egressOf(spec.Network)})
			steps.since("network", t)
			attached <- err
		}()
	} else {
		attached <- nil
	}
	err := r.mountRoot(ctx, spec)
	if aerr := <-attached; err == nil {
		err = aerr
	}
	if err != nil {
		return instance{}, err
	}
	t := time.Now()
	if text := r.resolvConfOf(spec.AllowInternet, spec.Network); text != "" {
		if err := writeResolvConf(r.rootfsDir(id), text); err != nil {
			// The sandbox still runs, with its template's resolver settings.
			r.log.Warn("runc: writing the sandbox's /etc/resolv.conf", "sandbox", id, "err", err)
		}
	}
	vols, err := r.volumeBinds(ctx, spec.Volumes)
	if err != nil {
		return instance{}, err
	}
	config := buildSpec(specInput{
		Volumes:   vols,
		Boot:      spec,
		RootFS:    r.rootfsDir(id),
		Init:      r.init,
		RunDir:    r.runDir(id),
		Cgroup:    "/" + r.cgroupRel(id),
		SwapLimit: r.cg.swapLimitable(),
		NetNS:     netns,
	})
	b, err := json.MarshalIndent(config, "", "\t")
	if err != nil {
		return instance{}, err
	}
	if err := instances.WriteFileAtomic(filepath.Join(r.sandboxDir(id), "config.json"), b, 0o600); err != nil {
		return instance{}, err
	}
	_ = os.Remove(r.pidFile(id))
	_ = os.Remove(r.runcLog(id))
	t = steps.since("config", t)

	// The container's init inherits runc's stdio: /dev/null (exec's
	// default), never the daemon's own streams or a pipe that `runc run -d`
	// would keep open. runc's errors go to its log file.
	cmd := exec.CommandContext(ctx, r.runcPath, "--root", r.runcRoot, "--log", r.runcLog(id),
		"run", "--detach", "--pid-file", r.pidFile(id), "--bundle", r.sandboxDir(id), id)
	if err := cmd.Run(); err != nil {
		return instance{}, fmt.Errorf("runc run: %w: %s", err, instances.ReadTail(r.runcLog(id), 2048))
	}
	t = steps.since("runc_run", t)
	pid, err := instances.ReadPidFile(r.pidFile(id))
	if err != nil {
		return instance{}, fmt.Errorf("runc run: %w", err)
	}
	in := instance{Proc: instances.Proc{PID: pid}, Init: r.init.argv}
	if in.Start, _, err = instances.Stat(pid); err != nil {
		// Exited already; `runc state` still knows it as stopped.
		in.Start = ^uint64(0)
	}
	if err := r.saveInstance(id, in); err != nil {
		return instance{}, err
	}
	steps.since("record", t)
	return in, nil
}

// mountRoot mounts the sandbox's disk (making it at the first boot) and
// its root, the overlay of the template's layers and the disk, and makes
// init's run directory afresh.
func (r *Runtime) mountRoot(ctx context.Context, spec torpor.BootSpec) error {
	id := spec.SandboxID
	upper, work, err := r.prepareDisk(ctx, id, spec.Resources.DiskMiB)
	if err != nil {
		return err
	}
	t := time.Now()
	if err := os.MkdirAll(r.rootfsDir(id), 0o755); err != nil {
		return err
	}
	// Reports of the previous boot must not be mistaken for this one's.
	if err := os.RemoveAll(r.runDir(id)); err != nil {
		return err
	}
	if err := os.Mkdir(r.runDir(id), 0o755); err != nil {
		return err
	}
	err = mountLayers(spec.Template.LowerDirs(), upper, work, r.rootfsDir(id), filepath.Join(r.dir, "l"))
	stepsOf(ctx).since("overlay", t)
	return err
}

// writeResolvConf writes text to /etc/resolv.conf on the sandbox's disk,
// mounted at root, as a regular file of mode 0644. Paths are resolved
// inside root (package files): a symlink the template or the sandbox put
// there is replaced, never followed out of it.
func writeResolvConf(root, text string) error {
	fr, err := files.OpenRoot(root)
	if err != nil {
		return err
	}
	defer fr.Close()
	mode := files.Mode(0o644)
	_, err = fr.Write("/etc/resolv.conf", strings.NewReader(text), files.WriteOptions{Mode: &mode})
	return err
}

// awaitReady polls init's run directory until it reports ready or failure,
// or its init dies, or ctx ends.
func (r *Runtime) awaitReady(ctx context.Context, id string, in instance) error {
	run := r.runDir(id)
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	for {
		if fi, err := os.Lstat(filepath.Join(run, initproc.ReadyFile)); err == nil && fi.Mode().IsRegular() {
			return nil
		}
		if _, err := os.Lstat(filepath.Join(run, initproc.ResultFile)); err == nil {
			// Init reports, then exits: let it, so that Inspect agrees.
			if err := in.AwaitExit(ctx); err != nil {
				return fmt.Errorf("init reported a failure but did not exit: %w", err)
			}
			return r.bootFailure(id)
		}
		if !in.Alive() {
			if _, err := os.Lstat(filepath.Join(run, initproc.ReadyFile)); err == nil {
				return nil // ready, then the entrypoint exited at once
			}
			return r.bootFailure(id)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// bootFailure turns init's report of a failed boot into an error.
func (r *Runtime) bootFailure(id string) error {
	f := r.failure(id)
	if f == nil {
		return errors.New("the sandbox's init stopped during boot")
	}
	switch f.Code {
	case torpor.FailureSetup:
		return &torpor.Error{Code: torpor.EInvalid, Param: "setup", Reason: torpor.FailureSetup, Message: f.Message}
	case torpor.FailureEntrypoint:
		return &torpor.Error{Code: torpor.EInvalid, Param: "entrypoint", Reason: torpor.FailureEntrypoint, Message: f.Message}
	case torpor.FailureOOM:
		return &torpor.Error{Code: torpor.EInvalid, Param: "resources.memory_mib", Reason: torpor.FailureOOM, Message: f.Message}
	}
	return fmt.Errorf("%s: %s", f.Message, instances.ReadTail(r.runcLog(id), 2048))
}
