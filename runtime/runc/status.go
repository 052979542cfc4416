package runc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/runtime/instances"
)

// Inspect tells whether the instance runs, is frozen, has stopped (and
// why) or is missing.
func (r *Runtime) Inspect(ctx context.Context, ref torpor.InstanceRef) (torpor.InstanceStatus, error) {
	return instances.Inspect(ctx, ref, checkRef, r.inspect)
}

// inspect returns the status and the instance record (nil when missing).
func (r *Runtime) inspect(ctx context.Context, id string) (torpor.InstanceStatus, *instance, error) {
	st := torpor.InstanceStatus{State: torpor.InstanceMissing, DiskExists: r.diskExists(id)}
	in, alive, err := r.lookup(ctx, id)
	if err != nil {
		return st, nil, fmt.Errorf("runc: inspect %s: %w", id, err)
	}
	if in == nil {
		return st, nil, nil
	}
	if !alive {
		st.State = torpor.InstanceStopped
		st.Failure = r.failure(id)
		return st, in, nil
	}
	frozen, err := r.cg.frozen(r.cgroupRel(id))
	if err != nil {
		return st, in, fmt.Errorf("runc: inspect %s: freezer: %w", id, err)
	}
	st.State = torpor.InstanceRunning
	if frozen {
		st.State = torpor.InstanceFrozen
	}
	return st, in, nil
}

// findInstance returns the instance record, or, when a crash came between
// `runc run` and the record, rebuilds it from `runc state`.
func (r *Runtime) findInstance(ctx context.Context, id string) (*instance, error) {
	in, err := r.loadInstance(id)
	if in != nil || err != nil {
		return in, err
	}
	if _, err := os.Stat(r.runcState(id)); err != nil {
		return nil, nil
	}
	out, err := r.runc(ctx, "state", id)
	if err != nil {
		return nil, nil // gone meanwhile, or never created
	}
	var s struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal(out, &s); err != nil || s.Pid <= 0 {
		return nil, nil
	}
	start, _, err := instances.Stat(s.Pid)
	if err != nil {
		// Its init is gone: a stopped container of unknown start time.
		start = ^uint64(0)
	}
	return &instance{Proc: instances.Proc{PID: s.Pid, Start: start}, Init: r.bundleInit(id)}, nil
}

// bundleInit reads, from the sandbox's OCI config, the command that runs
// its init binary: the words of init's command line before "init".
func (r *Runtime) bundleInit(id string) []string {
	b, err := os.ReadFile(filepath.Join(r.sandboxDir(id), "config.json"))
	if err != nil {
		return nil
	}
	var spec struct {
		Process struct {
			Args []string `json:"args"`
		} `json:"process"`
	}
	if json.Unmarshal(b, &spec) != nil {
		return nil
	}
	if i := slices.Index(spec.Process.Args, "init"); i > 0 {
		return spec.Process.Args[:i]
	}
	return nil
}

// failure says why a stopped instance stopped, from init's report and the
// memory cgroup's OOM counter. The report comes from inside the sandbox and
// is read defensively.
func (r *Runtime) failure(id string) *torpor.Failure {
	var res initproc.Result
	ok, err := initproc.ReadReport(r.runDir(id), initproc.ResultFile, &res)
	ooms := r.cg.oomKills(r.cgroupRel(id))
	code := res.ExitCode
	switch {
	case err != nil:
		return &torpor.Failure{Code: torpor.FailureRuntime, Message: "unreadable init report: " + err.Error()}
	case ok && res.Kind == torpor.FailureSetup:
		msg := res.Message
		if ooms > 0 {
			msg += " (the sandbox ran out of memory)"
		}
		return &torpor.Failure{Code: torpor.FailureSetup, Message: instances.WithOutput(msg, res.Output), ExitCode: &code}
	case ok && res.Kind == torpor.FailureEntrypoint:
		if ooms > 0 && (res.ExitCode != 0 || res.Signal != "") {
			return &torpor.Failure{Code: torpor.FailureOOM, ExitCode: &code,
				Message: "the sandbox ran out of memory: " + initproc.SandboxText(res.Message, 512)}
		}
		return &torpor.Failure{Code: torpor.FailureEntrypoint, Message: instances.WithOutput(res.Message, res.Output), ExitCode: &code}
	case ok && res.Kind == initproc.KindTerminated:
		// Init itself stands for the entrypoint of an idle sandbox.
		return &torpor.Failure{Code: torpor.FailureEntrypoint, Message: initproc.SandboxText(res.Message, 1024), ExitCode: &code}
	case ooms > 0:
		return &torpor.Failure{Code: torpor.FailureOOM, Message: "the sandbox ran out of memory and its init was killed"}
	case ok:
		return &torpor.Failure{Code: torpor.FailureRuntime, Message: "init failed: " + initproc.SandboxText(res.Message, 1024)}
	}
	return &torpor.Failure{Code: torpor.FailureRuntime, Message: "the sandbox's init exited without a report"}
}

// Wait blocks until the instance's init exits (or ctx ends) and returns
// the status as Inspect would.
func (r *Runtime) Wait(ctx context.Context, ref torpor.InstanceRef) (torpor.InstanceStatus, error) {
	return instances.Wait(ctx, ref, checkRef, r.inspect, func(ctx context.Context, _ string, in *instance) error { return in.Wait(ctx) })
}
