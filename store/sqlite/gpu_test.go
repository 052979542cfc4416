package sqlite_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu/gpulease"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// A lease's record and its rows are saved together and survive a restart;
// a second row from the same start is refused with its record.
func TestGPULeasesRowsAndFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torpor.db")
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	rec := gpulease.Record{Spec: gpulease.Spec{ID: "sb1", Tenant: "acme", Group: "g", WorkerPID: 7,
		Accel: gpulease.Accel{GPUs: 1, VRAMMiB: 1024, SuspendMode: gpulease.SuspendNone}}, Phase: gpulease.PhaseResident, LastSeen: t0}
	row := gpulease.UsageRow{LeaseID: "sb1", Tenant: "acme", Kind: gpulease.RowBusy, Cause: gpulease.CauseJob, Billed: true,
		Start: t0, End: t0.Add(time.Minute), Seconds: 60, GPUs: 1, SliceMiB: 1024}
	if err := s.SaveLease(t.Context(), rec, []gpulease.UsageRow{row}); err != nil {
		t.Fatal(err)
	}
	rec.Phase = gpulease.PhaseDead
	if err := s.SaveLease(t.Context(), rec, []gpulease.UsageRow{row}); !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("a second row from the same start: %v", err)
	}
	if err := s.FlagKey(t.Context(), gpulease.Flag{Tenant: "acme", KeyID: "key_1", LeaseID: "sb1", UsedMiB: 2048, LimitMiB: 1024, At: t0}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	recs, err := s.ListLeases(t.Context())
	if err != nil || len(recs) != 1 || recs[0].Phase != gpulease.PhaseResident || recs[0].Spec.WorkerPID != 7 {
		t.Fatalf("leases after restart: %+v %v (the refused save must not have changed the record)", recs, err)
	}
	rows, err := s.ListGPUUsage(t.Context(), "sb1")
	if err != nil || len(rows) != 1 || rows[0].Seconds != 60 || !rows[0].Billed {
		t.Fatalf("rows: %+v %v", rows, err)
	}
	flags, err := s.KeyFlags(t.Context(), "key_1")
	if err != nil || len(flags) != 1 || flags[0].UsedMiB != 2048 {
		t.Fatalf("flags: %+v %v", flags, err)
	}
	if err := s.DeleteLease(t.Context(), "sb1"); err != nil {
		t.Fatal(err)
	}
	if recs, _ := s.ListLeases(t.Context()); len(recs) != 0 {
		t.Errorf("a deleted lease is still listed")
	}
}
