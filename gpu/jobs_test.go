package gpu_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/gpu"
)

// TestAJobGetsTheSliceItsWorkerReleases: a job starts with the worker's
// reservation released, so its processes allocate inside the slice, and
// the top-up at its end takes the slice back.
func TestAJobGetsTheSliceItsWorkerReleases(t *testing.T) {
	e := newEnv(t, true)
	w := e.lease("a", gpu.SuspendTransparent)
	j, err := e.m.BeginJob(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if got := e.sim.Proc(w).VRAMMiB; got != workerCtx {
		t.Fatalf("worker holds %d MiB during the job, want only its context (%d)", got, workerCtx)
	}
	child := e.child("a", 6000)
	e.sim.Exit(child)
	if err := j.End(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := e.sim.Proc(w).VRAMMiB; got != sliceMiB {
		t.Fatalf("worker holds %d MiB after the job, want the slice", got)
	}
	if st := e.status("a"); st.Busy || st.Meters.Jobs != 1 {
		t.Fatalf("status = %+v", st)
	}
}

// TestTopUpLeavesRoomForAJobsLingeringProcesses: on a hard-cap host the
// top-up after a job never pushes the lease over its slice, so the
// watchdog does not kill it for our own reservation.
func TestTopUpLeavesRoomForAJobsLingeringProcesses(t *testing.T) {
	e := newEnv(t, true)
	w := e.lease("a", gpu.SuspendTransparent)
	e.jobChild("a", 1024)
	if got := e.sim.Proc(w).VRAMMiB; got != sliceMiB-1024 {
		t.Fatalf("worker topped up to %d MiB, want %d", got, sliceMiB-1024)
	}
	if st := e.status("a"); st.TargetMiB != sliceMiB || st.CapMiB != nil {
		t.Fatalf("the measured bound became sticky: %+v", st)
	}
	if r := e.m.Tick(context.Background()); len(r.Killed) != 0 {
		t.Fatalf("killed %v for our own top-up", r.Killed)
	}
}

// TestExecRunsFnAsAJob: Exec holds the lease for fn and ends the job
// whatever fn returns.
func TestExecRunsFnAsAJob(t *testing.T) {
	e := newEnv(t, false)
	e.lease("a", gpu.SuspendNone)
	e.pause("a")
	boom := errors.New("boom")
	err := e.m.Exec(context.Background(), "a", func(ctx context.Context) error {
		if st := e.status("a"); !st.Busy || st.Frozen {
			t.Errorf("inside the job: %+v", st)
		}
		e.clock.Advance(2 * time.Second)
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	st := e.status("a")
	if st.Busy {
		t.Fatal("the job still holds the lease")
	}
	wantSeconds(t, "busy_s", st.Meters.BusyS, 2)
}

// TestCreateValidatesTheSpec: a lease needs an id, a group, a worker and
// a slice; a duplicate id is a conflict.
func TestCreateValidatesTheSpec(t *testing.T) {
	e := newEnv(t, false)
	good := gpu.Spec{ID: "a", Group: "g-a", WorkerPID: e.sim.StartWorker("g-a", 0, 100),
		Accel: gpu.Accel{VRAMMiB: 1024, SuspendMode: gpu.SuspendNone}}
	for name, mut := range map[string]func(*gpu.Spec){
		"no id":     func(s *gpu.Spec) { s.ID = "" },
		"no group":  func(s *gpu.Spec) { s.Group = "" },
		"no worker": func(s *gpu.Spec) { s.WorkerPID = 0 },
		"no slice":  func(s *gpu.Spec) { s.Accel.VRAMMiB = 0 },
		"bad mode":  func(s *gpu.Spec) { s.Accel.SuspendMode = "hibernate" },
		"bad idle":  func(s *gpu.Spec) { s.Accel.IdleTimeoutS = 5 },
		"neg limit": func(s *gpu.Spec) { s.LimitMiB = -1 },
	} {
		s := good
		mut(&s)
		if _, err := e.m.Create(context.Background(), s); err == nil {
			t.Fatalf("%s: created", name)
		}
	}
	if _, err := e.m.Create(context.Background(), good); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Create(context.Background(), good); err == nil {
		t.Fatal("created a duplicate")
	}
}
