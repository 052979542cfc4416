package storetest

import (
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func webhookTests() []test {
	return []test{
		{"CreateThenList", testWebhookRoundTrip},
		{"TenantMustExist", testWebhookTenantMissing},
		{"DuplicateIDIsConflict", testWebhookDuplicate},
		{"DeleteIsTenantScoped", testWebhookDelete},
		{"CursorOnlyMovesForwardAndSurvivesReopen", testWebhookCursor},
	}
}

func (h *harness) createWebhook(id, tenant string, created time.Time) torpor.Webhook {
	h.t.Helper()
	w := torpor.Webhook{ID: id, Tenant: tenant, URL: "https://hooks.example.com/" + id, Secret: "s3cret-" + id, CreatedAt: created}
	if err := h.s.CreateWebhook(h.t.Context(), w); err != nil {
		h.t.Fatalf("CreateWebhook(%q): %v", id, err)
	}
	return w
}

func testWebhookRoundTrip(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	h.createTenant("other", at(0))
	a := h.createWebhook("wh_a", "acme", at(time.Second))
	b := h.createWebhook("wh_b", "acme", at(2*time.Second))
	a.Cursor, b.Cursor = 0, 0 // no events yet
	h.createWebhook("wh_c", "other", at(3*time.Second))
	got, err := h.s.ListWebhooks(t.Context(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("acme's webhooks = %+v, want %+v and %+v (secret kept, oldest first)", got, a, b)
	}
	all, err := h.s.ListWebhooks(t.Context(), "")
	if err != nil || len(all) != 3 {
		t.Fatalf("every webhook: %d, %v", len(all), err)
	}
}

func testWebhookTenantMissing(t *testing.T, h *harness) {
	err := h.s.CreateWebhook(t.Context(), torpor.Webhook{ID: "wh_x", Tenant: "nobody", URL: "https://x", Secret: "s", CreatedAt: at(0)})
	if !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("webhook of a missing tenant: %v, want not_found", err)
	}
}

func testWebhookDuplicate(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	h.createWebhook("wh_a", "acme", at(0))
	err := h.s.CreateWebhook(t.Context(), torpor.Webhook{ID: "wh_a", Tenant: "acme", URL: "https://y", Secret: "s", CreatedAt: at(0)})
	if !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("duplicate webhook id: %v, want conflict", err)
	}
}

func testWebhookDelete(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	h.createTenant("other", at(0))
	h.createWebhook("wh_a", "acme", at(0))
	if err := h.s.DeleteWebhook(t.Context(), "other", "wh_a"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("another tenant's delete: %v, want not_found", err)
	}
	if err := h.s.DeleteWebhook(t.Context(), "acme", "wh_a"); err != nil {
		t.Fatal(err)
	}
	if got, _ := h.s.ListWebhooks(t.Context(), "acme"); len(got) != 0 {
		t.Fatalf("after delete: %+v", got)
	}
	if err := h.s.DeleteWebhook(t.Context(), "acme", "wh_a"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("second delete: %v, want not_found", err)
	}
}

func testWebhookCursor(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	sb := newSandbox("sb1", "acme", torpor.StateRunning, at(0))
	if err := h.s.CreateSandbox(t.Context(), sb, torpor.Event{Type: torpor.EventCreated, SandboxID: "sb1", Tenant: "acme", Time: at(0)}); err != nil {
		t.Fatal(err)
	}
	h.createWebhook("wh_a", "acme", at(0))
	if got, _ := h.s.ListWebhooks(t.Context(), "acme"); got[0].Cursor != 1 {
		t.Fatalf("a new webhook's cursor = %d, want the newest event (1)", got[0].Cursor)
	}
	for _, seq := range []int64{5, 9, 7} {
		if err := h.s.SetWebhookCursor(t.Context(), "wh_a", seq); err != nil {
			t.Fatal(err)
		}
	}
	h.restart()
	got, err := h.s.ListWebhooks(t.Context(), "acme")
	if err != nil || len(got) != 1 || got[0].Cursor != 9 {
		t.Fatalf("cursor after 5, 9, 7 and a reopen: %+v %v, want 9", got, err)
	}
}
