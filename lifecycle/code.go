package lifecycle

import (
	"context"

	"github.com/torpor-dev/torpor"
)

// RunCode runs a snippet in the sandbox's persistent interpreter for its
// language (see torpor.CodeRunner). Like Exec it wakes a paused or
// hibernated sandbox when its policy has auto_resume and counts as
// activity when it starts and when it ends. An error raised by the
// snippet is part of the result, not an error.
func (e *Engine) RunCode(ctx context.Context, tenant, id string, req torpor.CodeRequest) (torpor.CodeResult, error) {
	if err := torpor.ValidateCode(req); err != nil {
		return torpor.CodeResult{}, err
	}
	var cr torpor.CodeRunner
	sb, err := e.operate(ctx, tenant, id, "run code in", true, func(sb *torpor.Sandbox) error {
		rt, err := e.runtime(sb.Runtime.Kind)
		if err != nil {
			return err
		}
		var ok bool
		if cr, ok = rt.(torpor.CodeRunner); !ok {
			return torpor.Errorf(torpor.EInvalid, "the %s runtime cannot run code", rt.Kind())
		}
		return nil
	})
	if err != nil {
		return torpor.CodeResult{}, err
	}
	defer e.done(tenant, id, e.now())
	return cr.RunCode(ctx, ref(sb), req)
}
