package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/runtime/instances"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// stoppedStatus reports whether a QEMU run state means the guest has
// stopped for good (powered off, panicked, broke).
func stoppedStatus(s string) bool {
	switch s {
	case "shutdown", "guest-panicked", "internal-error", "io-error":
		return true
	}
	return false
}

// frozenStatus reports whether a run state is a pause: the vCPUs stopped,
// the memory kept (a QMP stop, or a migration's ends).
func frozenStatus(s string) bool {
	switch s {
	case "paused", "postmigrate", "inmigrate", "prelaunch", "finish-migrate", "restore-vm", "save-vm", "suspended", "debug", "watchdog", "colo":
		return true
	}
	return false
}

func (r *Runtime) loadInstance(id string) (*instance, error) {
	var in instance
	ok, err := r.loadJSON(id, "instance.json", &in)
	if err != nil || !ok {
		return nil, err
	}
	if in.PID <= 0 {
		return nil, fmt.Errorf("instance record of %s is corrupt", id)
	}
	return &in, nil
}

// Inspect tells whether the VM runs, is frozen, has stopped (and why) or
// is missing (never booted, stopped by the runtime, or snapshotted).
func (r *Runtime) Inspect(ctx context.Context, ref torpor.InstanceRef) (torpor.InstanceStatus, error) {
	return instances.Inspect(ctx, ref, checkRef, r.inspect)
}

// inspect returns the status and the instance record (nil when missing).
// A guest found stopped has its report collected and its QEMU ended.
func (r *Runtime) inspect(ctx context.Context, id string) (torpor.InstanceStatus, *instance, error) {
	st := torpor.InstanceStatus{State: torpor.InstanceMissing, DiskExists: r.diskExists(id)}
	in, err := r.loadInstance(id)
	if err != nil {
		return st, nil, fmt.Errorf("vm: inspect %s: %w", id, err)
	}
	if in == nil {
		return st, nil, nil
	}
	if !in.Alive() {
		st.State, st.Failure = torpor.InstanceStopped, r.failure(id)
		return st, in, nil
	}
	s, err := vmStatus(ctx, r.sandboxPath(id, qmpSock))
	if err != nil {
		if !in.Alive() {
			st.State, st.Failure = torpor.InstanceStopped, r.failure(id)
			return st, in, nil
		}
		return st, in, fmt.Errorf("vm: inspect %s: %w", id, err)
	}
	_, reported := os.Stat(r.sandboxPath(id, "result.json"))
	switch {
	case reported == nil && !stoppedStatus(s):
		// The agent reported the end; the guest is powering off.
		st.State, st.Failure = torpor.InstanceStopped, r.failure(id)
	case s == "running":
		st.State = torpor.InstanceRunning
	case stoppedStatus(s):
		r.collect(ctx, id, in, s)
		st.State, st.Failure = torpor.InstanceStopped, r.failure(id)
	default:
		st.State = torpor.InstanceFrozen
	}
	return st, in, nil
}

// collect reads the report a stopped guest left on its status port (or
// makes one from its console), records it and ends its QEMU.
func (r *Runtime) collect(ctx context.Context, id string, in *instance, status string) {
	if _, err := os.Stat(r.sandboxPath(id, "result.json")); err != nil {
		res := proto.Result{Kind: torpor.FailureRuntime, ExitCode: -1,
			Message: "the VM stopped (" + status + ") without a report from its agent"}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if q, err := dialQMP(cctx, r.sandboxPath(id, qmpSock)); err == nil {
			if s, err := q.ringbufRead(cctx, "status"); err == nil {
				if rep, ok := lastResult(s); ok {
					res = rep
				}
			}
			if res.Kind == torpor.FailureRuntime {
				if s, err := q.ringbufRead(cctx, "console"); err == nil && strings.TrimSpace(s) != "" {
					res.Output = initproc.SandboxText(s, 2048)
				}
			}
			q.close()
		}
		cancel()
		r.recordResult(id, res)
	}
	r.endQEMU(ctx, id, *in)
}

// lastResult finds the last well-formed report in what the guest wrote
// to its status port.
func lastResult(s string) (proto.Result, bool) {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var res proto.Result
		if json.Unmarshal([]byte(lines[i]), &res) == nil && res.Kind != "" {
			return res, true
		}
	}
	return proto.Result{}, false
}

// recordResult keeps why the instance stopped; the first record stays.
func (r *Runtime) recordResult(id string, res proto.Result) {
	p := r.sandboxPath(id, "result.json")
	if _, err := os.Stat(p); err == nil {
		return
	}
	if err := r.saveJSON(id, "result.json", res); err != nil {
		r.log.Warn("vm: record result", "sandbox", id, "err", err)
	}
}

// failure says why a stopped instance stopped, from its recorded result.
// What the guest reported comes from inside the sandbox: it is clipped
// and cleaned.
func (r *Runtime) failure(id string) *torpor.Failure {
	var res proto.Result
	ok, err := r.loadJSON(id, "result.json", &res)
	switch {
	case err != nil:
		return &torpor.Failure{Code: torpor.FailureRuntime, Message: "unreadable result record: " + err.Error()}
	case !ok:
		return &torpor.Failure{Code: torpor.FailureRuntime,
			Message: "the VM's QEMU exited unexpectedly: " + instances.ReadTail(r.sandboxPath(id, qemuLog), 1024)}
	}
	return failureOf(&res)
}

func failureOf(res *proto.Result) *torpor.Failure {
	code := res.ExitCode
	switch res.Kind {
	case torpor.FailureSetup, torpor.FailureEntrypoint:
		return &torpor.Failure{Code: res.Kind, Message: instances.WithOutput(res.Message, res.Output), ExitCode: &code}
	case torpor.FailureOOM:
		return &torpor.Failure{Code: torpor.FailureOOM, Message: initproc.SandboxText(res.Message, 512), ExitCode: &code}
	}
	return &torpor.Failure{Code: torpor.FailureRuntime, Message: instances.WithOutput(res.Message, res.Output)}
}

// endQEMU asks QEMU to quit (it flushes the disk's image) and waits for
// it; one that does not is killed.
func (r *Runtime) endQEMU(ctx context.Context, id string, in instance) {
	r.agents.drop(r.sandboxPath(id, agentSock))
	if !in.Alive() {
		return
	}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_ = qmpDo(qctx, r.sandboxPath(id, qmpSock), "quit", nil, nil)
	cancel()
	if err := in.AwaitExit(context.WithoutCancel(ctx)); err != nil {
		_ = in.Kill(context.Background())
	}
}

// removeInstance ends the sandbox's VM, keeping its disk: a running guest
// first has its processes ended and its file systems flushed by the
// agent (a frozen one is thawed for that), then QEMU quits and the
// sandbox leaves the network (its address stays leased). Each step
// tolerates what is already gone.
func (r *Runtime) removeInstance(ctx context.Context, id string) error {
	in, err := r.loadInstance(id)
	if err != nil {
		r.log.Warn("vm: unreadable instance record; removing it", "sandbox", id, "err", err)
	}
	if in != nil && in.Alive() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		s, err := vmStatus(sctx, r.sandboxPath(id, qmpSock))
		if err == nil && s == "paused" {
			if qmpDo(sctx, r.sandboxPath(id, qmpSock), "cont", nil, nil) == nil {
				s = "running"
			}
		}
		cancel()
		if err == nil && s == "running" {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
			if ac, release, err := r.agents.get(actx, r.sandboxPath(id, agentSock)); err == nil {
				if err := ac.call(actx, proto.OpShutdown, nil, nil); err != nil {
					r.log.Warn("vm: the agent did not shut down cleanly", "sandbox", id, "err", err)
				}
				release()
			}
			cancel()
		}
		r.endQEMU(ctx, id, *in)
		if in.Alive() {
			return fmt.Errorf("QEMU (pid %d) does not exit", in.PID)
		}
	}
	r.agents.drop(r.sandboxPath(id, agentSock))
	r.detach(ctx, id)
	return r.removeFiles(id, "instance.json", "result.json", qmpSock, agentSock, pidFile)
}

// Stop ends the VM and keeps the disk; a snapshot is dropped. Stopping a
// missing instance succeeds.
func (r *Runtime) Stop(ctx context.Context, ref torpor.InstanceRef) error {
	return instances.Locked(&r.locks, ref, checkRef, "vm: stop", func(id string) error {
		if err := r.removeInstance(ctx, id); err != nil {
			return err
		}
		return r.dropSnapshot(id)
	})
}

// Destroy ends the VM at once and removes everything of the sandbox: its
// disk, snapshot and records, and gives its address back. Destroying a
// missing sandbox succeeds.
func (r *Runtime) Destroy(ctx context.Context, ref torpor.InstanceRef) error {
	return instances.Locked(&r.locks, ref, checkRef, "vm: destroy", func(id string) error {
		r.agents.drop(r.sandboxPath(id, agentSock))
		if in, _ := r.loadInstance(id); in != nil {
			_ = in.Kill(context.Background())
			if in.Alive() {
				return fmt.Errorf("QEMU (pid %d) does not exit", in.PID)
			}
		}
		if r.net != nil {
			if err := r.net.Release(ctx, r.netnsPath(id)); err != nil {
				return err
			}
		}
		// A namespace left by a runtime that had a network (this one has
		// none now) would keep the directory busy.
		_ = unix.Unmount(r.netnsPath(id), unix.MNT_DETACH)
		if err := os.RemoveAll(r.sandboxDir(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	})
}

// Freeze stops the VM's vCPUs (QMP stop); its memory stays. Freezing a
// frozen instance succeeds.
func (r *Runtime) Freeze(ctx context.Context, ref torpor.InstanceRef) error {
	return r.setFrozen(ctx, ref, true)
}

// Thaw lets a frozen VM continue. Thawing a running one succeeds.
func (r *Runtime) Thaw(ctx context.Context, ref torpor.InstanceRef) error {
	return r.setFrozen(ctx, ref, false)
}

func (r *Runtime) setFrozen(ctx context.Context, ref torpor.InstanceRef, frozen bool) error {
	verb, cmd := "thaw", "cont"
	if frozen {
		verb, cmd = "freeze", "stop"
	}
	id, err := checkRef(ref)
	if err != nil {
		return err
	}
	defer r.locks.Lock(id)()
	st, _, err := r.inspect(ctx, id)
	if err != nil {
		return err
	}
	switch {
	case st.State == torpor.InstanceRunning && !frozen, st.State == torpor.InstanceFrozen && frozen:
		return nil
	case !instances.Live(st):
		return instances.StateError(verb, st)
	}
	if err := qmpDo(ctx, r.sandboxPath(id, qmpSock), cmd, nil, nil); err != nil {
		return fmt.Errorf("vm: %s %s: %w", verb, id, err)
	}
	return nil
}

// Wait blocks until the instance stops (or ctx ends) and returns the
// status as Inspect would. It watches both QEMU and the agent, whose
// answer comes the moment the entrypoint exits.
func (r *Runtime) Wait(ctx context.Context, ref torpor.InstanceRef) (torpor.InstanceStatus, error) {
	return instances.Wait(ctx, ref, checkRef, r.inspect, r.waitOnce)
}

// waitOnce returns when QEMU exits or the agent reports the end (which
// it records, ending QEMU), or with ctx's error.
func (r *Runtime) waitOnce(ctx context.Context, id string, in *instance) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{}, 2)
	go func() {
		_ = in.Wait(wctx)
		done <- struct{}{}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		ac, release, err := r.agents.get(wctx, r.sandboxPath(id, agentSock))
		if err != nil {
			<-wctx.Done() // QEMU's exit (or ctx) ends the wait
			return
		}
		defer release()
		var res proto.Result
		if err := ac.call(wctx, proto.OpWait, nil, &res); err != nil {
			if wctx.Err() == nil {
				time.Sleep(50 * time.Millisecond) // the VM is going away
			}
			return
		}
		if res.Kind != "" {
			r.recordResult(id, res)
			// The agent powers the guest off in a moment; end QEMU after
			// a grace, so that requests still answering finish first.
			go r.endLater(id, in.Proc)
		}
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// endGrace is how long a guest whose entrypoint ended keeps its QEMU
// before the runtime ends it.
const endGrace = time.Second

// endLater ends QEMU p of sandbox id after endGrace, if it is still the
// sandbox's instance.
func (r *Runtime) endLater(id string, p instances.Proc) {
	time.Sleep(endGrace)
	defer r.locks.Lock(id)()
	if cur, _ := r.loadInstance(id); cur != nil && cur.Proc == p {
		r.endQEMU(context.Background(), id, *cur)
	}
}

// List returns the ids of the sandboxes that have a directory.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(r.dir, "sandboxes"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("vm: list: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && torpor.ValidID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	sort.Strings(ids)
	return ids, nil
}
