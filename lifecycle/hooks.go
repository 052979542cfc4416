package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"

	"github.com/torpor-dev/torpor"
)

// Hook events.
const (
	EventHookRan    = "hook.ran"
	EventHookFailed = "hook.failed"
)

// hasHooks reports whether sb has hooks for a transition.
func hasHooks(sb *torpor.Sandbox, on string) bool {
	for _, h := range sb.Hooks {
		if h.On == on {
			return true
		}
	}
	return false
}

// runHooks runs sb's hooks for a transition (on), with sb's lock held.
// Hooks with wait run now, in order, each within its timeout; the others
// run in the background. A failure never stops the transition: it is
// recorded as a hook.failed event and as the sandbox's hook_failure.
func (e *Engine) runHooks(ctx context.Context, sb *torpor.Sandbox, on string) {
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return
	}
	r := ref(sb)
	env, err := e.execEnv(ctx, sb, nil)
	if err != nil {
		// A secret gone since the create: the hooks run without the
		// secrets; the next exec says why.
		e.log.Warn("hooks run without the sandbox's secrets", "sandbox", sb.ID, "err", err)
		env = claimEnv(sb, nil)
	}
	for i, h := range sb.Hooks {
		if h.On != on {
			continue
		}
		if h.Wait {
			err := e.runHook(context.WithoutCancel(ctx), rt, r, sb.ID, env, h)
			e.recordHook(ctx, sb, i, h, err)
			continue
		}
		e.wg.Add(1)
		go func(i int, h torpor.Hook) {
			defer e.wg.Done()
			err := e.runHook(e.bg, rt, r, sb.ID, env, h)
			unlock := e.locks.Lock(r.SandboxID)
			defer unlock()
			if cur, gerr := e.store.GetSandbox(e.bg, r.SandboxID); gerr == nil {
				e.recordHook(e.bg, cur, i, h, err)
			}
		}(i, h)
	}
}

// recordHook stores a hook run's outcome as an event, and a failure on the
// sandbox too.
func (e *Engine) recordHook(ctx context.Context, sb *torpor.Sandbox, i int, h torpor.Hook, err error) {
	e.obs.HookRan(h.On, err != nil)
	attrs := []string{"on", h.On, "index", strconv.Itoa(i), "type", h.Type}
	typ := EventHookRan
	if err != nil {
		typ = EventHookFailed
		attrs = append(attrs, "error", err.Error())
		sb.HookFailure = &torpor.HookFailure{On: h.On, Index: i, Type: h.Type, Message: err.Error(), At: e.now()}
		e.log.Warn("hook failed", "sandbox", sb.ID, "on", h.On, "index", i, "err", err)
	}
	if serr := e.save(ctx, sb, e.event(sb, typ, attrs...)); serr != nil {
		e.log.Error("recording a hook run", "sandbox", sb.ID, "err", serr)
	}
}

// runHook runs one hook within its timeout.
// A script hook runs with env (see claimEnv).
func (e *Engine) runHook(ctx context.Context, rt torpor.Runtime, r torpor.InstanceRef, id string, env map[string]string, h torpor.Hook) error {
	ctx, cancel := context.WithTimeout(ctx, h.Timeout())
	defer cancel()
	switch h.Type {
	case torpor.HookScript:
		return runScriptHook(ctx, rt, r, env, h)
	case torpor.HookHTTP:
		return runHTTPHook(ctx, rt, r, id, h)
	}
	return fmt.Errorf("unknown hook type %q", h.Type)
}

func runScriptHook(ctx context.Context, rt torpor.Runtime, r torpor.InstanceRef, env map[string]string, h torpor.Hook) error {
	var out tail
	res, err := rt.Exec(ctx, r, torpor.ExecRequest{
		Cmd:     append([]string{h.Path}, h.Arguments...),
		Env:     env,
		Stdout:  io.Discard,
		Stderr:  &out,
		Timeout: h.Timeout(),
	})
	switch {
	case err != nil && ctx.Err() != nil, err == nil && res.TimedOut:
		return fmt.Errorf("timed out after %s and was killed", h.Timeout())
	case err != nil:
		return err
	case res.ExitCode != 0:
		if msg := out.String(); msg != "" {
			return fmt.Errorf("exited with status %d: %s", res.ExitCode, msg)
		}
		return fmt.Errorf("exited with status %d", res.ExitCode)
	}
	return nil
}

// runHTTPHook POSTs {"event", "sandbox_id"} to the hook's port and path on
// the sandbox's own loopback; any 2xx answer is success.
func runHTTPHook(ctx context.Context, rt torpor.Runtime, r torpor.InstanceRef, id string, h torpor.Hook) error {
	d, ok := rt.(torpor.Dialer)
	if !ok {
		return fmt.Errorf("the %s runtime cannot reach ports inside a sandbox", rt.Kind())
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return d.DialContext(ctx, r, network, fmt.Sprintf("127.0.0.1:%d", h.Port))
		},
		DisableKeepAlives: true,
	}}
	body, _ := json.Marshal(map[string]string{"event": h.On, "sandbox_id": id})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d%s", h.Port, h.Path), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("timed out after %s", h.Timeout())
		}
		return fmt.Errorf("POST %s on port %d: %w", h.Path, h.Port, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("POST %s on port %d answered %s", h.Path, h.Port, resp.Status)
	}
	return nil
}

// tail keeps the last bytes written to it, for error messages.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailSize = 512

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailSize {
		t.buf = t.buf[len(t.buf)-tailSize:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}
