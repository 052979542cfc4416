package e2b

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
)

// Pages of GET /v2/sandboxes: 100 sandboxes at most, 100 by default.
const maxLimit = 100

// listQuery is what GET /v2/sandboxes asks for.
type listQuery struct {
	states       []string
	metadata     map[string]string
	template     string
	startedAfter time.Time
	asc          bool
	limit        int
	after        *cursor
}

// cursor is where a page ends: the last sandbox's start and id.
type cursor struct {
	at time.Time
	id string
}

func (c cursor) token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.at.UnixMicro(), 10) + "." + c.id))
}

func parseCursor(s string) (*cursor, error) {
	bad := torpor.Invalid("nextToken", "nextToken is not one this server gave")
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, bad
	}
	us, id, ok := strings.Cut(string(raw), ".")
	n, err := strconv.ParseInt(us, 10, 64)
	if !ok || err != nil || !torpor.ValidID(id) {
		return nil, bad
	}
	return &cursor{at: time.UnixMicro(n).UTC(), id: id}, nil
}

// parseMetadataQuery reads E2B's metadata filter. The SDK encodes each key
// and value, joins them as a query string and sends that as one query
// parameter, so once the parameter is read the text is still encoded
// twice: once as a whole, once per key and value.
func parseMetadataQuery(s string) (map[string]string, error) {
	bad := func(format string, args ...any) error { return torpor.Invalid("metadata", format, args...) }
	whole, err := url.QueryUnescape(s)
	if err != nil {
		return nil, bad("metadata is not URL-encoded (key=value&key=value)")
	}
	out := map[string]string{}
	for _, pair := range strings.Split(whole, "&") {
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || strings.Contains(v, "=") {
			return nil, bad("metadata must be key=value pairs joined by &")
		}
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(v)
		if err1 != nil || err2 != nil || key == "" {
			return nil, bad("metadata key %q or its value is not URL-encoded", k)
		}
		out[key] = val
	}
	if err := torpor.ValidateMetadata("metadata", out); err != nil {
		return nil, err
	}
	return out, nil
}

func parseListQuery(q url.Values) (listQuery, error) {
	lq := listQuery{limit: maxLimit}
	for _, v := range q["state"] {
		for _, s := range strings.Split(v, ",") {
			switch s {
			case "":
			case stateRunning, statePaused:
				lq.states = append(lq.states, s)
			default:
				return lq, torpor.Invalid("state", "state must be running or paused, not %q", s)
			}
		}
	}
	if v := q.Get("metadata"); v != "" {
		md, err := parseMetadataQuery(v)
		if err != nil {
			return lq, err
		}
		lq.metadata = md
	}
	lq.template = q.Get("template")
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return lq, torpor.Invalid("startedAfter", "startedAfter must be an RFC 3339 time")
		}
		lq.startedAfter = t
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		lq.asc = true
	default:
		return lq, torpor.Invalid("order", "order must be asc or desc")
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return lq, torpor.Invalid("limit", "limit must be between 1 and %d", maxLimit)
		}
		lq.limit = n
	}
	if v := q.Get("nextToken"); v != "" {
		c, err := parseCursor(v)
		if err != nil {
			return lq, err
		}
		lq.after = c
	}
	return lq, nil
}

// list returns tenant's sandboxes that match lq, in its order, all of them.
func (a *API) list(r *http.Request, tenant string, lq listQuery) ([]*torpor.Sandbox, error) {
	states := lq.states
	if len(states) == 0 {
		states = []string{stateRunning, statePaused}
	}
	var f torpor.SandboxFilter
	for _, s := range states {
		f.States = append(f.States, torporStates(s)...)
	}
	f.Metadata = lq.metadata
	sbs, err := a.eng.List(r.Context(), tenant, f)
	if err != nil {
		return nil, err
	}
	kept := sbs[:0]
	for _, sb := range sbs {
		if lq.template != "" && sb.Template != lq.template && a.alias(sb.Template) != lq.template {
			continue
		}
		if !lq.startedAfter.IsZero() && sb.CreatedAt.Before(lq.startedAfter) {
			continue
		}
		kept = append(kept, sb)
	}
	// Newest first (by start, then id), or the exact reverse.
	before := func(x, y *torpor.Sandbox) bool {
		xt, yt := x.CreatedAt.Truncate(time.Microsecond), y.CreatedAt.Truncate(time.Microsecond)
		if !xt.Equal(yt) {
			return xt.After(yt) != lq.asc
		}
		return (x.ID < y.ID) != lq.asc
	}
	sort.Slice(kept, func(i, j int) bool { return before(kept[i], kept[j]) })
	if c := lq.after; c != nil {
		mark := &torpor.Sandbox{ID: c.id, CreatedAt: c.at}
		i := sort.Search(len(kept), func(i int) bool { return before(mark, kept[i]) })
		kept = kept[i:]
	}
	return kept, nil
}

func (a *API) listV2(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	lq, err := parseListQuery(r.URL.Query())
	if err != nil {
		return err
	}
	sbs, err := a.list(r, tenant, lq)
	if err != nil {
		return err
	}
	if len(sbs) > lq.limit {
		sbs = sbs[:lq.limit]
		last := sbs[len(sbs)-1]
		w.Header().Set("X-Next-Token", cursor{at: last.CreatedAt, id: last.ID}.token())
	}
	out := make([]listedSandbox, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, a.listed(sb))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listV1 is the deprecated GET /sandboxes: the running sandboxes, with the
// metadata filter only.
func (a *API) listV1(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	lq := listQuery{states: []string{stateRunning}}
	if v := r.URL.Query().Get("metadata"); v != "" {
		md, err := parseMetadataQuery(v)
		if err != nil {
			return err
		}
		lq.metadata = md
	}
	sbs, err := a.list(r, tenant, lq)
	if err != nil {
		return err
	}
	out := make([]listedSandbox, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, a.listed(sb))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
