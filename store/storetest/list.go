package storetest

import (
	"fmt"
	"slices"
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
		{"LimitAndAfter", testListPages},
		{"PagesWithFilters", testListPagesFiltered},
		{"PagesSeeNewSandboxesOnce", testListPagesWhileCreating},
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

// pages walks the list f selects, size sandboxes a page, as a client
// following the position of each page's last sandbox does, and returns the
// ids page by page.
func (h *harness) pages(f torpor.SandboxFilter, size int) [][]string {
	h.t.Helper()
	var out [][]string
	f.Limit = size
	for range 1000 {
		page := h.list(f)
		if len(page) > size {
			h.t.Fatalf("a page with Limit %d has %d sandboxes", size, len(page))
		}
		if len(page) == 0 {
			return out
		}
		var ids []string
		for _, sb := range page {
			ids = append(ids, sb.ID)
		}
		out = append(out, ids)
		last := page[len(page)-1]
		f.After = torpor.ListPosition{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	h.t.Fatal("the pages never ended")
	return nil
}

// Limit caps a page, After starts past a position in the list order (the
// creation time, then the id, so that sandboxes created in the same
// microsecond are neither skipped nor repeated), and following the last
// sandbox of each page yields every sandbox once, in order.
func testListPages(t *testing.T, h *harness) {
	for _, sb := range []*torpor.Sandbox{
		newSandbox("sb_c", "acme", torpor.StateRunning, at(2*time.Second)),
		newSandbox("sb_b", "acme", torpor.StateRunning, at(time.Second)),
		newSandbox("sb_e", "acme", torpor.StateRunning, at(time.Microsecond)),
		newSandbox("sb_a", "acme", torpor.StateRunning, at(time.Second)),
		newSandbox("sb_f", "acme", torpor.StateRunning, at(time.Second)),
		newSandbox("sb_d", "acme", torpor.StateRunning, at(0)),
	} {
		h.create(sb)
	}
	wantIDs(t, "limit 2", h.list(torpor.SandboxFilter{Limit: 2}), "sb_d", "sb_e")
	wantIDs(t, "limit 100", h.list(torpor.SandboxFilter{Limit: 100}), "sb_d", "sb_e", "sb_a", "sb_b", "sb_f", "sb_c")
	wantIDs(t, "after sb_a, no limit", h.list(torpor.SandboxFilter{After: torpor.ListPosition{CreatedAt: at(time.Second), ID: "sb_a"}}),
		"sb_b", "sb_f", "sb_c")
	wantIDs(t, "after sb_b, limit 1", h.list(torpor.SandboxFilter{After: torpor.ListPosition{CreatedAt: at(time.Second), ID: "sb_b"}, Limit: 1}),
		"sb_f")
	// A position need not be a stored sandbox's: a deleted one's still
	// says where the next page starts.
	wantIDs(t, "after a gone sb_aa", h.list(torpor.SandboxFilter{After: torpor.ListPosition{CreatedAt: at(time.Second), ID: "sb_aa"}}),
		"sb_b", "sb_f", "sb_c")
	wantIDs(t, "after the last", h.list(torpor.SandboxFilter{After: torpor.ListPosition{CreatedAt: at(2 * time.Second), ID: "sb_c"}}))
	for size := 1; size <= 7; size++ {
		var got []string
		for _, p := range h.pages(torpor.SandboxFilter{}, size) {
			got = append(got, p...)
		}
		if want := []string{"sb_d", "sb_e", "sb_a", "sb_b", "sb_f", "sb_c"}; !slices.Equal(got, want) {
			t.Errorf("pages of %d: %v, want %v", size, got, want)
		}
	}
}

// The position and the limit apply after the filters: a page is full
// while matching sandboxes remain, however many others lie between them.
func testListPagesFiltered(t *testing.T, h *harness) {
	for i := range 9 {
		sb := newSandbox(fmt.Sprintf("sb_%d", i), "acme", torpor.StateRunning, at(time.Duration(i)*time.Second))
		if i%3 != 0 {
			sb.Tenant = "globex"
		}
		if i%2 == 0 {
			sb.Metadata = map[string]string{"team": "ml"}
		}
		h.create(sb)
	}
	pages := h.pages(torpor.SandboxFilter{Tenant: "globex"}, 2)
	if want := [][]string{{"sb_1", "sb_2"}, {"sb_4", "sb_5"}, {"sb_7", "sb_8"}}; !slices.EqualFunc(pages, want, slices.Equal) {
		t.Errorf("globex by 2: %v, want %v", pages, want)
	}
	pages = h.pages(torpor.SandboxFilter{Metadata: map[string]string{"team": "ml"}, ExceptTenant: "acme"}, 1)
	if want := [][]string{{"sb_2"}, {"sb_4"}, {"sb_8"}}; !slices.EqualFunc(pages, want, slices.Equal) {
		t.Errorf("team=ml but acme's, by 1: %v, want %v", pages, want)
	}
}

// Sandboxes created while a reader pages through the list come after
// every position already read: the reader sees each of them once, and
// sees again none it has seen.
func testListPagesWhileCreating(t *testing.T, h *harness) {
	for i := range 5 {
		h.create(newSandbox(fmt.Sprintf("sb_old%d", i), "acme", torpor.StateRunning, at(time.Duration(i)*time.Second)))
	}
	seen := map[string]int{}
	f := torpor.SandboxFilter{Limit: 2}
	for n := 0; ; n++ {
		page := h.list(f)
		if len(page) == 0 {
			break
		}
		for _, sb := range page {
			seen[sb.ID]++
		}
		if n < 4 {
			h.create(newSandbox(fmt.Sprintf("sb_new%d", n), "acme", torpor.StateRunning, at(time.Hour+time.Duration(n)*time.Second)))
		}
		last := page[len(page)-1]
		f.After = torpor.ListPosition{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	for i := range 5 {
		if id := fmt.Sprintf("sb_old%d", i); seen[id] != 1 {
			t.Errorf("%s seen %d times, want once", id, seen[id])
		}
	}
	for i := range 4 {
		if id := fmt.Sprintf("sb_new%d", i); seen[id] != 1 {
			t.Errorf("%s (created while paging) seen %d times, want once", id, seen[id])
		}
	}
}
