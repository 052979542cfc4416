package lifecycle_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

// fullStore is a store on a data disk that fills up: once filled, every
// write of a sandbox is refused with torpor.DiskFull, after the room
// writes that still fit.
type fullStore struct {
	torpor.Store
	mu   sync.Mutex
	full bool
	room int
}

func (s *fullStore) fill(room int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.full, s.room = true, room
}

func (s *fullStore) free() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.full = false
}

func (s *fullStore) refuse() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.full {
		return nil
	}
	if s.room > 0 {
		s.room--
		return nil
	}
	return torpor.DiskFull()
}

func (s *fullStore) CreateSandbox(ctx context.Context, sb *torpor.Sandbox, events ...torpor.Event) error {
	if err := s.refuse(); err != nil {
		return err
	}
	return s.Store.CreateSandbox(ctx, sb, events...)
}

func (s *fullStore) UpdateSandbox(ctx context.Context, sb *torpor.Sandbox, events ...torpor.Event) error {
	if err := s.refuse(); err != nil {
		return err
	}
	return s.Store.UpdateSandbox(ctx, sb, events...)
}

func (s *fullStore) UpdateSandboxUsage(ctx context.Context, sb *torpor.Sandbox, usage []torpor.UsageRecord, events ...torpor.Event) error {
	if err := s.refuse(); err != nil {
		return err
	}
	return s.Store.UpdateSandboxUsage(ctx, sb, usage, events...)
}

func newFullEnv(t *testing.T) (*env, *fullStore) {
	fs := &fullStore{}
	e := newEnv(t, func(c *lifecycle.Config) {
		fs.Store = c.Store
		c.Store = fs
	})
	return e, fs
}

// stored returns the sandbox as the store has it, terminated included.
func stored(e *env, id string) *torpor.Sandbox {
	e.t.Helper()
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return sb
}

// TestFullDiskRefusesWithoutChange: with the data disk full from the
// first write, every verb is refused with the full disk and changes
// nothing, neither in the store nor on the host; once there is room again
// they work, with no restart.
func TestFullDiskRefusesWithoutChange(t *testing.T) {
	e, fs := newFullEnv(t)
	sb := e.create(torpor.CreateRequest{})
	fs.fill(0)
	for name, verb := range map[string]func() error{
		"pause":     func() error { _, err := e.eng.Pause(ctx, "acme", sb.ID, ""); return err },
		"hibernate": func() error { _, err := e.eng.Hibernate(ctx, "acme", sb.ID); return err },
		"restart":   func() error { _, err := e.eng.Restart(ctx, "acme", sb.ID); return err },
		"touch":     func() error { _, err := e.eng.Touch(ctx, "acme", sb.ID); return err },
		"delete":    func() error { _, err := e.eng.Delete(ctx, "acme", sb.ID); return err },
		"create":    func() error { _, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"}); return err },
	} {
		if err := verb(); !torpor.IsDiskFull(err) || torpor.ErrorCodeOf(err) != torpor.EUnavailable {
			t.Errorf("%s with the data disk full: %v, want the full disk", name, err)
		}
	}
	if got := stored(e, sb.ID); got.State != torpor.StateRunning || got.Boots != 1 || e.host.State(sb.ID) != torpor.InstanceRunning {
		t.Fatalf("after the refusals: %s, %d boots, instance %s", got.State, got.Boots, e.host.State(sb.ID))
	}
	if all, _ := e.eng.List(ctx, "acme", torpor.SandboxFilter{IncludeTerminated: true}); len(all) != 1 {
		t.Fatalf("%d sandboxes, want the one", len(all))
	}
	e.clock.Advance(time.Minute) // the sweeps the refusals asked for find nothing to do
	fs.free()
	must(e.eng.Pause(ctx, "acme", sb.ID, ""))
	must(e.eng.Delete(ctx, "acme", sb.ID))
}

// TestFullDiskCutShortIsFinished: a transition whose first write went
// through and a later one not stays in its in-between state while the disk
// is full, and is finished once there is room, with no restart; a create
// cut short so is deleted, since its caller heard that it failed.
func TestFullDiskCutShortIsFinished(t *testing.T) {
	e, fs := newFullEnv(t)
	hib := e.create(torpor.CreateRequest{})

	fs.fill(1) // hibernating is stored, hibernated is not
	if _, err := e.eng.Hibernate(ctx, "acme", hib.ID); !torpor.IsDiskFull(err) {
		t.Fatalf("hibernate cut short: %v", err)
	}
	if got := stored(e, hib.ID); got.State != torpor.StateHibernating {
		t.Fatalf("hibernate cut short: stored %s", got.State)
	}
	fs.fill(1) // the record of the create is stored, its boot's outcome is not
	if _, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"}); !torpor.IsDiskFull(err) {
		t.Fatalf("create cut short: %v", err)
	}
	var created string
	all, _ := e.eng.List(ctx, "acme", torpor.SandboxFilter{})
	for _, sb := range all {
		if sb.ID != hib.ID {
			created = sb.ID
		}
	}
	if created == "" || stored(e, created).State != torpor.StateStarting || e.host.State(created) != torpor.InstanceRunning {
		t.Fatalf("create cut short: %q stored %+v", created, all)
	}

	// Still full: they wait.
	e.clock.Advance(time.Minute)
	time.Sleep(50 * time.Millisecond)
	if got := stored(e, hib.ID); got.State != torpor.StateHibernating {
		t.Fatalf("while full: %s", got.State)
	}

	fs.free()
	e.clock.Advance(time.Minute)
	if got := waitState(e, hib.ID, torpor.StateHibernated); e.host.State(hib.ID) == torpor.InstanceRunning || !e.host.HasDisk(hib.ID) {
		t.Fatalf("the hibernation finished: %s, instance %s", got.State, e.host.State(hib.ID))
	}
	if got := waitState(e, created, torpor.StateTerminated); e.host.State(created) == torpor.InstanceRunning || e.host.HasDisk(created) {
		t.Fatalf("the create cut short: %s, instance %s, disk %v", got.State, e.host.State(created), e.host.HasDisk(created))
	}
	must(e.eng.Start(ctx, "acme", hib.ID))
}

// TestBootOnFullDiskSaysSo: a boot that finds no space on the host fails
// the sandbox with a failure that says the data disk is full, without the
// host's paths.
func TestBootOnFullDiskSaysSo(t *testing.T) {
	e := newEnv(t)
	e.host.FailNext("boot", &os.PathError{Op: "write", Path: "/var/lib/torpor/runc/sandboxes/x/disk.img.tmp", Err: syscall.ENOSPC})
	sb, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != torpor.StateFailed || sb.Failure == nil || !strings.Contains(sb.Failure.Message, "data disk is full") || strings.Contains(sb.Failure.Message, "/var/lib") {
		t.Fatalf("boot with no space: %s %+v", sb.State, sb.Failure)
	}
}

// Operations that write into a sandbox store nothing of their own, so a
// full data disk would not refuse them through the store: they ask the
// probe, and are refused while it says full (reads are e2e's
// TestFullDataDisk: the fake runtime has no files).
func TestFullDiskRefusesOperationsThatWrite(t *testing.T) {
	var full atomic.Bool
	e := newEnv(t, func(c *lifecycle.Config) { c.DataDiskFull = full.Load })
	sb := e.create(torpor.CreateRequest{})
	full.Store(true)
	if _, err := e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"true"}}); !torpor.IsDiskFull(err) {
		t.Fatalf("exec with the data disk full: %v, want disk_full", err)
	}
	if _, _, err := e.eng.Files(ctx, "acme", sb.ID, true); !torpor.IsDiskFull(err) {
		t.Fatalf("a file write with the data disk full: %v, want disk_full", err)
	}
	full.Store(false)
	if _, err := e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"true"}}); err != nil {
		t.Fatalf("exec once space is back: %v", err)
	}
}
