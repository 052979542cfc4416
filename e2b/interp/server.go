// Package interp serves the API of E2B's code interpreter (port 49999 of
// a code-interpreter sandbox), which @e2b/code-interpreter's runCode and
// its code contexts call: POST /execute streaming NDJSON lines, the
// /contexts calls and GET /health. torpor serves it from the daemon, on
// the port proxy like envd, on top of the sandbox's persistent
// interpreters (run_code): one per context, kept across a pause.
//
// What a python snippet prints is streamed as it runs (the engine's
// CodeOutput, polled); rich results, the error and a bash snippet's output
// come when it ends; keep-alive lines go out meanwhile.
package interp

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/lifecycle"
)

// Port is the code interpreter's port in an E2B sandbox.
const Port = 49999

// DefaultCwd is where E2B's contexts start unless told otherwise.
const DefaultCwd = "/home/user"

// Engine is what the server needs of the lifecycle engine.
type Engine interface {
	RunCode(ctx context.Context, tenant, id string, req torpor.CodeRequest) (torpor.CodeResult, error)
	CodeContexts(ctx context.Context, tenant, id string) ([]torpor.CodeContext, error)
	CreateCodeContext(ctx context.Context, tenant, id, language, cwd string) (torpor.CodeContext, error)
	RestartCodeContext(ctx context.Context, tenant, id, contextID string) error
	DeleteCodeContext(ctx context.Context, tenant, id, contextID string) error
}

var _ Engine = (*lifecycle.Engine)(nil)

// Config is what a Server needs.
type Config struct {
	Engine *lifecycle.Engine
	Logger *slog.Logger
	// KeepAlive is the interval of keep-alive lines on a running
	// execution's stream (default 5 s, as E2B's server).
	KeepAlive time.Duration
}

// Server serves the code interpreter's API for every sandbox.
type Server struct {
	eng       Engine
	log       *slog.Logger
	mux       *http.ServeMux
	keepAlive time.Duration
}

// New returns a server.
func New(cfg Config) *Server { return newServer(cfg.Engine, cfg) }

func newServer(eng Engine, cfg Config) *Server {
	s := &Server{eng: eng, log: cfg.Logger, mux: http.NewServeMux(), keepAlive: cfg.KeepAlive}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.keepAlive <= 0 {
		s.keepAlive = 5 * time.Second
	}
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, "OK") })
	s.mux.HandleFunc("POST /execute", s.execute)
	s.mux.HandleFunc("POST /contexts", s.createContext)
	s.mux.HandleFunc("GET /contexts", s.listContexts)
	s.mux.HandleFunc("DELETE /contexts/{id}", s.deleteContext)
	s.mux.HandleFunc("POST /contexts/{id}/restart", s.restartContext)
	return s
}

// The headers that carry the sandbox's token: the SDK sends the envd
// access token on /execute and the traffic access token on the /contexts
// calls (torpor gives both the sandbox's traffic token).
const (
	HeaderAccessToken  = "X-Access-Token"
	HeaderTrafficToken = "E2b-Traffic-Access-Token"
)

// Authorize tells whether r may reach sb's code interpreter: it carries
// sb's token in either header. Nothing is woken before this passes.
func (s *Server) Authorize(r *http.Request, sb *torpor.Sandbox) error {
	token := r.Header.Get(HeaderAccessToken)
	if token == "" {
		token = r.Header.Get(HeaderTrafficToken)
	}
	switch {
	case token == "":
		return torpor.Errorf(torpor.EUnauthenticated, "send the sandbox's access token in %s", HeaderAccessToken)
	case subtle.ConstantTimeCompare([]byte(token), []byte(sb.TrafficToken)) != 1:
		return torpor.Errorf(torpor.EForbidden, "wrong access token")
	}
	return nil
}

// ServeSandbox answers one request for sb, which the proxy found,
// authorized and woke.
func (s *Server) ServeSandbox(w http.ResponseWriter, r *http.Request, sb *torpor.Sandbox) {
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sandboxKey{}, sb)))
}

type sandboxKey struct{}

func sandboxOf(r *http.Request) *torpor.Sandbox {
	sb, _ := r.Context().Value(sandboxKey{}).(*torpor.Sandbox)
	return sb
}

// language maps an E2B language name to torpor's; ok is false for one
// torpor does not run.
func language(l string) (string, bool) {
	switch strings.ToLower(strings.TrimSpace(l)) {
	case "", "python", "python3":
		return torpor.LanguagePython, true
	case "bash":
		return torpor.LanguageBash, true
	case "sh":
		return torpor.LanguageShell, true
	}
	return "", false
}

func unsupported(w http.ResponseWriter, l string) {
	if len(l) > 64 {
		l = l[:64] + "..."
	}
	writeText(w, http.StatusBadRequest, fmt.Sprintf("Unsupported language %q: this code interpreter runs python and bash", l))
}

// The request bodies, with each field's JSON kept to check its type the
// way E2B's server (pydantic, strict strings) does.
type fields map[string]json.RawMessage

// decode reads a JSON object body; a body that is not one is a 422 as
// E2B's server answers.
func decode(w http.ResponseWriter, r *http.Request) (fields, bool) {
	var f fields
	body, err := io.ReadAll(io.LimitReader(r.Body, torpor.MaxCodeSize+(1<<20)))
	if err == nil && len(strings.TrimSpace(string(body))) == 0 {
		return fields{}, true
	}
	if err != nil || json.Unmarshal(body, &f) != nil || f == nil {
		validation(w, "body", "json_invalid", "the body is not a JSON object")
		return nil, false
	}
	return f, true
}

// str reads an optional string field; null and absent are "".
func (f fields) str(w http.ResponseWriter, name string, required bool) (string, bool) {
	raw, ok := f[name]
	if !ok || string(raw) == "null" {
		if required {
			validation(w, name, "missing", "Field required")
			return "", false
		}
		return "", true
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		validation(w, name, "string_type", "Input should be a valid string")
		return "", false
	}
	return v, true
}

// validation writes E2B's (FastAPI's) 422 body.
func validation(w http.ResponseWriter, field, kind, msg string) {
	writeJSON(w, http.StatusUnprocessableEntity, map[string]any{
		"detail": []map[string]any{{"type": kind, "loc": []string{"body", field}, "msg": msg}},
	})
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	f, ok := decode(w, r)
	if !ok {
		return
	}
	code, ok := f.str(w, "code", true)
	if !ok {
		return
	}
	contextID, ok := f.str(w, "context_id", false)
	if !ok {
		return
	}
	lang, ok := f.str(w, "language", false)
	if !ok {
		return
	}
	var env map[string]string
	if raw, ok := f["env_vars"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &env); err != nil {
			validation(w, "env_vars", "dict_type", "Input should be a valid dictionary of strings")
			return
		}
	}
	if contextID != "" && lang != "" {
		writeText(w, http.StatusBadRequest, "Only one of context_id or language can be provided")
		return
	}
	req := torpor.CodeRequest{Code: code, Env: env, Cwd: DefaultCwd}
	if contextID != "" {
		req.Context = contextID
		if err := torpor.ValidateCode(req); torpor.ErrorCodeOf(err) == torpor.EInvalid && paramOf(err) == "context" {
			writeText(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", clip(contextID)))
			return
		}
	} else {
		l, ok := language(lang)
		if !ok {
			unsupported(w, lang)
			return
		}
		req.Language = l
	}
	if err := torpor.ValidateCode(req); err != nil {
		s.fail(w, err, contextID)
		return
	}
	s.stream(w, r, sb, req)
}

// stream runs req and writes its lines. The status waits for the first
// keep-alive, so that a request refused at once (an unknown context) gets
// its 4xx; a failure after that is an error line.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, sb *torpor.Sandbox, req torpor.CodeRequest) {
	type outcome struct {
		res torpor.CodeResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := s.eng.RunCode(r.Context(), sb.Tenant, sb.ID, req)
		done <- outcome{res, err}
	}()
	tick := time.NewTicker(s.keepAlive)
	defer tick.Stop()
	// What the snippet prints is streamed as it comes, where the runtime
	// can tell (a python context): polled, and sent as stdout and stderr
	// lines; the final answer then brings only the rest.
	live, canStream := s.eng.(codeOutputs)
	var poll <-chan time.Time
	if canStream {
		t := time.NewTicker(outputPoll)
		defer t.Stop()
		poll = t.C
	}
	key := req.Context
	if key == "" {
		key = req.Language
	}
	var sentOut, sentErr strings.Builder
	committed := false
	flush := func() {
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
	}
	commit := func() {
		if !committed {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			committed = true
		}
	}
	for {
		select {
		case o := <-done:
			if o.err != nil && !committed {
				s.fail(w, o.err, req.Context)
				return
			}
			commit()
			enc := json.NewEncoder(w)
			enc.SetEscapeHTML(false)
			if o.err != nil {
				s.log.Info("e2b interp: execution failed", "sandbox", sb.ID, "err", o.err)
				_ = enc.Encode(errorLine{Type: "error", Name: "ExecutionError", Value: publicMessage(o.err)})
			} else {
				o.res.Stdout = unsent(o.res.Stdout, sentOut.String())
				o.res.Stderr = unsent(o.res.Stderr, sentErr.String())
				for _, line := range lines(o.res, time.Now()) {
					_ = enc.Encode(line)
				}
			}
			_ = enc.Encode(map[string]string{"type": "end_of_execution"})
			flush()
			return
		case <-poll:
			got, err := live.CodeOutput(r.Context(), sb.Tenant, sb.ID, key, int64(sentOut.Len()), int64(sentErr.Len()))
			if err != nil || (got.Stdout == "" && got.Stderr == "") {
				continue
			}
			commit()
			ts := time.Now().UTC().Format(time.RFC3339Nano)
			enc := json.NewEncoder(w)
			enc.SetEscapeHTML(false)
			if got.Stdout != "" {
				sentOut.WriteString(got.Stdout)
				_ = enc.Encode(map[string]string{"type": "stdout", "text": got.Stdout, "timestamp": ts})
			}
			if got.Stderr != "" {
				sentErr.WriteString(got.Stderr)
				_ = enc.Encode(map[string]string{"type": "stderr", "text": got.Stderr, "timestamp": ts})
			}
			flush()
		case <-tick.C:
			commit()
			if _, err := io.WriteString(w, `{"type":"keepalive"}`+"\n"); err != nil {
				return // the caller left; the engine's context ends the snippet
			}
			flush()
		case <-r.Context().Done():
			<-done
			return
		}
	}
}

// outputPoll is how often a running snippet's output is looked for.
const outputPoll = 100 * time.Millisecond

// codeOutputs is the engine's reading of a running snippet's output
// (lifecycle.Engine has it).
type codeOutputs interface {
	CodeOutput(ctx context.Context, tenant, id, contextID string, stdoutOffset, stderrOffset int64) (torpor.CodeOutput, error)
}

// unsent is what of a snippet's whole output was not streamed yet: all of
// it when what was sent is not its beginning (it was cut short).
func unsent(all, sent string) string {
	if rest, ok := strings.CutPrefix(all, sent); ok {
		return rest
	}
	if sent != "" {
		return ""
	}
	return all
}

type errorLine struct {
	Type      string `json:"type"`
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// lines are an execution's NDJSON lines, as E2B's server sends them
// (its end-of-stream line excepted).
func lines(res torpor.CodeResult, now time.Time) []any {
	ts := now.UTC().Format(time.RFC3339Nano)
	out := []any{map[string]any{"type": "number_of_executions", "execution_count": res.ExecutionCount}}
	if res.Stdout != "" {
		out = append(out, map[string]string{"type": "stdout", "text": res.Stdout, "timestamp": ts})
	}
	if res.Stderr != "" {
		out = append(out, map[string]string{"type": "stderr", "text": res.Stderr, "timestamp": ts})
	}
	for _, d := range res.Displays {
		out = append(out, resultLine(d))
	}
	if e := res.Error; e != nil {
		out = append(out, errorLine{Type: "error", Name: e.Name, Value: e.Value, Traceback: e.Traceback})
	}
	return out
}

// formats maps MIME types to the fields of E2B's result.
var formats = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
	"e2b/data":               "data",
	"e2b/chart":              "chart",
}

// resultLine is one rich output as E2B's result line: its formats as
// fields (json, data and chart as objects), the rest under extra. Like
// E2B's server it takes the quotes off a plain-text string's repr.
func resultLine(d torpor.CodeDisplay) map[string]any {
	line := map[string]any{"type": "result", "is_main_result": d.Main}
	extra := map[string]any{}
	for mime, v := range d.Data {
		field, known := formats[mime]
		switch {
		case !known:
			extra[mime] = v
		case field == "json" || field == "data" || field == "chart":
			var obj any
			if json.Unmarshal([]byte(v), &obj) == nil {
				line[field] = obj
			}
		case field == "text":
			if len(v) >= 2 && (v[0] == '\'' && v[len(v)-1] == '\'' || v[0] == '"' && v[len(v)-1] == '"') {
				v = v[1 : len(v)-1]
			}
			line[field] = v
		default:
			line[field] = v
		}
	}
	if len(extra) > 0 {
		line["extra"] = extra
	}
	return line
}

// contextJSON is E2B's context object.
type contextJSON struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	f, ok := decode(w, r)
	if !ok {
		return
	}
	lang, ok := f.str(w, "language", false)
	if !ok {
		return
	}
	cwd, ok := f.str(w, "cwd", false)
	if !ok {
		return
	}
	l, ok := language(lang)
	if !ok {
		unsupported(w, lang)
		return
	}
	if cwd == "" {
		cwd = DefaultCwd
	}
	c, err := s.eng.CreateCodeContext(r.Context(), sb.Tenant, sb.ID, l, cwd)
	if err != nil {
		s.fail(w, err, "")
		return
	}
	writeJSON(w, http.StatusOK, contextJSON{ID: c.ID, Language: c.Language, Cwd: c.Cwd})
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	cs, err := s.eng.CodeContexts(r.Context(), sb.Tenant, sb.ID)
	if err != nil {
		s.fail(w, err, "")
		return
	}
	// E2B's server always has its default python context, listed first.
	out := []contextJSON{{ID: torpor.LanguagePython, Language: torpor.LanguagePython, Cwd: DefaultCwd}}
	for _, c := range cs {
		j := contextJSON{ID: c.ID, Language: c.Language, Cwd: c.Cwd}
		if c.ID == torpor.LanguagePython {
			out[0] = j
			continue
		}
		out = append(out, j)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request) {
	s.dropContext(w, r, false)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	s.dropContext(w, r, true)
}

func (s *Server) dropContext(w http.ResponseWriter, r *http.Request, restart bool) {
	sb := sandboxOf(r)
	id := r.PathValue("id")
	if err := torpor.ValidateCode(torpor.CodeRequest{Op: torpor.CodeDelete, Context: id}); err != nil {
		writeText(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", clip(id)))
		return
	}
	var err error
	if restart {
		err = s.eng.RestartCodeContext(r.Context(), sb.Tenant, sb.ID, id)
	} else {
		err = s.eng.DeleteCodeContext(r.Context(), sb.Tenant, sb.ID, id)
	}
	if err != nil {
		s.fail(w, err, id)
		return
	}
	writeJSON(w, http.StatusOK, nil)
}

// fail answers err in E2B's server's way: plain text; an unknown context
// is its "Context ID not found".
func (s *Server) fail(w http.ResponseWriter, err error, contextID string) {
	code := torpor.ErrorCodeOf(err)
	status := wire.Status(code) // torpor's one table
	if status == http.StatusInternalServerError {
		s.log.Error("e2b interp: request failed", "err", err)
	}
	var te *torpor.Error
	if errors.As(err, &te) && te.RetryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(int(te.RetryAfter.Seconds()+0.999)))
	}
	msg := publicMessage(err)
	if code == torpor.ENotFound && contextID != "" && paramOf(err) == "context" {
		msg = fmt.Sprintf("Context %s not found", clip(contextID))
	}
	writeText(w, status, msg)
}

// publicMessage is what a caller may read of err: a torpor error's
// message, nothing of an internal one.
func publicMessage(err error) string {
	var te *torpor.Error
	if errors.As(err, &te) && te.Code != torpor.EInternal {
		return te.Message
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return "the request ended before the execution"
	}
	return "internal error"
}

func paramOf(err error) string {
	var te *torpor.Error
	if errors.As(err, &te) {
		return te.Param
	}
	return ""
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
