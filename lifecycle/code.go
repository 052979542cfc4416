package lifecycle

import (
	"context"

	"github.com/torpor-dev/torpor"
)

// RunCode runs a snippet in the sandbox's persistent interpreter for its
// language (see torpor.CodeRunner), or in one of its code contexts. Like
// Exec it wakes a paused or hibernated sandbox when its policy has
// auto_resume and counts as activity when it starts and when it ends. An
// error raised by the snippet is part of the result, not an error. A
// sandbox that stops running under the snippet is a conflict, as for Exec.
func (e *Engine) RunCode(ctx context.Context, tenant, id string, req torpor.CodeRequest) (torpor.CodeResult, error) {
	if err := torpor.ValidateCode(req); err != nil {
		return torpor.CodeResult{}, err
	}
	var cr torpor.CodeRunner
	var stopped <-chan struct{}
	sb, err := e.operate(ctx, tenant, id, "run code in", true, func(sb *torpor.Sandbox) error {
		stopped = e.runSignal(sb.ID)
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
	started := e.now()
	if req.Op == torpor.CodeRun {
		if req.Env, err = e.execEnv(ctx, sb, req.Env); err != nil {
			e.done(tenant, id, started)
			return torpor.CodeResult{}, err
		}
	}
	return untilStopped(e, ctx, sb, stopped, "the snippet", func(ctx context.Context) (torpor.CodeResult, error) {
		return cr.RunCode(ctx, ref(sb), req)
	}, nil, func() { e.done(tenant, id, started) })
}

// CodeContexts lists the sandbox's code contexts: each language's default
// one once used, and those CreateCodeContext made.
func (e *Engine) CodeContexts(ctx context.Context, tenant, id string) ([]torpor.CodeContext, error) {
	res, err := e.RunCode(ctx, tenant, id, torpor.CodeRequest{Op: torpor.CodeList})
	if err != nil {
		return nil, err
	}
	if res.Contexts == nil {
		return []torpor.CodeContext{}, nil
	}
	return res.Contexts, nil
}

// CreateCodeContext makes a code context, an interpreter of its own for
// language that starts in cwd ("": the code server's own directory), and
// returns it. Its interpreter lives as long as the sandbox's instance.
func (e *Engine) CreateCodeContext(ctx context.Context, tenant, id, language, cwd string) (torpor.CodeContext, error) {
	cid := torpor.NewID("ctx_", 20)
	res, err := e.RunCode(ctx, tenant, id, torpor.CodeRequest{Op: torpor.CodeCreate, Context: cid, Language: language, Cwd: cwd})
	if err != nil {
		return torpor.CodeContext{}, err
	}
	for _, c := range res.Contexts {
		if c.ID == cid {
			return c, nil
		}
	}
	return torpor.CodeContext{ID: cid, Language: language, Cwd: cwd, Running: true}, nil
}

// RestartCodeContext drops a code context's interpreter and its state; a
// snippet it is running ends. The next snippet starts a fresh one.
func (e *Engine) RestartCodeContext(ctx context.Context, tenant, id, contextID string) error {
	_, err := e.RunCode(ctx, tenant, id, torpor.CodeRequest{Op: torpor.CodeRestart, Context: contextID})
	return err
}

// DeleteCodeContext ends a code context and its interpreter.
func (e *Engine) DeleteCodeContext(ctx context.Context, tenant, id, contextID string) error {
	_, err := e.RunCode(ctx, tenant, id, torpor.CodeRequest{Op: torpor.CodeDelete, Context: contextID})
	return err
}

// CodeOutput returns what the snippet running in one of tenant's
// sandboxes' code contexts wrote so far, from the offsets given, for
// streaming it. It wakes nothing and is no activity (the run it follows
// is); a sandbox that is not running, or a runtime that cannot tell, has
// nothing to read.
func (e *Engine) CodeOutput(ctx context.Context, tenant, id, contextID string, stdoutOffset, stderrOffset int64) (torpor.CodeOutput, error) {
	sb, err := e.load(ctx, tenant, id)
	if err != nil || sb.State != torpor.StateRunning {
		return torpor.CodeOutput{}, err
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return torpor.CodeOutput{}, err
	}
	r, ok := rt.(torpor.CodeOutputReader)
	if !ok {
		return torpor.CodeOutput{}, nil
	}
	return r.CodeOutput(ctx, ref(sb), contextID, stdoutOffset, stderrOffset)
}
