package storetest

import (
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func listTests() []test {
	return []test{
		{"OldestFirstThenByID", testListOrder},
		{"ReturnsFullRecords", testListFullRecords},
		{"FilterByTenant", testListTenant},
		{"ExceptTenant", testListExceptTenant},
		{"FilterByStates", testListStates},
		{"TerminatedHiddenByDefault", testListHidesTerminated},
		{"TerminatedShownWhenAsked", testListShowsTerminated},
		{"FilterByMetadata", testListMetadata},
		{"MetadataFilterFollowsUpdates", testListMetadataUpdates},
		{"FiltersCombine", testListCombined},
		{"NoMatchIsEmpty", testListEmpty},
	}
}

// Sandboxes come oldest first; equal creation times are ordered by id. The
// order does not depend on the order of the writes, and a microsecond is
// enough to tell two creation times apart.
func testListOrder(t *testing.T, h *harness) {
	for _, sb := range []*torpor.Sandbox{
		newSandbox("sb_c", "acme", torpor.StateRunning, at(2*time.Second)),
		newSandbox("sb_b", "acme", torpor.StateRunning, at(time.Second)),
		newSandbox("sb_e", "acme", torpor.StateRunning, at(time.Microsecond)),
		newSandbox("sb_a", "acme", torpor.StateRunning, at(time.Second)),
		newSandbox("sb_d", "acme", torpor.StateRunning, at(0)),
	} {
		h.create(sb)
	}
	wantIDs(t, "ListSandboxes", h.list(torpor.SandboxFilter{}), "sb_d", "sb_e", "sb_a", "sb_b", "sb_c")

	// Updating a sandbox does not move it.
	d := h.get("sb_d")
	d.State = torpor.StatePaused
	h.update(d)
	wantIDs(t, "ListSandboxes after an update", h.list(torpor.SandboxFilter{}), "sb_d", "sb_e", "sb_a", "sb_b", "sb_c")
}

// A listed sandbox is the whole record, the same as GetSandbox returns.
func testListFullRecords(t *testing.T, h *harness) {
	full := fullSandbox("sb_full", "acme")
	full.State = torpor.StateFailed
	full.TerminatedAt = nil
	h.create(full)
	h.update(full)
	h.create(newSandbox("sb_plain", "acme", torpor.StateRunning, at(time.Hour)))

	got := h.list(torpor.SandboxFilter{})
	wantIDs(t, "ListSandboxes", got, "sb_full", "sb_plain")
	for _, sb := range got {
		checkSandbox(t, "listed "+sb.ID, sb, h.get(sb.ID))
	}
}

func testListTenant(t *testing.T, h *harness) {
	h.create(newSandbox("sb_1", "acme", torpor.StateRunning, at(0)))
	h.create(newSandbox("sb_2", "globex", torpor.StateRunning, at(time.Second)))
	h.create(newSandbox("sb_3", "acme", torpor.StatePaused, at(2*time.Second)))
	h.create(newSandbox("sb_4", "acme-corp", torpor.StateRunning, at(3*time.Second)))

	wantIDs(t, "tenant acme", h.list(torpor.SandboxFilter{Tenant: "acme"}), "sb_1", "sb_3")
	wantIDs(t, "tenant globex", h.list(torpor.SandboxFilter{Tenant: "globex"}), "sb_2")
	wantIDs(t, "tenant nobody", h.list(torpor.SandboxFilter{Tenant: "nobody"}))
	wantIDs(t, "every tenant", h.list(torpor.SandboxFilter{}), "sb_1", "sb_2", "sb_3", "sb_4")
}

// ExceptTenant leaves out one tenant's sandboxes and keeps every other's
// (the engine's view of every tenant but the warm pools').
func testListExceptTenant(t *testing.T, h *harness) {
	h.create(newSandbox("sb_1", "acme", torpor.StateRunning, at(0)))
	h.create(newSandbox("sb_2", torpor.PoolTenant, torpor.StateRunning, at(time.Second)))
	h.create(newSandbox("sb_3", "globex", torpor.StatePaused, at(2*time.Second)))
	h.create(newSandbox("sb_4", torpor.PoolTenant, torpor.StatePaused, at(3*time.Second)))

	wantIDs(t, "every tenant but the pools'", h.list(torpor.SandboxFilter{ExceptTenant: torpor.PoolTenant}), "sb_1", "sb_3")
	wantIDs(t, "paused, every tenant but the pools'", h.list(torpor.SandboxFilter{ExceptTenant: torpor.PoolTenant, States: []torpor.State{torpor.StatePaused}}), "sb_3")
	wantIDs(t, "acme but not globex", h.list(torpor.SandboxFilter{Tenant: "acme", ExceptTenant: "globex"}), "sb_1")
	wantIDs(t, "acme but not acme", h.list(torpor.SandboxFilter{Tenant: "acme", ExceptTenant: "acme"}))
}

// createOnePerState creates one sandbox in each state, named after it, in
// lifecycle order.
func createOnePerState(h *harness) {
	h.t.Helper()
	for i, st := range torpor.AllStates {
		h.create(newSandbox("sb_"+string(st), "acme", st, at(time.Duration(i)*time.Second)))
	}
}

func testListStates(t *testing.T, h *harness) {
	createOnePerState(h)
	wantIDs(t, "paused and hibernated",
		h.list(torpor.SandboxFilter{States: []torpor.State{torpor.StateHibernated, torpor.StatePaused}}),
		"sb_paused", "sb_hibernated")
	wantIDs(t, "running", h.list(torpor.SandboxFilter{States: []torpor.State{torpor.StateRunning}}), "sb_running")
	wantIDs(t, "failed", h.list(torpor.SandboxFilter{States: []torpor.State{torpor.StateFailed}}), "sb_failed")
}

// With no States, terminated sandboxes are left out (failed ones are not).
func testListHidesTerminated(t *testing.T, h *harness) {
	createOnePerState(h)
	var want []string
	for _, st := range torpor.AllStates {
		if st != torpor.StateTerminated {
			want = append(want, "sb_"+string(st))
		}
	}
	wantIDs(t, "default filter", h.list(torpor.SandboxFilter{}), want...)
	wantIDs(t, "tenant filter", h.list(torpor.SandboxFilter{Tenant: "acme"}), want...)
}

// IncludeTerminated, or naming terminated in States, shows them; States
// without terminated keeps them out even with IncludeTerminated.
func testListShowsTerminated(t *testing.T, h *harness) {
	createOnePerState(h)
	var all []string
	for _, st := range torpor.AllStates {
		all = append(all, "sb_"+string(st))
	}
	wantIDs(t, "IncludeTerminated", h.list(torpor.SandboxFilter{IncludeTerminated: true}), all...)
	wantIDs(t, "States: terminated",
		h.list(torpor.SandboxFilter{States: []torpor.State{torpor.StateTerminated}}), "sb_terminated")
	wantIDs(t, "States: running, terminated",
		h.list(torpor.SandboxFilter{States: []torpor.State{torpor.StateTerminated, torpor.StateRunning}}),
		"sb_running", "sb_terminated")
	wantIDs(t, "States: running with IncludeTerminated",
		h.list(torpor.SandboxFilter{States: []torpor.State{torpor.StateRunning}, IncludeTerminated: true}),
		"sb_running")
}

// A metadata filter keeps the sandboxes that have every given key with
// exactly the given value. Keys and values are compared as plain strings:
// dots, quotes, SQL and LIKE characters mean nothing special.
func testListMetadata(t *testing.T, h *harness) {
	const weirdKey, weirdValue = `we"ird key='%_*\`, `va'lue"; DROP TABLE sandboxes; --`
	for i, md := range []map[string]string{
		{"team": "ml", "app.kubernetes.io/name": "web", "env": "prod"},
		{"team": "ml", "app.kubernetes.io/name": "worker"},
		{"team": "infra", "env": "prod"},
		nil,
		{weirdKey: weirdValue, "empty": ""},
		{"team": "ML", "app": "web"},
	} {
		sb := newSandbox("sb_"+string(rune('1'+i)), "acme", torpor.StateRunning, at(time.Duration(i)*time.Second))
		sb.Metadata = md
		h.create(sb)
	}

	for _, c := range []struct {
		name string
		md   map[string]string
		want []string
	}{
		{"one pair", map[string]string{"team": "ml"}, []string{"sb_1", "sb_2"}},
		{"every pair must match", map[string]string{"team": "ml", "env": "prod"}, []string{"sb_1"}},
		{"dotted key", map[string]string{"app.kubernetes.io/name": "web"}, []string{"sb_1"}},
		{"one pair differs", map[string]string{"team": "ml", "env": "staging"}, nil},
		{"one key missing", map[string]string{"team": "ml", "zone": "eu"}, nil},
		{"values are case-sensitive", map[string]string{"team": "ML"}, []string{"sb_6"}},
		{"no wildcards", map[string]string{"team": "m%"}, nil},
		{"a value is not a key", map[string]string{"web": "app"}, nil},
		{"quotes and SQL in keys and values", map[string]string{weirdKey: weirdValue}, []string{"sb_5"}},
		{"empty value matches only an empty value", map[string]string{"empty": ""}, []string{"sb_5"}},
		{"empty filter", map[string]string{}, []string{"sb_1", "sb_2", "sb_3", "sb_4", "sb_5", "sb_6"}},
	} {
		wantIDs(t, c.name, h.list(torpor.SandboxFilter{Metadata: c.md}), c.want...)
	}
}

// The filter sees the metadata of the latest update, not of the create.
func testListMetadataUpdates(t *testing.T, h *harness) {
	sb := newSandbox("sb_md", "acme", torpor.StateRunning, at(0))
	sb.Metadata = map[string]string{"team": "ml", "env": "prod"}
	h.create(sb)

	sb.Metadata = map[string]string{"team": "infra"}
	h.update(sb)
	wantIDs(t, "old value", h.list(torpor.SandboxFilter{Metadata: map[string]string{"team": "ml"}}))
	wantIDs(t, "removed key", h.list(torpor.SandboxFilter{Metadata: map[string]string{"env": "prod"}}))
	wantIDs(t, "new value", h.list(torpor.SandboxFilter{Metadata: map[string]string{"team": "infra"}}), "sb_md")

	sb.Metadata = nil
	h.update(sb)
	wantIDs(t, "after clearing", h.list(torpor.SandboxFilter{Metadata: map[string]string{"team": "infra"}}))
}

func testListCombined(t *testing.T, h *harness) {
	mk := func(id, tenant string, st torpor.State, i int, team string) {
		sb := newSandbox(id, tenant, st, at(time.Duration(i)*time.Second))
		sb.Metadata = map[string]string{"team": team}
		h.create(sb)
	}
	mk("sb_1", "acme", torpor.StateRunning, 0, "ml")
	mk("sb_2", "acme", torpor.StatePaused, 1, "ml")
	mk("sb_3", "globex", torpor.StateRunning, 2, "ml")
	mk("sb_4", "acme", torpor.StateRunning, 3, "infra")
	mk("sb_5", "acme", torpor.StateTerminated, 4, "ml")
	mk("sb_6", "acme", torpor.StateRunning, 5, "ml")

	f := torpor.SandboxFilter{
		Tenant:   "acme",
		States:   []torpor.State{torpor.StateRunning, torpor.StateTerminated},
		Metadata: map[string]string{"team": "ml"},
	}
	wantIDs(t, "tenant, states and metadata", h.list(f), "sb_1", "sb_5", "sb_6")
	f.States = nil
	wantIDs(t, "tenant and metadata", h.list(f), "sb_1", "sb_2", "sb_6")
}

func testListEmpty(t *testing.T, h *harness) {
	wantIDs(t, "empty store", h.list(torpor.SandboxFilter{}))
	h.create(newSandbox("sb_1", "acme", torpor.StateRunning, at(0)))
	wantIDs(t, "no match", h.list(torpor.SandboxFilter{Tenant: "nobody"}))
}
