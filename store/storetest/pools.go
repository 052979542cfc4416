package storetest

import (
	"reflect"
	"testing"

	"github.com/torpor-dev/torpor"
)

func poolTests() []test {
	return []test{
		{"NoneStoredIsEmpty", testPoolsEmpty},
		{"SetReplacesAndKeepsZero", testPoolSetReplaces},
		{"PoolsSurviveRestart", testPoolsRestart},
		{"BadConfigIsInvalid", testPoolBadConfig},
	}
}

func (h *harness) setPool(c torpor.PoolConfig) {
	h.t.Helper()
	if err := h.s.SetPool(h.t.Context(), c); err != nil {
		h.t.Fatalf("SetPool(%+v): %v", c, err)
	}
}

func (h *harness) pools() []torpor.PoolConfig {
	h.t.Helper()
	got, err := h.s.PoolConfigs(h.t.Context())
	if err != nil {
		h.t.Fatalf("PoolConfigs: %v", err)
	}
	return got
}

func testPoolsEmpty(t *testing.T, h *harness) {
	if got := h.pools(); len(got) != 0 {
		t.Errorf("PoolConfigs of a new store = %v, want none", got)
	}
}

// A pool set again replaces the one before; a size of 0 is kept like any
// other, so that a pool turned off stays off. They come sorted by name.
func testPoolSetReplaces(t *testing.T, h *harness) {
	h.setPool(torpor.PoolConfig{Template: "python", Size: 2, AllowInternet: true})
	h.setPool(torpor.PoolConfig{Template: "base", Size: 4})
	h.setPool(torpor.PoolConfig{Template: "base", Size: 0, AllowInternet: true})
	samePools(t, "pools", h.pools(), []torpor.PoolConfig{
		{Template: "base", Size: 0, AllowInternet: true},
		{Template: "python", Size: 2, AllowInternet: true},
	})
}

func testPoolsRestart(t *testing.T, h *harness) {
	h.setPool(torpor.PoolConfig{Template: "base", Size: 3})
	h.restart()
	samePools(t, "pools after a restart", h.pools(), []torpor.PoolConfig{{Template: "base", Size: 3}})
}

func testPoolBadConfig(t *testing.T, h *harness) {
	for _, c := range []torpor.PoolConfig{
		{Template: "base", Size: -1},
		{Template: "base", Size: torpor.MaxPoolSize + 1},
		{Size: 1},
	} {
		wantCode(t, h.s.SetPool(t.Context(), c), torpor.EInvalid, "SetPool of a bad config")
	}
	if got := h.pools(); len(got) != 0 {
		t.Errorf("refused pools were stored: %v", got)
	}
}

func samePools(t *testing.T, what string, got, want []torpor.PoolConfig) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %+v, want %+v", what, got, want)
	}
}
