package lifecycle_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
)

func withPools(sizes map[string]int) func(*lifecycle.Config) {
	return func(c *lifecycle.Config) {
		for name, n := range sizes {
			c.WarmPools = append(c.WarmPools, torpor.PoolConfig{Template: name, Size: n})
		}
	}
}

// pool returns the status of template's pool (zero when it has none).
func (e *env) pool(template string) torpor.PoolStatus {
	for _, p := range e.eng.Pools() {
		if p.Template == template {
			return p
		}
	}
	return torpor.PoolStatus{}
}

// waitReady waits until template's pool has n ready members. The refill
// runs in the background; this waits for it, it times nothing.
func (e *env) waitReady(template string, n int) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for e.pool(template).Ready != n {
		if time.Now().After(deadline) {
			e.t.Fatalf("pool %s: %+v, want %d ready", template, e.pool(template), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// poolMembers returns the ids of the pool's members that are not
// terminated, straight from the store.
func (e *env) poolMembers() []string {
	e.t.Helper()
	sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{Tenant: torpor.PoolTenant})
	if err != nil {
		e.t.Fatal(err)
	}
	var ids []string
	for _, sb := range sbs {
		ids = append(ids, sb.ID)
	}
	return ids
}

// A matching create claims a frozen member: it runs at once under the
// claimant's tenant with its metadata, env and policy, its hostname is its
// id, its meters start at zero, it has the events of a cold create, and
// the pool refills.
func TestPoolClaim(t *testing.T) {
	e := newEnv(t, withPools(map[string]int{"base": 2}))
	e.waitReady("base", 2)
	members := e.poolMembers()
	for _, id := range members {
		if st := e.host.State(id); st != torpor.InstanceFrozen {
			t.Fatalf("pool member %s is %s, want frozen", id, st)
		}
	}
	if list, _ := e.eng.List(ctx, "acme", torpor.SandboxFilter{}); len(list) != 0 {
		t.Fatalf("a tenant lists the pool's members: %d", len(list))
	}
	e.clock.Advance(time.Hour) // pool time, billed to no one
	sb := e.create(torpor.CreateRequest{
		Metadata: map[string]string{"team": "ml"},
		Env:      map[string]string{"TOKEN": "s3cret"},
		PolicyRequest: torpor.PolicyRequest{
			Timeout: torpor.Seconds(60),
		},
	})
	if !sb.FromPool || sb.State != torpor.StateRunning || sb.Tenant != "acme" || sb.Metadata["team"] != "ml" {
		t.Fatalf("claimed sandbox = %+v", sb)
	}
	if e.host.State(sb.ID) != torpor.InstanceRunning {
		t.Fatalf("claimed instance is %s, want running", e.host.State(sb.ID))
	}
	if h := e.host.Spec(sb.ID).Hostname; h != sb.ID {
		t.Fatalf("hostname %q, want the sandbox id %q", h, sb.ID)
	}
	if e.host.Boots(sb.ID) != 1 {
		t.Fatalf("a claim booted the member again (%d boots)", e.host.Boots(sb.ID))
	}
	if sb.Meters.BilledS != 0 || sb.Meters.FrozenS != 0 || sb.Meters.Pauses != 0 {
		t.Fatalf("claimant's meters carry the pool's time: %+v", sb.Meters)
	}
	if next, ok := e.eng.NextDeadline(sb.ID); !ok || !next.Equal(e.clock.Now().Add(time.Minute)) {
		t.Fatalf("the claimant's idle timeout is not scheduled: %v %v", next, ok)
	}
	evs, err := e.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := types(evs); len(got) != 2 || got[0] != torpor.EventCreated || got[1] != torpor.EventStarted {
		t.Fatalf("claimant's events = %v, want created, started", got)
	}
	// The claimant's env reaches what it runs.
	info, err := e.eng.StartProcess(ctx, "acme", sb.ID, torpor.ProcessRequest{Cmd: []string{"env"}, Env: map[string]string{"MINE": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if info.Env["TOKEN"] != "s3cret" || info.Env["MINE"] != "1" {
		t.Fatalf("a process of the claimed sandbox has env %v", info.Env)
	}
	rows, err := e.eng.Usage(ctx, "acme", torpor.UsageFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.SandboxID == sb.ID && r.Start.Before(sb.CreatedAt) {
			t.Fatalf("acme is billed for the pool's time: %+v", r)
		}
	}
	if p := e.pool("base"); p.Hits != 1 || p.Misses != 0 {
		t.Fatalf("pool after a claim: %+v", p)
	}
	e.waitReady("base", 2)
	if got := e.poolMembers(); len(got) != 2 || got[0] == sb.ID || got[1] == sb.ID {
		t.Fatalf("pool members after the refill: %v (claimed %s)", got, sb.ID)
	}
}

func types(evs []torpor.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Type)
	}
	return out
}

// A create that asks for more than a default boot of the template (its
// own setup, entrypoint or resources) boots cold and leaves the
// pool alone; it is no miss.
func TestPoolNonMatchingBootsCold(t *testing.T) {
	e := newEnv(t, withPools(map[string]int{"base": 1}))
	e.waitReady("base", 1)
	for name, req := range map[string]torpor.CreateRequest{
		"setup":      {Runtime: torpor.RuntimeConfig{Setup: []string{"true"}}},
		"entrypoint": {Runtime: torpor.RuntimeConfig{Entrypoint: []string{"/bin/server"}}},
		"resources":  {Resources: &torpor.Resources{VCPUs: 2}},
	} {
		sb := e.create(req)
		if sb.FromPool {
			t.Errorf("%s: a create with its own %s claimed from the pool", name, name)
		}
	}
	if p := e.pool("base"); p.Ready != 1 || p.Hits != 0 || p.Misses != 0 {
		t.Fatalf("pool after non-matching creates: %+v", p)
	}
}

// The members survive a restart frozen and are adopted, not booted again;
// one that died meanwhile is replaced. A size set at run time outlives
// the restart.
func TestPoolSurvivesRestart(t *testing.T) {
	e := newEnv(t, withPools(map[string]int{"base": 1}))
	e.waitReady("base", 1)
	if _, err := e.eng.SetPool(ctx, "base", 2, nil); err != nil {
		t.Fatal(err)
	}
	e.waitReady("base", 2)
	members := e.poolMembers()
	e.host.Lose(members[0])
	e.restart()
	e.waitReady("base", 2)
	if p := e.pool("base"); p.Size != 2 {
		t.Fatalf("size after a restart: %+v, want the stored 2 over the configured 1", p)
	}
	if e.host.Boots(members[1]) != 1 || e.host.State(members[1]) != torpor.InstanceFrozen {
		t.Fatalf("the frozen member was not adopted as it was")
	}
	after := e.poolMembers()
	for _, id := range after {
		if id == members[0] {
			t.Fatalf("the lost member %s is still in the pool", id)
		}
	}
	sb := e.create(torpor.CreateRequest{})
	if !sb.FromPool {
		t.Fatal("a create after the restart did not claim")
	}
}

// A size of 0 removes the members; a tenant never sees them go.
func TestPoolShrinkRemovesMembers(t *testing.T) {
	e := newEnv(t, withPools(map[string]int{"base": 2}))
	e.waitReady("base", 2)
	members := e.poolMembers()
	if _, err := e.eng.SetPool(ctx, "base", 0, nil); err != nil {
		t.Fatal(err)
	}
	e.waitReady("base", 0)
	deadline := time.Now().Add(20 * time.Second)
	for _, id := range members {
		for e.host.State(id) != torpor.InstanceMissing {
			if time.Now().After(deadline) {
				t.Fatalf("member %s still %s", id, e.host.State(id))
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	if sb := e.create(torpor.CreateRequest{}); sb.FromPool {
		t.Fatal("a create claimed from a pool of size 0")
	}
	if _, err := e.eng.SetPool(ctx, "nope", 1, nil); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("a pool of a missing template: %v", err)
	}
	if _, err := e.eng.SetPool(ctx, "base", torpor.MaxPoolSize+1, nil); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("a pool too big: %v", err)
	}
}

// The claimant's quota applies at the claim, and a refusal leaves the
// member ready for the next create.
func TestPoolClaimChecksQuota(t *testing.T) {
	e := newEnv(t, withPools(map[string]int{"base": 1}))
	e.waitReady("base", 1)
	e.setQuota(torpor.Quota{MaxSandboxes: 1})
	e.create(torpor.CreateRequest{Runtime: torpor.RuntimeConfig{Setup: []string{"true"}}})
	if _, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"}); !overQuota(err) {
		t.Fatalf("a claim over the quota: %v", err)
	}
	e.waitReady("base", 1)
	if p := e.pool("base"); p.Hits != 0 {
		t.Fatalf("a refused claim counts a hit: %+v", p)
	}
	if sb, err := e.eng.Create(ctx, "globex", torpor.CreateRequest{Template: "base"}); err != nil || !sb.FromPool {
		t.Fatalf("another tenant's claim: %v %v", sb, err)
	}
}

// A member whose instance dies leaves the pool at once and is replaced.
func TestPoolReplacesADeadMember(t *testing.T) {
	e := newEnv(t, withPools(map[string]int{"base": 1}))
	e.waitReady("base", 1)
	dead := e.poolMembers()[0]
	e.host.Exit(dead, nil)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ids := e.poolMembers()
		if len(ids) == 1 && ids[0] != dead && e.pool("base").Ready == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead member was not replaced: %v %+v", ids, e.pool("base"))
		}
		time.Sleep(2 * time.Millisecond)
	}
	if sb := e.create(torpor.CreateRequest{}); !sb.FromPool || sb.ID == dead {
		t.Fatalf("the create after a member died: %+v", sb)
	}
}

// Members hold the node's capacity as paused sandboxes do, the release
// ratio applied; a claim takes the claimant's share in full.
func TestPoolMembersHoldCapacityAsPaused(t *testing.T) {
	e := newEnv(t, withPools(map[string]int{"base": 2}), func(c *lifecycle.Config) {
		c.Capacity = lifecycle.Capacity{VCPUs: 8, PausedReleaseRatio: 0.75}
	})
	e.waitReady("base", 2)
	if vcpus, _, _ := e.eng.CapacityUsed(); vcpus != 0.5 {
		t.Fatalf("two frozen members of 1 vCPU hold %v vCPUs, want 0.5", vcpus)
	}
	e.create(torpor.CreateRequest{})
	e.waitReady("base", 2)
	if vcpus, _, _ := e.eng.CapacityUsed(); vcpus != 1.5 {
		t.Fatalf("a claimed sandbox and two members hold %v vCPUs, want 1.5", vcpus)
	}
}

// A claim that a crash cut short (the member thawed, its claim never
// stored) leaves a member the restart does not adopt: it is removed and
// replaced, and no tenant ever sees it.
func TestPoolRestartRemovesAClaimCutShort(t *testing.T) {
	e := newEnv(t, withPools(map[string]int{"base": 1}))
	e.waitReady("base", 1)
	cut := e.poolMembers()[0]
	if err := fake.New(e.host).Thaw(ctx, torpor.InstanceRef{SandboxID: cut}); err != nil {
		t.Fatal(err)
	}
	e.restart()
	e.waitReady("base", 1)
	if e.host.State(cut) != torpor.InstanceMissing {
		t.Fatalf("the member whose claim was cut short is %s, want removed", e.host.State(cut))
	}
	if ids := e.poolMembers(); len(ids) != 1 || ids[0] == cut {
		t.Fatalf("pool members after the restart: %v", ids)
	}
	if list, _ := e.eng.List(ctx, "acme", torpor.SandboxFilter{IncludeTerminated: true}); len(list) != 0 {
		t.Fatalf("a tenant sees the pool's sandboxes: %d", len(list))
	}
}

// A pool of a template that does not exist says why it stays empty, and
// fills once the template is there.
func TestPoolOfAMissingTemplate(t *testing.T) {
	e := newEnv(t, withPools(map[string]int{"later": 1}))
	deadline := time.Now().Add(20 * time.Second)
	for e.pool("later").LastError == "" {
		if time.Now().After(deadline) {
			t.Fatalf("pool of a missing template: %+v", e.pool("later"))
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := e.store.PutTemplate(ctx, torpor.Template{Name: "later", RootFS: "/nonexistent", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// The retry comes on the engine's clock: move it until the pool fills.
	for e.pool("later").Ready != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not fill once its template was there: %+v", e.pool("later"))
		}
		e.clock.Advance(5 * time.Second)
		time.Sleep(2 * time.Millisecond)
	}
	if p := e.pool("later"); p.LastError != "" {
		t.Fatalf("the error stays after a refill that worked: %+v", p)
	}
}

// A template imported again makes its ready members stale: the next
// create does not claim one, the refill hears of it and replaces them,
// and creates claim again from the new members.
func TestPoolReplacesMembersOfATemplateStoredAgain(t *testing.T) {
	e := newEnv(t, withPools(map[string]int{"base": 2}))
	e.waitReady("base", 2)
	old := e.poolMembers()
	if err := e.store.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/nonexistent", CreatedAt: time.Now().Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	if sb := e.create(torpor.CreateRequest{}); sb.FromPool {
		t.Fatalf("a create claimed a member of the template before it was stored again: %s", sb.ID)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ids := e.poolMembers()
		if e.pool("base").Ready == 2 && len(ids) == 2 && !slices.Contains(ids, old[0]) && !slices.Contains(ids, old[1]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stale members were not replaced: before %v, now %v, %+v", old, ids, e.pool("base"))
		}
		time.Sleep(2 * time.Millisecond)
	}
	if sb := e.create(torpor.CreateRequest{}); !sb.FromPool {
		t.Fatalf("a create after the refill booted cold: %+v", e.pool("base"))
	}
}

// A pool whose members cannot freeze does not boot again and again: a
// failed round waits for its retry, which backs off, whatever removal of
// the failed member wakes the refill.
func TestPoolFailingFreezeBacksOff(t *testing.T) {
	e := newEnv(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			e.host.FailNext("freeze", errors.New("freezer broken"))
			time.Sleep(100 * time.Microsecond)
		}
	}()
	defer func() { close(stop); <-done }()
	if _, err := e.eng.SetPool(ctx, "base", 1, nil); err != nil {
		t.Fatal(err)
	}
	// The engine's clock stands still: no retry is due, so one boot is
	// all a failing pool may make however long it waits.
	time.Sleep(500 * time.Millisecond)
	sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{Tenant: torpor.PoolTenant, IncludeTerminated: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) > 2 {
		t.Fatalf("a pool that cannot freeze booted %d members before its retry was due", len(sbs))
	}
	if e.pool("base").LastError == "" {
		t.Fatalf("the pool does not say why it is empty: %+v", e.pool("base"))
	}
}

// A pool that could never fill is refused when it is set: a template
// whose members would need the internet on a server without a network.
func TestSetPoolRefusesAPoolThatCannotBoot(t *testing.T) {
	e := newEnv(t)
	yes := true
	if _, err := e.eng.SetPool(ctx, "base", 1, &yes); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("a pool with internet on a runtime without a network: %v, want invalid_argument", err)
	}
	if len(e.eng.Pools()) != 0 {
		t.Fatalf("the refused pool shows: %+v", e.eng.Pools())
	}
}
