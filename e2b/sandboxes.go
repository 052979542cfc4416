package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

// E2B's timeouts, in seconds: the default end of a create (15 for POST
// /sandboxes and resume, 300 for /v2 and connect), and what a refresh
// grants (at least 15, at most an hour).
const (
	defaultTimeoutV1 = 15
	defaultTimeoutV2 = 300
	refreshMin       = 15
	refreshMax       = 3600
	maxTemplateID    = 128
)

func notFound(id string) error {
	e := torpor.Errorf(torpor.ENotFound, "sandbox %q not found", id)
	e.Param = "sandboxID"
	return e
}

func (a *API) createV1(w http.ResponseWriter, r *http.Request, tenant string, c torpor.Caller) error {
	return a.create(w, r, tenant, c, defaultTimeoutV1)
}

func (a *API) createV2(w http.ResponseWriter, r *http.Request, tenant string, c torpor.Caller) error {
	return a.create(w, r, tenant, c, defaultTimeoutV2)
}

func (a *API) create(w http.ResponseWriter, r *http.Request, tenant string, caller torpor.Caller, defTimeout int64) error {
	raw := a.keepBody(r)
	var body newSandbox
	present, err := decode(r, &body)
	if err != nil {
		return err
	}
	if !present {
		return torpor.Invalid("body", "a JSON body with templateID is required")
	}
	req, err := createRequest(body, defTimeout, a.internet)
	if err != nil {
		return err
	}
	if sb, name, ok := parseSnapshotID(*body.TemplateID); ok {
		return a.createFromSnapshot(w, r, tenant, req, sb, name)
	}
	if req.Template, err = a.resolve(r.Context(), *body.TemplateID); err != nil {
		return err
	}
	if raw != nil {
		if done, err := a.placeCreate(w, r, req, raw); done {
			return err
		}
	}
	req.Caller = caller
	sb, err := a.eng.Create(r.Context(), tenant, req)
	if err != nil {
		return err
	}
	if sb.State == torpor.StateFailed {
		// E2B has no failed sandboxes: the create failed, and nothing is
		// left behind.
		msg := "the sandbox failed to start"
		if sb.Failure != nil {
			msg += ": " + sb.Failure.Message
		}
		if _, err := a.eng.Delete(context.WithoutCancel(r.Context()), tenant, sb.ID); err != nil {
			a.log.Error("removing a sandbox whose boot failed", "sandbox", sb.ID, "err", err)
		}
		writeJSON(w, http.StatusInternalServerError, errorBody{Code: http.StatusInternalServerError, Message: msg, ErrorCode: "sandbox_create_failed"})
		return nil
	}
	writeJSON(w, http.StatusCreated, a.answer(sb))
	return nil
}

// resolve maps an E2B template name to a torpor template.
func (a *API) resolve(ctx context.Context, name string) (string, error) {
	if a.tmpls == nil {
		return name, nil
	}
	return a.tmpls.Resolve(ctx, name)
}

// given reports whether a raw JSON field holds something other than null
// or an empty object or array.
func given(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null")) && !bytes.Equal(t, []byte("{}")) && !bytes.Equal(t, []byte("[]"))
}

// createRequest checks an E2B create body and maps it to torpor's create
// request (the template still to be resolved): the timeout becomes the
// end time, autoPause (or lifecycle.onTimeout "pause") what happens at it
// (a pause that keeps memory, or with autoPauseMemory false a
// hibernation that keeps only the disk), autoResume torpor's auto_resume.
// E2B's sandboxes run until their end: no idle rule applies to them.
func createRequest(b newSandbox, defTimeout int64, internet bool) (torpor.CreateRequest, error) {
	var req torpor.CreateRequest
	if b.TemplateID == nil || *b.TemplateID == "" {
		return req, torpor.Invalid("templateID", "templateID is required")
	}
	if len(*b.TemplateID) > maxTemplateID {
		return req, torpor.Invalid("templateID", "templateID is longer than %d bytes", maxTemplateID)
	}
	timeout := defTimeout
	if b.Timeout != nil {
		timeout = *b.Timeout
	}
	if timeout < 1 || timeout > torpor.MaxPolicySeconds {
		return req, torpor.Invalid("timeout", "timeout must be between 1 and %d seconds", torpor.MaxPolicySeconds)
	}
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"mcp", b.MCP}, {"iam", b.IAM}} {
		if given(f.raw) {
			return req, torpor.Invalid(f.name, "%s is not supported by torpor", f.name)
		}
	}
	if given(b.Network) {
		rules, err := networkRules(b.Network)
		if err != nil {
			return req, err
		}
		req.Network = rules
	}
	if err := torpor.ValidateMetadata("metadata", b.Metadata); err != nil {
		return req, err
	}
	if err := torpor.ValidateEnv(b.EnvVars); err != nil {
		e := torpor.AsError(err)
		e.Param = "envVars"
		return req, e
	}

	action := torpor.ActionKill
	if b.AutoPause != nil && *b.AutoPause {
		action = torpor.ActionPause
	}
	var resume *bool
	if b.AutoResume != nil {
		if b.AutoResume.Enabled == nil {
			return req, torpor.Invalid("autoResume.enabled", "autoResume.enabled is required")
		}
		resume = b.AutoResume.Enabled
	}
	if l := b.Lifecycle; l != nil {
		if l.OnTimeout == nil {
			l.OnTimeout = l.OnTimeoutSnake
		}
		if l.AutoResume == nil {
			l.AutoResume = l.AutoResumeSnake
		}
		if l.OnTimeout != nil {
			var act string
			switch *l.OnTimeout {
			case "kill":
				act = torpor.ActionKill
			case "pause":
				act = torpor.ActionPause
			default:
				return req, torpor.Invalid("lifecycle.onTimeout", "lifecycle.onTimeout must be kill or pause")
			}
			if b.AutoPause != nil && act != action {
				return req, torpor.Invalid("lifecycle.onTimeout", "lifecycle.onTimeout contradicts autoPause")
			}
			action = act
		}
		if l.AutoResume != nil {
			if resume != nil && *resume != *l.AutoResume {
				return req, torpor.Invalid("lifecycle.autoResume", "lifecycle.autoResume contradicts autoResume.enabled")
			}
			resume = l.AutoResume
		}
	}
	if b.AutoPauseMu != nil {
		if action != torpor.ActionPause {
			return req, torpor.Invalid("autoPauseMemory", "autoPauseMemory is only allowed with autoPause")
		}
		if !*b.AutoPauseMu {
			action = torpor.ActionHibernate
		}
	}
	autoResume := resume != nil && *resume
	if autoResume && action != torpor.ActionPause {
		if action == torpor.ActionHibernate {
			return req, torpor.Invalid("autoResume", "autoResume cannot be combined with autoPauseMemory false: a sandbox paused without its memory is resumed by connect")
		}
		return req, torpor.Invalid("autoResume", "autoResume needs autoPause (lifecycle.onTimeout pause)")
	}

	if given(b.VolumeMounts) {
		// E2B's SandboxVolumeMount: {name, path}, read-write; torpor's
		// volumes of the tenant (docs/volumes.md).
		var ms []struct {
			Name string `json:"name"`
			Path string `json:"path"`
		}
		dec := json.NewDecoder(bytes.NewReader(b.VolumeMounts))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ms); err != nil {
			return req, torpor.Invalid("volumeMounts", "volumeMounts must be a list of {name, path}")
		}
		for _, m := range ms {
			req.VolumeMounts = append(req.VolumeMounts, torpor.VolumeMount{Name: m.Name, Path: m.Path})
		}
		if err := torpor.ValidateVolumeMounts(req.VolumeMounts); err != nil {
			e := torpor.AsError(err)
			e.Param = "volumeMounts"
			return req, e
		}
	}
	req.Metadata = b.Metadata
	req.Env = b.EnvVars
	req.AllowInternet = internet
	if b.AllowInternetAccess != nil {
		req.AllowInternet = *b.AllowInternetAccess
	}
	req.PolicyRequest = torpor.PolicyRequest{
		EndAfterSeconds: torpor.Seconds(timeout),
		OnEnd:           action,
		Lifecycle:       &torpor.Lifecycle{AutoResume: &autoResume},
		LifecyclePolicy: &torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Off(), HibernateAfterPausedSeconds: torpor.Off()},
	}
	return req, nil
}

// load returns one of tenant's sandboxes that E2B can see: a terminated
// one is not found.
func (a *API) load(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	sb, err := a.eng.Get(ctx, tenant, id)
	if err != nil {
		if torpor.IsCode(err, torpor.ENotFound) {
			return nil, notFound(id)
		}
		return nil, err
	}
	if sb.State == torpor.StateTerminated || sb.State == torpor.StateTerminating {
		return nil, notFound(id)
	}
	return sb, nil
}

func (a *API) get(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	sb, err := a.load(r.Context(), tenant, sandboxID(r))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, a.detail(sb))
	return nil
}

func (a *API) kill(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	id := sandboxID(r)
	if _, err := a.load(r.Context(), tenant, id); err != nil {
		return err
	}
	if _, err := a.eng.Delete(r.Context(), tenant, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// pauseBody is E2B's SandboxPauseRequest.
type pauseBody struct {
	// Memory false keeps only the disk: torpor's hibernation.
	Memory *bool `json:"memory"`
}

// asleep reports whether the sandbox is paused as E2B sees it.
func asleep(s torpor.State) bool {
	switch s {
	case torpor.StatePausing, torpor.StatePaused, torpor.StateHibernating, torpor.StateHibernated, torpor.StateArchiving, torpor.StateArchived:
		return true
	}
	return false
}

func (a *API) pause(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	var body pauseBody
	if _, err := decode(r, &body); err != nil {
		return err
	}
	id := sandboxID(r)
	sb, err := a.load(r.Context(), tenant, id)
	if err != nil {
		return err
	}
	if asleep(sb.State) {
		return &torpor.Error{Code: torpor.EConflict, State: sb.State, Reason: "state", Message: fmt.Sprintf("sandbox %s is already paused", id)}
	}
	if body.Memory != nil && !*body.Memory {
		_, err = a.eng.Hibernate(r.Context(), tenant, id)
	} else {
		// The sandbox's own way: a freeze for containers, a snapshot for
		// VMs.
		_, err = a.eng.Pause(r.Context(), tenant, id, "")
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connectBody is E2B's ConnectSandbox, and ResumedSandbox with autoPause.
type connectBody struct {
	Timeout   *int64 `json:"timeout"`
	Memory    *bool  `json:"memory"`
	AutoPause *bool  `json:"autoPause"`
}

func (a *API) connectV1(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	var body connectBody
	if _, err := decode(r, &body); err != nil {
		return err
	}
	if body.Timeout == nil {
		return torpor.Invalid("timeout", "timeout is required")
	}
	return a.connect(w, r, tenant, body, false)
}

func (a *API) connectV2(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	var body connectBody
	if _, err := decode(r, &body); err != nil {
		return err
	}
	if body.Timeout == nil {
		t := int64(defaultTimeoutV2)
		body.Timeout = &t
	}
	return a.connect(w, r, tenant, body, false)
}

// resume is the deprecated POST /sandboxes/{id}/resume: connect for a
// paused sandbox only, 15 s by default.
func (a *API) resume(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	var body connectBody
	if _, err := decode(r, &body); err != nil {
		return err
	}
	if body.Timeout == nil {
		t := int64(defaultTimeoutV1)
		body.Timeout = &t
	}
	return a.connect(w, r, tenant, body, true)
}

// connect makes the sandbox run for at least the body's timeout: a
// running one's end moves later (200), a paused one resumes with its
// memory, or boots on its disk when it has none or memory is false (201).
func (a *API) connect(w http.ResponseWriter, r *http.Request, tenant string, body connectBody, pausedOnly bool) error {
	if t := *body.Timeout; t < 1 || t > torpor.MaxPolicySeconds {
		return torpor.Invalid("timeout", "timeout must be between 1 and %d seconds", torpor.MaxPolicySeconds)
	}
	ctx := r.Context()
	id := sandboxID(r)
	sb, err := a.load(ctx, tenant, id)
	if err != nil {
		return err
	}
	if pausedOnly && !asleep(sb.State) && sb.State != torpor.StateFailed {
		return &torpor.Error{Code: torpor.EConflict, State: sb.State, Reason: "state", Message: fmt.Sprintf("sandbox %s is already running", id)}
	}
	if body.AutoPause != nil {
		on := torpor.ActionKill
		if *body.AutoPause {
			on = torpor.ActionPause
		}
		if _, err := a.eng.Update(ctx, tenant, id, torpor.UpdateRequest{PolicyRequest: torpor.PolicyRequest{OnEnd: on}}); err != nil {
			return err
		}
	}
	if body.Memory != nil && !*body.Memory && (sb.State == torpor.StatePaused || sb.State == torpor.StatePausing) {
		// Resume from the disk only: drop the memory, boot afresh.
		if _, err := a.eng.Hibernate(ctx, tenant, id); err != nil {
			return err
		}
	}
	sb, resumed, err := a.eng.Connect(ctx, tenant, id, time.Duration(*body.Timeout)*time.Second)
	if err != nil {
		return err
	}
	if sb.State != torpor.StateRunning {
		return &torpor.Error{Code: torpor.EConflict, State: sb.State, Reason: "state",
			Message: fmt.Sprintf("sandbox %s did not come back: it is %s", id, e2bState(sb.State))}
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, a.answer(sb))
	return nil
}

// timeoutBody is E2B's SandboxTimeoutRequest.
type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

// setTimeout ends the sandbox timeout seconds from now, sooner or later
// than before, and makes that the run time a later auto-resume grants.
func (a *API) setTimeout(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	var body timeoutBody
	if _, err := decode(r, &body); err != nil {
		return err
	}
	if body.Timeout == nil {
		return torpor.Invalid("timeout", "timeout is required")
	}
	if t := *body.Timeout; t < 0 || t > torpor.MaxPolicySeconds {
		return torpor.Invalid("timeout", "timeout must be between 0 and %d seconds", torpor.MaxPolicySeconds)
	}
	return a.setEnd(w, r, tenant, lifecycle.EndChange{In: time.Duration(*body.Timeout) * time.Second, Renew: true})
}

// refreshBody is E2B's SandboxRefreshRequest.
type refreshBody struct {
	Duration *int64 `json:"duration"`
}

// refresh keeps the sandbox alive for at least duration seconds (15 by
// default and at least): its end only moves later.
func (a *API) refresh(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	var body refreshBody
	if _, err := decode(r, &body); err != nil {
		return err
	}
	d := int64(refreshMin)
	if body.Duration != nil {
		if *body.Duration < 0 || *body.Duration > refreshMax {
			return torpor.Invalid("duration", "duration must be between 0 and %d seconds", refreshMax)
		}
		d = max(*body.Duration, refreshMin)
	}
	return a.setEnd(w, r, tenant, lifecycle.EndChange{In: time.Duration(d) * time.Second, LaterOnly: true})
}

func (a *API) setEnd(w http.ResponseWriter, r *http.Request, tenant string, c lifecycle.EndChange) error {
	id := sandboxID(r)
	if _, err := a.load(r.Context(), tenant, id); err != nil {
		return err
	}
	if _, err := a.eng.SetEnd(r.Context(), tenant, id, c); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// networkBody is E2B's network of a create or of PUT
// /sandboxes/{id}/network: its egress rules map to torpor's
// (docs/egress.md); the rest is refused when given.
type networkBody struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
	// Create only: allowPublicTraffic true is what torpor does (its
	// proxy needs no token); the others are not served.
	AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
	Rules              json.RawMessage `json:"rules"`
	EgressProxy        json.RawMessage `json:"egressProxy"`
	MaskRequestHost    json.RawMessage `json:"maskRequestHost"`
	HTTPSPorts         json.RawMessage `json:"httpsPorts"`
	// Update only.
	AllowInternetAccess *bool `json:"allow_internet_access"`
}

// networkRules maps an E2B network object to torpor's egress rules (nil:
// none), checked.
func networkRules(raw json.RawMessage) (*torpor.NetworkRules, error) {
	var nb networkBody
	if err := json.Unmarshal(raw, &nb); err != nil {
		return nil, torpor.Invalid("network", "network must be an object with allowOut and denyOut lists of strings")
	}
	return nb.rules()
}

func (nb networkBody) rules() (*torpor.NetworkRules, error) {
	for _, f := range []struct {
		name string
		raw  json.RawMessage
	}{{"rules", nb.Rules}, {"egressProxy", nb.EgressProxy}, {"maskRequestHost", nb.MaskRequestHost}, {"httpsPorts", nb.HTTPSPorts}} {
		if given(f.raw) && string(bytes.TrimSpace(f.raw)) != "false" {
			return nil, torpor.Invalid("network."+f.name, "network.%s is not supported by torpor; allowOut and denyOut are", f.name)
		}
	}
	if nb.AllowPublicTraffic != nil && !*nb.AllowPublicTraffic {
		return nil, torpor.Invalid("network.allowPublicTraffic", "torpor's proxy does not ask for a traffic token: allowPublicTraffic false is not supported")
	}
	rules := &torpor.NetworkRules{AllowOut: nb.AllowOut, DenyOut: nb.DenyOut}
	if err := torpor.ValidateNetworkRules("network", rules); err != nil {
		e := torpor.AsError(err)
		e.Param = strings.NewReplacer("allow_out", "allowOut", "deny_out", "denyOut").Replace(e.Param)
		return nil, e
	}
	return rules.Clone(), nil
}

// updateNetwork replaces a sandbox's egress rules (the SDK's
// Sandbox.updateNetwork: PUT /sandboxes/{id}/network); without allowOut
// and denyOut it removes them. allow_internet_access cannot change on a
// sandbox that exists.
func (a *API) updateNetwork(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	var nb networkBody
	if _, err := decode(r, &nb); err != nil {
		return err
	}
	if nb.AllowPublicTraffic != nil {
		return torpor.Invalid("network.allowPublicTraffic", "allowPublicTraffic is set at create only")
	}
	id := sandboxID(r)
	sb, err := a.load(r.Context(), tenant, id)
	if err != nil {
		return err
	}
	if nb.AllowInternetAccess != nil && *nb.AllowInternetAccess != sb.AllowInternet {
		return torpor.Invalid("allow_internet_access", "torpor cannot change allow_internet_access of a sandbox that exists; allowOut and denyOut can")
	}
	rules, err := nb.rules()
	if err != nil {
		return err
	}
	if rules == nil {
		rules = &torpor.NetworkRules{}
	}
	if _, err := a.eng.Update(r.Context(), tenant, id, torpor.UpdateRequest{Network: rules}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
