package gpu

import "time"

// accrue counts d seconds of seg into m and returns the row for them.
func accrue(m *Meters, seg Segment, end time.Time, spec Spec) (UsageRow, bool) {
	if seg.Kind == segNone || !end.After(seg.Start) {
		return UsageRow{}, false
	}
	d := end.Sub(seg.Start).Seconds()
	r := UsageRow{LeaseID: spec.ID, Tenant: spec.Tenant, Start: seg.Start, End: end, Seconds: d,
		GPUs: spec.Accel.GPUs, SliceMiB: spec.Accel.VRAMMiB, Billed: true}
	switch seg.Kind {
	case segBusy:
		m.BusyS += d
		m.RunningS += d
		r.Kind, r.Cause = RowBusy, CauseJob
	case segIdle:
		m.IdleS += d
		m.RunningS += d
		r.Kind, r.Cause = RowIdle, CauseIdle
	case segResume:
		m.ResumeS += d
		m.RunningS += d
		r.Kind, r.Cause = RowResume, CauseResume
	case segFrozen:
		m.FrozenS += d
		r.Kind, r.Cause = RowBusy, CauseFrozenNone
		if seg.FreezeOnly {
			m.FrozenBilledS += d
			r.Cause = CauseFreezeOnly
		}
	case segSuspended:
		m.SuspendedS += d
		r.Kind, r.Cause, r.Billed = RowSuspended, CauseSpilled, false
	}
	if r.Billed {
		m.ResidentS += d
		m.BilledS += d
	}
	return r, true
}
