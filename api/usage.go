package api

import (
	"net/http"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// maxUsageRows bounds the rows one usage report lists (totals always
// cover every row of the window).
const maxUsageRows = 100000

// usage serves GET /v1/usage?tenant=&sandbox=&from=&to=&group_by=&rows=&limit=.
// A tenant key sees its own usage; an admin key any tenant's, or every
// tenant's when tenant is left out.
func (s *Server) usage(w http.ResponseWriter, r *http.Request, p principal) error {
	q := r.URL.Query()
	tenant := q.Get("tenant")
	switch {
	case tenant == "" && !p.admin:
		tenant = p.tenant
	case tenant != "" && tenant != p.tenant && !p.admin:
		return torpor.Errorf(torpor.EForbidden, "a tenant key sees only its own tenant's usage")
	}
	from, err := queryTime(r, "from")
	if err != nil {
		return err
	}
	to, err := queryTime(r, "to")
	if err != nil {
		return err
	}
	if !from.IsZero() && !to.IsZero() && !to.After(from) {
		return torpor.Invalid("to", "must be after from")
	}
	limit, err := queryInt(r, "limit", 10000)
	if err != nil {
		return err
	}
	if limit == 0 || limit > maxUsageRows {
		return torpor.Invalid("limit", "must be between 1 and %d", maxUsageRows)
	}
	sandbox := q.Get("sandbox")
	if sandbox != "" && !torpor.ValidID(sandbox) {
		return torpor.Invalid("sandbox", "not a sandbox id")
	}
	groupBy := q.Get("group_by")
	withRows := groupBy == "" || q.Get("rows") == "true"
	f := torpor.UsageFilter{SandboxID: sandbox, From: from, To: to}
	rows, err := s.eng.Usage(r.Context(), tenant, f)
	if err != nil {
		return err
	}
	groups, total, err := torpor.SummarizeUsage(rows, groupBy)
	if err != nil {
		return err
	}
	rep := wire.UsageReport{Tenant: tenant, GroupBy: groupBy, Currency: s.eng.Pricing().Currency, Groups: groups, Total: total}
	if !from.IsZero() {
		rep.From = &from
	}
	if !to.IsZero() {
		rep.To = &to
	}
	if withRows {
		if len(rows) > int(limit) {
			rows, rep.Truncated = rows[:limit], true
		}
		rep.Rows = rows
		if rep.Rows == nil {
			rep.Rows = []torpor.UsageRecord{}
		}
	}
	writeJSON(w, http.StatusOK, rep)
	return nil
}

// queryTime reads an RFC 3339 time or a date (midnight UTC) from the
// query; absent is the zero time.
func queryTime(r *http.Request, name string) (time.Time, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	return time.Time{}, torpor.Invalid(name, "must be a time (RFC 3339, e.g. 2026-11-30T12:00:00Z) or a date (2026-11-30)")
}
