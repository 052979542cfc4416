package lifecycle_test

import (
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// setQuota stores tenant acme with quota q (making the tenant when new).
func (e *env) setQuota(q torpor.Quota) {
	e.t.Helper()
	if _, err := e.store.GetTenant(ctx, "acme"); torpor.IsCode(err, torpor.ENotFound) {
		if err := e.store.CreateTenant(ctx, torpor.Tenant{Name: "acme", CreatedAt: time.Now()}); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := e.store.SetTenantQuota(ctx, "acme", q); err != nil {
		e.t.Fatal(err)
	}
}

func overQuota(err error) bool {
	te, ok := err.(*torpor.Error)
	return ok && te.Code == torpor.EForbidden && te.Reason == torpor.ReasonQuota
}

// max_sandboxes counts every sandbox that is not terminated, hibernated
// ones too; a refused create leaves nothing behind, and a delete frees
// the slot.
func TestQuotaMaxSandboxes(t *testing.T) {
	e := newEnv(t)
	e.setQuota(torpor.Quota{MaxSandboxes: 2})
	a := e.create(torpor.CreateRequest{})
	e.create(torpor.CreateRequest{})
	must(e.eng.Hibernate(ctx, "acme", a.ID))
	if _, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"}); !overQuota(err) {
		t.Fatalf("a third create with a hibernated sandbox: %v, want the quota refusal", err)
	}
	if list, _ := e.eng.List(ctx, "acme", torpor.SandboxFilter{IncludeTerminated: true}); len(list) != 2 {
		t.Fatalf("a refused create left a sandbox: %d listed", len(list))
	}
	// Another tenant is not bound by acme's quota.
	if _, err := e.eng.Create(ctx, "globex", torpor.CreateRequest{Template: "base"}); err != nil {
		t.Fatalf("globex's create: %v", err)
	}
	must(e.eng.Delete(ctx, "acme", a.ID))
	e.create(torpor.CreateRequest{})
	if got := e.eng.TenantUsage("acme"); got.Sandboxes != 2 {
		t.Fatalf("acme holds %+v, want 2 sandboxes", got)
	}
}

// vCPUs and memory are held as the node's capacity holds them: in full
// while running or paused by freeze (release ratio 0), nothing while
// paused to a snapshot or hibernated. A start or resume that takes them
// again is checked; the use survives a restart of the engine.
func TestQuotaVCPUsAndMemory(t *testing.T) {
	e := newEnv(t)
	e.setQuota(torpor.Quota{MaxVCPUs: 2, MaxMemoryMiB: 1024, MaxDiskMiB: 3 * 1024})
	one := &torpor.Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 1024}
	a := e.create(torpor.CreateRequest{Resources: one})
	b := e.create(torpor.CreateRequest{Resources: one})
	if _, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", Resources: one}); !overQuota(err) {
		t.Fatalf("a create past max_vcpus: %v", err)
	}
	must(e.eng.Pause(ctx, "acme", a.ID, torpor.PauseFreeze))
	if _, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", Resources: one}); !overQuota(err) {
		t.Fatalf("a create while a frozen sandbox keeps its memory: %v", err)
	}
	must(e.eng.Start(ctx, "acme", a.ID))
	must(e.eng.Pause(ctx, "acme", a.ID, torpor.PauseSnapshot))
	c := e.create(torpor.CreateRequest{Resources: one}) // the snapshot holds no CPU, no memory
	if got := e.eng.TenantUsage("acme"); got != (torpor.QuotaUsage{Sandboxes: 3, VCPUs: 2, MemoryMiB: 1024, DiskMiB: 3 * 1024}) {
		t.Fatalf("acme holds %+v", got)
	}
	if _, err := e.eng.Start(ctx, "acme", a.ID); !overQuota(err) {
		t.Fatalf("a resume past max_vcpus: %v", err)
	}
	if got := e.get(a.ID); got.State != torpor.StatePaused || got.PauseMode != torpor.PauseSnapshot {
		t.Fatalf("a refused resume changed the sandbox: %s %s", got.State, got.PauseMode)
	}
	// Disk is full too (three of 1 GiB): hibernating frees CPU, not disk.
	must(e.eng.Hibernate(ctx, "acme", b.ID))
	if _, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", Resources: one}); !overQuota(err) {
		t.Fatalf("a create past max_disk_mib: %v", err)
	}
	must(e.eng.Start(ctx, "acme", a.ID))
	e.restart()
	if _, err := e.eng.Start(ctx, "acme", b.ID); !overQuota(err) {
		t.Fatalf("after a restart the quota forgot what runs: %v", err)
	}
	must(e.eng.Delete(ctx, "acme", c.ID))
	must(e.eng.Start(ctx, "acme", b.ID))
}

// A failed boot keeps the sandbox (and its disk) until it is deleted: it
// counts against max_sandboxes, not against vCPUs.
func TestQuotaCountsFailedSandboxes(t *testing.T) {
	e := newEnv(t)
	e.setQuota(torpor.Quota{MaxSandboxes: 1, MaxVCPUs: 1})
	e.host.FailNext("boot", &torpor.Error{Code: torpor.EConflict, Reason: torpor.FailureSetup, Message: "setup command 1 exited with status 1"})
	sb := e.create(torpor.CreateRequest{Resources: &torpor.Resources{VCPUs: 1}})
	if sb.State != torpor.StateFailed {
		t.Fatalf("sandbox is %s, want failed", sb.State)
	}
	if got := e.eng.TenantUsage("acme"); got.Sandboxes != 1 || got.VCPUs != 0 {
		t.Fatalf("a failed sandbox holds %+v", got)
	}
	if _, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"}); !overQuota(err) {
		t.Fatalf("a create beside a failed sandbox: %v", err)
	}
}

// Concurrent creates cannot both take the last slot: with room for three,
// exactly three of many succeed.
func TestQuotaConcurrentCreates(t *testing.T) {
	e := newEnv(t)
	e.setQuota(torpor.Quota{MaxSandboxes: 3})
	var (
		wg               sync.WaitGroup
		mu               sync.Mutex
		created, refused int
		other            []error
	)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				created++
			case overQuota(err):
				refused++
			default:
				other = append(other, err)
			}
		}()
	}
	wg.Wait()
	if created != 3 || refused != 13 || len(other) > 0 {
		t.Fatalf("%d created, %d refused, other errors %v; want 3 and 13", created, refused, other)
	}
	if list, _ := e.eng.List(ctx, "acme", torpor.SandboxFilter{}); len(list) != 3 {
		t.Fatalf("%d sandboxes stored, want 3", len(list))
	}
}
