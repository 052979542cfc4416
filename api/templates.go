package api

import (
	"context"
	"net/http"
	"strings"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// templates lists the templates.
func (s *Server) templates(w http.ResponseWriter, r *http.Request, p principal) error {
	ts, err := s.tmpls.ListTemplates(r.Context())
	if err != nil {
		return err
	}
	if ts == nil {
		ts = []torpor.Template{}
	}
	if err := s.countUse(r.Context(), p, ts); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.TemplateList{Templates: ts})
	return nil
}

// getTemplate returns one template.
func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request, p principal) error {
	t, err := s.tmpls.GetTemplate(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	one := []torpor.Template{*t}
	if err := s.countUse(r.Context(), p, one); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, one[0])
	return nil
}

// countUse sets the in_use of each template to the number of sandboxes
// the caller may see that use it (lifecycle.Engine.CountTemplateUse): an
// admin sees every tenant's, a tenant only its own.
func (s *Server) countUse(ctx context.Context, p principal, ts []torpor.Template) error {
	if p.admin {
		return nil
	}
	return s.eng.CountTemplateUse(ctx, p.tenant, ts)
}

// deleteTemplate removes a template that no live sandbox uses (409
// otherwise, naming one).
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request, p principal) error {
	if s.tmplMgr == nil {
		return noTemplateManager()
	}
	if err := decode(r, &struct{}{}, true); err != nil {
		return err
	}
	if err := s.tmplMgr.Delete(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// importTemplate makes a template from an image or a root filesystem.
func (s *Server) importTemplate(w http.ResponseWriter, r *http.Request, p principal) error {
	if s.tmplMgr == nil {
		return noTemplateManager()
	}
	var req torpor.TemplateImportRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return err
	}
	return s.makeTemplate(w, r, req.Name, func(ctx context.Context, progress func(string)) (*torpor.Template, error) {
		return s.tmplMgr.Import(ctx, req, progress)
	})
}

// buildTemplate builds a Debian template with debootstrap.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request, p principal) error {
	if s.tmplMgr == nil {
		return noTemplateManager()
	}
	var req torpor.TemplateBuildRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return err
	}
	return s.makeTemplate(w, r, req.Name, func(ctx context.Context, progress func(string)) (*torpor.Template, error) {
		return s.tmplMgr.Build(ctx, req, progress)
	})
}

// makeTemplate runs an import or a build. With Accept: text/event-stream
// it streams progress as server-sent events and ends with a "template" or
// "error" event; otherwise it answers 201 with the template once done.
func (s *Server) makeTemplate(w http.ResponseWriter, r *http.Request, name string, run func(context.Context, func(string)) (*torpor.Template, error)) error {
	if !strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		t, err := run(r.Context(), func(line string) { s.log.Debug("template progress", "template", name, "line", line) })
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, t)
		return nil
	}
	// The stream starts with the first line of progress: a refusal before
	// it (an existing name, a missing path) is an ordinary error response.
	sse := &sseWriter{w: w, rc: http.NewResponseController(w)}
	t, err := run(r.Context(), func(line string) { sse.send(wire.EventProgress, wire.TemplateProgress{Message: line}) })
	if err != nil {
		if !sse.started() {
			return err
		}
		e := torpor.AsError(err)
		if e.Code == torpor.EInternal {
			s.log.Error("internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		}
		sse.send(wire.EventError, wire.ErrorBody{Error: wire.ErrorDetail{Code: e.Code, Message: e.Message, Param: e.Param, Reason: e.Reason}})
		return nil
	}
	sse.send(wire.EventTemplate, t)
	return nil
}

func noTemplateManager() error {
	return torpor.Errorf(torpor.EUnavailable, "this server does not manage templates")
}
