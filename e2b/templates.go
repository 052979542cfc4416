package e2b

import (
	"net/http"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/e2b/envd"
)

// templates answers GET /templates: torpor's templates in E2B's shape,
// each named by its torpor name and, where one maps to it, its E2B name.
func (a *API) templates(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	ts, err := a.tmplStore.ListTemplates(r.Context())
	if err != nil {
		return err
	}
	// spawnCount counts only the caller's own sandboxes, as the native
	// API's in_use does.
	if err := a.eng.CountTemplateUse(r.Context(), tenant, ts); err != nil {
		return err
	}
	out := make([]template, 0, len(ts))
	for _, t := range ts {
		res := a.defRes
		if d := t.Defaults.Resources; d != nil {
			if d.VCPUs > 0 {
				res.VCPUs = d.VCPUs
			}
			if d.MemoryMiB > 0 {
				res.MemoryMiB = d.MemoryMiB
			}
			if d.DiskMiB > 0 {
				res.DiskMiB = d.DiskMiB
			}
		}
		names := []string{t.Name}
		if alias := a.alias(t.Name); alias != t.Name {
			names = append(names, alias)
		}
		build := t.Digest
		if build == "" {
			build = t.Name
		}
		out = append(out, template{
			TemplateID: t.Name, BuildID: build, CPUCount: cpuCount(res), MemoryMB: res.MemoryMiB, DiskSizeMB: res.DiskMiB,
			Aliases: names, Names: names, CreatedAt: t.CreatedAt, UpdatedAt: t.CreatedAt, SpawnCount: t.InUse,
			BuildCount: 1, BuildStatus: "ready", EnvdVersion: envd.Version,
		})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
