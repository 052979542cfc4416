package postgres_test

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu/gpulease"
	"github.com/torpor-dev/torpor/store/postgres"
	"github.com/torpor-dev/torpor/store/postgres/pgtest"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// CopyFromSQLite moves every table: what the PostgreSQL store returns is
// what the SQLite store returned, event and ledger numbers included, and
// numbers handed out afterwards carry on after them. A second copy into
// the now non-empty database is refused and changes nothing.
func TestCopyFromSQLite(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	path := filepath.Join(dir, "torpor.db")
	src, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2025, 3, 14, 15, 9, 26, 535897000, time.UTC)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(src.CreateTenant(ctx, torpor.Tenant{Name: "acme", CreatedAt: t0, Quota: torpor.Quota{MaxSandboxes: 3, MaxVCPUs: 2.5}}))
	must(src.CreateAPIKey(ctx, torpor.APIKey{ID: "key_1", Tenant: "acme", Admin: true, Hash: "sha256:aa", CreatedAt: t0}))
	must(src.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/rootfs/base", CreatedAt: t0, Layers: []string{"l1"}}))
	must(src.CreateWebhook(ctx, torpor.Webhook{ID: "wh_1", Tenant: "acme", URL: "https://example.com/h", Secret: "whsec_x", CreatedAt: t0}))
	epoch, err := src.JoinNode(ctx, torpor.Node{Name: "node-a", Address: "10.0.0.1:7420", Labels: map[string]string{"zone": "eu-1"},
		Runtimes: []string{"runc"}, Capacity: torpor.Resources{VCPUs: 8}})
	must(err)
	var sbs []*torpor.Sandbox
	for i, id := range []string{"sb_b", "sb_a"} {
		sb := &torpor.Sandbox{ID: id, Tenant: "acme", Template: "base", State: torpor.StateRunning, CreatedAt: t0.Add(time.Duration(i) * time.Second),
			Metadata: map[string]string{"owner": "ada"}, Env: map[string]string{"K": "v"}, Node: "node-a", NodeEpoch: epoch}
		must(src.CreateSandbox(ctx, sb, torpor.Event{Type: torpor.EventCreated, SandboxID: id, Tenant: "acme", Time: t0}))
		sb.State = torpor.StatePaused
		must(src.UpdateSandboxUsage(ctx, sb, []torpor.UsageRecord{{SandboxID: id, Tenant: "acme", Kind: torpor.UsageRunning,
			Start: t0, End: t0.Add(time.Minute), Seconds: 60, Cost: 0.5}}, torpor.Event{Type: torpor.EventPaused, SandboxID: id, Tenant: "acme", Time: t0, Attrs: map[string]string{}}))
		sbs = append(sbs, sb)
	}
	must(src.SaveLease(ctx, gpulease.Record{Spec: gpulease.Spec{ID: "gl_1"}}, []gpulease.UsageRow{{LeaseID: "gl_1", Tenant: "acme", Kind: "busy",
		Cause: "run", Billed: true, Start: t0, End: t0.Add(time.Second), Seconds: 1, GPUs: 1, SliceMiB: 1024}}))
	must(src.FlagKey(ctx, gpulease.Flag{Tenant: "acme", KeyID: "key_1", LeaseID: "gl_1", At: t0}))
	must(src.SetPool(ctx, torpor.PoolConfig{Template: "base", Size: 2, AllowInternet: true}))
	must(src.CreateVolume(ctx, torpor.Volume{Tenant: "acme", Name: "data", ID: "vol_1", SizeMiB: 64, Node: "n1", CreatedAt: t0, UpdatedAt: t0}))
	_, err = src.SetSecret(ctx, "acme", "db", []byte("v1"), t0)
	must(err)
	_, err = src.SetSecret(ctx, "acme", "db", []byte("hunter2"), t0.Add(time.Hour))
	must(err)
	must(src.Close())
	src, err = sqlite.Open(ctx, path)
	must(err)
	defer src.Close()

	url := pgtest.NewDatabase(t)
	dst := open(t, url, dir)
	defer dst.Close()
	var lines []string
	must(postgres.CopyFromSQLite(ctx, path, dst, func(table string, done, total int64) {
		lines = append(lines, table)
	}))
	if len(lines) < 13 {
		t.Errorf("progress told of %d tables, want every one: %q", len(lines), lines)
	}

	same := func(what string, get func(torpor.Store) (any, error)) {
		t.Helper()
		want, err := get(src)
		must(err)
		got, err := get(dst)
		must(err)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s after the copy:\n got %#v\nwant %#v", what, got, want)
		}
	}
	same("sandboxes", func(s torpor.Store) (any, error) {
		return s.ListSandboxes(ctx, torpor.SandboxFilter{IncludeTerminated: true, Metadata: map[string]string{"owner": "ada"}})
	})
	same("events", func(s torpor.Store) (any, error) { return s.ListEvents(ctx, torpor.EventFilter{}) })
	same("usage", func(s torpor.Store) (any, error) { return s.ListUsage(ctx, torpor.UsageFilter{}) })
	same("tenants", func(s torpor.Store) (any, error) { return s.ListTenants(ctx) })
	same("key", func(s torpor.Store) (any, error) { return s.APIKeyByHash(ctx, "sha256:aa") })
	same("templates", func(s torpor.Store) (any, error) { return s.ListTemplates(ctx) })
	same("webhooks", func(s torpor.Store) (any, error) { return s.ListWebhooks(ctx, "") })
	leases, err := dst.ListLeases(ctx)
	if err != nil || len(leases) != 1 || leases[0].Spec.ID != "gl_1" {
		t.Errorf("GPU leases after the copy: %+v, %v", leases, err)
	}
	if rows, err := dst.ListGPUUsage(ctx, "gl_1"); err != nil || len(rows) != 1 || !rows[0].Billed {
		t.Errorf("GPU usage after the copy: %+v, %v", rows, err)
	}
	if flags, err := dst.KeyFlags(ctx, "key_1"); err != nil || len(flags) != 1 {
		t.Errorf("key flags after the copy: %+v, %v", flags, err)
	}
	same("secrets", func(s torpor.Store) (any, error) { return s.ListSecrets(ctx, "acme") })
	same("volumes", func(s torpor.Store) (any, error) { return s.ListVolumes(ctx, "acme") })
	if v, err := dst.SecretValue(ctx, "acme", "db"); err != nil || string(v) != "hunter2" {
		t.Errorf("secret value after the copy: %q, %v", v, err)
	}
	same("pools", func(s torpor.Store) (any, error) { return s.(torpor.PoolStore).PoolConfigs(ctx) })
	same("nodes", func(s torpor.Store) (any, error) { return s.(torpor.NodeStore).ListNodes(ctx) })
	same("node-a's sandboxes", func(s torpor.Store) (any, error) { return s.ListSandboxes(ctx, torpor.SandboxFilter{Node: "node-a"}) })

	// Numbers carry on after the copied ones; versions too.
	before, _ := dst.ListEvents(ctx, torpor.EventFilter{})
	sb := sbs[0]
	sb.State = torpor.StateRunning
	must(dst.UpdateSandbox(ctx, sb, torpor.Event{Type: torpor.EventResumed, SandboxID: sb.ID, Tenant: "acme", Time: t0}))
	after, _ := dst.ListEvents(ctx, torpor.EventFilter{After: before[len(before)-1].Seq})
	if len(after) != 1 || after[0].Type != torpor.EventResumed {
		t.Errorf("events after the last copied one: %+v", after)
	}

	err = postgres.CopyFromSQLite(ctx, path, dst, nil)
	if !torpor.IsCode(err, torpor.EConflict) || !strings.Contains(err.Error(), "empty") {
		t.Errorf("a second copy: %v, want a conflict saying the target is not empty", err)
	}
	if err := postgres.CopyFromSQLite(ctx, filepath.Join(dir, "missing.db"), dst, nil); err == nil {
		t.Error("a copy from a missing file succeeded")
	}
}
