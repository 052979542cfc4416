package storetest

import (
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func durabilityTests() []test {
	return []test{
		{"EverythingSurvivesRestart", testSurvivesRestart},
		{"EventSeqKeepsGrowingAfterRestart", testSeqAfterRestart},
	}
}

// What was committed before Close is all there after a reopen, and the
// reopened store carries on from it (versions, conflicts).
func testSurvivesRestart(t *testing.T, h *harness) {
	full := fullSandbox("sb_full", "acme")
	h.create(full, event(full, torpor.EventCreated, at(0), map[string]string{"k": "v"}))
	full.Boots++
	h.update(full, event(full, torpor.EventStarted, at(time.Second), nil))
	plain := newSandbox("sb_plain", "globex", torpor.StatePaused, at(time.Minute))
	plain.Metadata = map[string]string{}
	h.create(plain)
	tenant := h.createTenant("acme", at(0))
	key := torpor.APIKey{ID: "key_1", Tenant: "acme", Admin: true, Tier: torpor.TierStandard, Hash: "sha256:aaaa", CreatedAt: at(time.Second)}
	h.createKey(key)
	tpl := torpor.Template{Name: "base", RootFS: "/rootfs/base", CreatedAt: at(0)}
	h.putTemplate(tpl)

	wantFull, wantPlain := h.get(full.ID), h.get(plain.ID)
	wantEvents := h.events(torpor.EventFilter{})

	s := h.restart()
	ctx := t.Context()
	checkSandbox(t, "sandbox after restart", h.get(full.ID), wantFull)
	checkSandbox(t, "sandbox after restart", h.get(plain.ID), wantPlain)
	wantIDs(t, "sandboxes after restart", h.list(torpor.SandboxFilter{IncludeTerminated: true}), "sb_full", "sb_plain")
	wantIDs(t, "metadata filter after restart",
		h.list(torpor.SandboxFilter{IncludeTerminated: true, Metadata: map[string]string{"owner": "ada"}}), "sb_full")
	gotEvents := h.events(torpor.EventFilter{})
	if len(gotEvents) != len(wantEvents) {
		t.Fatalf("%d events after restart, want %d", len(gotEvents), len(wantEvents))
	}
	for i := range wantEvents {
		checkSame(t, "event after restart", gotEvents[i], wantEvents[i])
	}
	gotTenant, err := s.GetTenant(ctx, "acme")
	if err != nil {
		t.Fatalf("GetTenant after restart: %v", err)
	}
	checkSame(t, "tenant after restart", gotTenant, &tenant)
	gotKey, err := s.APIKeyByHash(ctx, key.Hash)
	if err != nil {
		t.Fatalf("APIKeyByHash after restart: %v", err)
	}
	checkSame(t, "API key after restart", gotKey, &key)
	tpl.InUse = 1 // sb_plain, made from base, is not terminated
	checkSame(t, "template after restart", h.getTemplate("base"), &tpl)

	// Versions carry on: the old struct is current, an older one is stale.
	stale := wantFull.Clone()
	stale.Version--
	wantCode(t, s.UpdateSandbox(ctx, stale), torpor.EConflict, "stale update after restart")
	h.update(full)
	if full.Version != 3 {
		t.Errorf("Version after an update across a restart = %d, want 3", full.Version)
	}
	wantCode(t, s.CreateTenant(ctx, tenant), torpor.EConflict, "CreateTenant of an existing name after restart")
}

// A cursor taken before a restart still means "after this": new events get
// larger Seqs than any before, never a reused one.
func testSeqAfterRestart(t *testing.T, h *harness) {
	sb := newSandbox("sb_seq", "acme", torpor.StateRunning, at(0))
	h.create(sb, event(sb, torpor.EventCreated, at(0), nil), event(sb, torpor.EventStarted, at(0), nil))
	before := h.events(torpor.EventFilter{})
	cursor := before[len(before)-1].Seq

	h.restart()
	sb = h.get(sb.ID)
	sb.State = torpor.StatePaused
	h.update(sb, event(sb, torpor.EventPaused, at(time.Second), nil))

	after := h.events(torpor.EventFilter{After: cursor})
	if len(after) != 1 || after[0].Type != torpor.EventPaused {
		t.Fatalf("events after the pre-restart cursor: %q, want only %s", types(after), torpor.EventPaused)
	}
	checkIncreasing(t, h.events(torpor.EventFilter{}))
}
