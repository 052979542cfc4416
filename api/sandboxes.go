package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/lifecycle"
)

func (s *Server) create(w http.ResponseWriter, r *http.Request, p principal) error {
	var req torpor.CreateRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	req.Caller = torpor.Caller{KeyID: p.keyID, Tier: p.tier}
	sb, err := s.eng.Create(r.Context(), p.tenant, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, sb)
	return nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, p principal) error {
	q := r.URL.Query()
	all, err := queryBool(r, "all")
	if err != nil {
		return err
	}
	f := torpor.SandboxFilter{IncludeTerminated: all}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st != "" {
				f.States = append(f.States, torpor.State(st))
			}
		}
	}
	for k, vs := range q {
		if key, ok := strings.CutPrefix(k, "metadata."); ok {
			if f.Metadata == nil {
				f.Metadata = map[string]string{}
			}
			f.Metadata[key] = vs[0]
		}
	}
	// Paging: ?limit=N answers at most N and a next cursor when more
	// follow; ?after= is that cursor. Without them the answer is the
	// whole list, as it always was.
	var limit int64
	if q.Has("limit") {
		if limit, err = queryInt(r, "limit", 0); err != nil || limit < 1 || limit > maxListLimit {
			return torpor.Invalid("limit", "must be an integer between 1 and %d", maxListLimit)
		}
		f.Limit = int(limit) + 1
	}
	if q.Has("after") {
		if f.After, err = parseListCursor(q.Get("after")); err != nil {
			return err
		}
	}
	sbs, err := s.eng.List(r.Context(), p.tenant, f)
	if err != nil {
		return err
	}
	if sbs == nil {
		sbs = []*torpor.Sandbox{}
	}
	out := wire.SandboxList{Sandboxes: sbs}
	if limit > 0 && int64(len(sbs)) > limit {
		out.Sandboxes = sbs[:limit]
		out.Next = listCursor(sbs[limit-1])
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, p principal) error {
	sb, err := s.eng.Get(r.Context(), p.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) update(w http.ResponseWriter, r *http.Request, p principal) error {
	var req torpor.UpdateRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	sb, err := s.eng.Update(r.Context(), p.tenant, r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request, p principal) error {
	return s.verb((*lifecycle.Engine).Delete)(w, r, p)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.PauseRequest
	if err := decode(r, &req, true); err != nil {
		return err
	}
	switch req.Mode {
	case "", torpor.PauseFreeze, torpor.PauseSnapshot:
	default:
		return torpor.Invalid("mode", "mode must be %q or %q", torpor.PauseFreeze, torpor.PauseSnapshot)
	}
	sb, err := s.eng.Pause(r.Context(), p.tenant, r.PathValue("id"), req.Mode)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}

func (s *Server) start(w http.ResponseWriter, r *http.Request, p principal) error {
	return s.verb((*lifecycle.Engine).Start)(w, r, p)
}

// verb adapts an engine verb that takes no body to a handler.
func (s *Server) verb(fn func(*lifecycle.Engine, context.Context, string, string) (*torpor.Sandbox, error)) handler {
	return func(w http.ResponseWriter, r *http.Request, p principal) error {
		if err := decode(r, &struct{}{}, true); err != nil {
			return err
		}
		sb, err := fn(s.eng, r.Context(), p.tenant, r.PathValue("id"))
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, sb)
		return nil
	}
}

func (s *Server) events(w http.ResponseWriter, r *http.Request, p principal) error {
	return s.listEvents(w, r, p, "")
}

func (s *Server) sandboxEvents(w http.ResponseWriter, r *http.Request, p principal) error {
	return s.listEvents(w, r, p, r.PathValue("id"))
}

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request, p principal, id string) error {
	since, err := queryInt(r, "since", 0)
	if err != nil {
		return err
	}
	// ?latest=true moves the cursor to the newest event (past since), so
	// a reader that has just read the current state starts after it
	// without reading the log: as JSON it answers no events and that
	// cursor as next; as a stream it starts there.
	latest, err := queryBool(r, "latest")
	if err != nil {
		return err
	}
	newest := func() error {
		evs, err := s.eng.Events(r.Context(), p.tenant, torpor.EventFilter{After: since, SandboxID: id, Newest: true})
		if len(evs) > 0 {
			since = evs[0].Seq
		}
		return err
	}
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		if last := r.Header.Get("Last-Event-ID"); last != "" {
			// A reconnection: it goes on from its last event, latest
			// or not, and so misses nothing.
			n, err := strconv.ParseInt(last, 10, 64)
			if err != nil || n < 0 {
				return torpor.Invalid("Last-Event-ID", "must be a cursor (a non-negative integer)")
			}
			since = n
		} else if latest {
			if err := newest(); err != nil {
				return err
			}
		}
		return s.followEvents(w, r, p, id, since)
	}
	limit, err := queryInt(r, "limit", 1000)
	if err != nil {
		return err
	}
	if limit == 0 || limit > 10000 {
		return torpor.Invalid("limit", "must be between 1 and 10000")
	}
	if latest {
		if err := newest(); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, wire.EventList{Events: []torpor.Event{}, Next: since})
		return nil
	}
	evs, err := s.eng.Events(r.Context(), p.tenant, torpor.EventFilter{After: since, SandboxID: id, Limit: int(limit)})
	if err != nil {
		return err
	}
	next := since
	if len(evs) > 0 {
		next = evs[len(evs)-1].Seq
	}
	if evs == nil {
		evs = []torpor.Event{}
	}
	writeJSON(w, http.StatusOK, wire.EventList{Events: evs, Next: next})
	return nil
}

// heartbeat keeps an idle event stream's connection alive.
const heartbeat = 15 * time.Second

// followEvents streams events after since as server-sent events, each with
// its cursor as the event id, until the caller goes away. A client that
// reconnects with Last-Event-ID (or ?since=) misses nothing.
func (s *Server) followEvents(w http.ResponseWriter, r *http.Request, p principal, id string, since int64) error {
	ctx := r.Context()
	// Check access and the cursor before the stream starts, so errors are
	// ordinary responses.
	changed := s.eng.EventsChanged()
	evs, err := s.eng.Events(ctx, p.tenant, torpor.EventFilter{After: since, SandboxID: id, Limit: 1000})
	if err != nil {
		return err
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		for _, ev := range evs {
			data, _ := json.Marshal(ev)
			if _, err := fmt.Fprintf(w, "id: %d\nevent: %s\ndata: %s\n\n", ev.Seq, ev.Type, data); err != nil {
				return nil
			}
			since = ev.Seq
		}
		if err := rc.Flush(); err != nil {
			return nil
		}
		if len(evs) < 1000 {
			select {
			case <-ctx.Done():
				return nil
			case <-changed:
			case <-tick.C:
				if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
					return nil
				}
			}
		}
		changed = s.eng.EventsChanged()
		if evs, err = s.eng.Events(ctx, p.tenant, torpor.EventFilter{After: since, SandboxID: id, Limit: 1000}); err != nil {
			return nil
		}
	}
}
