package lifecycle

import (
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// The match rule of a claim, case by case: a member is taken only when its
// boot spec is the create's and its template was not stored again since;
// members of another spec are no match and no miss; an empty pool of a
// size above 0 is a miss; a pool of size 0 is nothing.
func TestPoolTakeRules(t *testing.T) {
	stored := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	spec := bootSpec{kind: "runc", resources: torpor.Resources{VCPUs: 1, MemoryMiB: 512}, setup: []string{"a"}}
	other := func(f func(*bootSpec)) bootSpec {
		s := spec
		s.setup = append([]string(nil), spec.setup...)
		f(&s)
		return s
	}
	cases := []struct {
		name           string
		size           int
		ready          []member
		want           bootSpec
		found, matched bool
	}{
		{"same spec", 1, []member{{id: "m", spec: spec, stamp: stored}}, spec, true, true},
		{"other resources", 1, []member{{id: "m", spec: spec, stamp: stored}}, other(func(s *bootSpec) { s.resources.VCPUs = 2 }), false, false},
		{"own setup", 1, []member{{id: "m", spec: spec, stamp: stored}}, other(func(s *bootSpec) { s.setup = append(s.setup, "b") }), false, false},
		{"own entrypoint", 1, []member{{id: "m", spec: spec, stamp: stored}}, other(func(s *bootSpec) { s.entrypoint = []string{"/srv"} }), false, false},
		{"internet", 1, []member{{id: "m", spec: spec, stamp: stored}}, other(func(s *bootSpec) { s.internet = true }), false, false},
		{"other runtime", 1, []member{{id: "m", spec: spec, stamp: stored}}, other(func(s *bootSpec) { s.kind = "vm" }), false, false},
		{"template stored again", 1, []member{{id: "m", spec: spec, stamp: stored.Add(-time.Second)}}, spec, false, false},
		{"empty pool: a miss", 2, nil, spec, false, true},
		{"size 0: nothing", 0, []member{{id: "m", spec: spec, stamp: stored}}, spec, false, false},
	}
	for _, c := range cases {
		p := newPools()
		p.byName["base"] = &pool{size: c.size, ready: c.ready}
		m, found, matched := p.take("base", c.want, stored)
		if found != c.found || matched != c.matched {
			t.Errorf("%s: found %v matched %v, want %v %v", c.name, found, matched, c.found, c.matched)
		}
		if found && m.id != "m" {
			t.Errorf("%s: took %q", c.name, m.id)
		}
		misses := int64(0)
		if !c.found && c.matched {
			misses = 1
		}
		if got := p.byName["base"].misses; got != misses {
			t.Errorf("%s: %d misses, want %d", c.name, got, misses)
		}
	}
	if _, _, matched := newPools().take("nopool", spec, stored); matched {
		t.Error("a template without a pool matched")
	}
}

// The oldest member is claimed first, and a member put back keeps its
// place.
func TestPoolTakeOldestFirst(t *testing.T) {
	spec := bootSpec{kind: "runc"}
	t0 := time.Unix(0, 0)
	p := newPools()
	p.byName["base"] = &pool{size: 3}
	for i, id := range []string{"b", "a", "c"} {
		p.put("base", member{id: id, spec: spec, booted: t0.Add(time.Duration([]int{2, 1, 3}[i]) * time.Second)})
	}
	m, _, _ := p.take("base", spec, time.Time{})
	if m.id != "a" {
		t.Fatalf("took %q first, want the oldest a", m.id)
	}
	p.put("base", m)
	for _, want := range []string{"a", "b", "c"} {
		if m, _, _ := p.take("base", spec, time.Time{}); m.id != want {
			t.Fatalf("took %q, want %q", m.id, want)
		}
	}
}
