package lifecycle

import (
	"context"

	"github.com/torpor-dev/torpor"
)

// CountTemplateUse sets the InUse of each template to the number of
// sandboxes of tenant that use it and are not terminated. Another
// tenant's sandboxes are none of a tenant's business, their number
// included; the empty tenant (an admin) keeps the store's count of all.
func (e *Engine) CountTemplateUse(ctx context.Context, tenant string, ts []torpor.Template) error {
	if tenant == "" || len(ts) == 0 {
		return nil
	}
	sbs, err := e.List(ctx, tenant, torpor.SandboxFilter{})
	if err != nil {
		return err
	}
	use := map[string]int{}
	for _, sb := range sbs {
		use[sb.Template]++
	}
	for i := range ts {
		ts[i].InUse = use[ts[i].Name]
	}
	return nil
}
