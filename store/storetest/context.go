package storetest

import (
	"context"
	"errors"
	"testing"

	"github.com/torpor-dev/torpor"
)

func contextTests() []test {
	return []test{
		{"CanceledContextWritesNothing", testCanceledWrites},
		{"CanceledContextFailsReads", testCanceledReads},
	}
}

// canceled returns a context that is already canceled.
func canceled(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	return ctx
}

// wantCanceled fails the test unless err is, or wraps, context.Canceled.
func wantCanceled(t *testing.T, err error, what string) {
	t.Helper()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("%s with a canceled context: got %v, want an error wrapping context.Canceled", what, err)
	}
}

// A write under a canceled context fails with the context's error and
// leaves nothing behind.
func testCanceledWrites(t *testing.T, h *harness) {
	ctx := canceled(t)
	sb := newSandbox("sb_ctx", "acme", torpor.StateRunning, at(0))
	wantCanceled(t, h.s.CreateSandbox(ctx, sb, event(sb, torpor.EventCreated, at(0), nil)), "CreateSandbox")
	_, err := h.s.GetSandbox(t.Context(), sb.ID)
	wantCode(t, err, torpor.ENotFound, "GetSandbox after a canceled create")

	h.create(sb)
	sb.State = torpor.StatePaused
	wantCanceled(t, h.s.UpdateSandbox(ctx, sb, event(sb, torpor.EventPaused, at(0), nil)), "UpdateSandbox")
	if sb.Version != 1 {
		t.Errorf("canceled update changed sb.Version to %d, want 1", sb.Version)
	}
	if got := h.get(sb.ID); got.State != torpor.StateRunning || got.Version != 1 {
		t.Errorf("after a canceled update the record is %s at version %d, want running at 1", got.State, got.Version)
	}
	if evs := h.events(torpor.EventFilter{}); len(evs) != 0 {
		t.Errorf("canceled writes appended events %q", types(evs))
	}

	wantCanceled(t, h.s.CreateTenant(ctx, torpor.Tenant{Name: "acme"}), "CreateTenant")
	_, err = h.s.GetTenant(t.Context(), "acme")
	wantCode(t, err, torpor.ENotFound, "GetTenant after a canceled create")
	wantCanceled(t, h.s.PutTemplate(ctx, torpor.Template{Name: "base"}), "PutTemplate")
	_, err = h.s.GetTemplate(t.Context(), "base")
	wantCode(t, err, torpor.ENotFound, "GetTemplate after a canceled put")
}

func testCanceledReads(t *testing.T, h *harness) {
	h.create(newSandbox("sb_ctx", "acme", torpor.StateRunning, at(0)))
	ctx := canceled(t)
	_, err := h.s.GetSandbox(ctx, "sb_ctx")
	wantCanceled(t, err, "GetSandbox")
	_, err = h.s.ListSandboxes(ctx, torpor.SandboxFilter{})
	wantCanceled(t, err, "ListSandboxes")
	_, err = h.s.ListEvents(ctx, torpor.EventFilter{})
	wantCanceled(t, err, "ListEvents")
	_, err = h.s.ListTenants(ctx)
	wantCanceled(t, err, "ListTenants")
}
