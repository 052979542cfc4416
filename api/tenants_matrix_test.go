package api_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// routeRequest is a request to one route that tenant A's key would have
// answered with a 2xx on A's objects: the matrix sends it with tenant B's
// key, so that B is refused for the tenancy and for nothing else.
type routeRequest struct {
	query, ctype, body string
	// on is the sandbox of A the request is valid on: "running" (empty),
	// "paused", or "hibernated" (the paused one, hibernated for the
	// control).
	on string
}

const jsonType = "application/json"

// validRequests are the requests that need a query or a body; any other
// route is sent with neither. TestEveryRouteRefusesAnotherTenant checks
// each against tenant A (but those of notTenantScoped), so that a route
// added without one (or with one that is no longer valid) fails there.
var validRequests = map[string]routeRequest{
	"POST /v1/sandboxes":                             {ctype: jsonType, body: `{"template":"base"}`},
	"GET /v1/sandboxes":                              {query: "limit=2&after=" + listCursorBefore},
	"GET /v1/events":                                 {query: "since=0&latest=true"},
	"GET /v1/sandboxes/{id}/events":                  {query: "latest=true"},
	"PATCH /v1/sandboxes/{id}":                       {ctype: jsonType, body: `{"metadata":{"k":"v"}}`},
	"POST /v1/sandboxes/{id}/start":                  {on: "paused"},
	"POST /v1/sandboxes/{id}/resume":                 {on: "paused"},
	"POST /v1/sandboxes/{id}/connect":                {on: "paused"},
	"POST /v1/sandboxes/{id}/archive":                {on: "hibernated"},
	"POST /v1/sandboxes/{id}/checkpoints":            {ctype: jsonType, body: `{"name":"cp-new"}`},
	"POST /v1/sandboxes/{id}/fork":                   {ctype: jsonType, body: `{"count":1}`},
	"POST /v1/sandboxes/{id}/restore":                {ctype: jsonType, body: `{"checkpoint":"` + checkpointNameA + `"}`},
	"POST /v1/sandboxes/{id}/exec":                   {ctype: jsonType, body: `{"cmd":["true"]}`},
	"POST /v1/sandboxes/{id}/code":                   {ctype: jsonType, body: `{"language":"python","code":"print 1"}`},
	"POST /v1/sandboxes/{id}/processes":              {ctype: jsonType, body: `{"cmd":["cat"]}`},
	"POST /v1/sandboxes/{id}/processes/{pid}/stdin":  {ctype: jsonType, body: `{"data":"x"}`},
	"POST /v1/sandboxes/{id}/processes/{pid}/signal": {ctype: jsonType, body: `{"signal":"TERM"}`},
	"GET /v1/sandboxes/{id}/files":                   {query: "path=" + fileAt},
	"PUT /v1/sandboxes/{id}/files":                   {query: "path=/root/new.txt", ctype: "application/octet-stream", body: "new"},
	"DELETE /v1/sandboxes/{id}/files":                {query: "path=" + fileAt},
	"GET /v1/sandboxes/{id}/files/list":              {query: "path=/root"},
	"GET /v1/sandboxes/{id}/files/stat":              {query: "path=" + fileAt},
	"POST /v1/sandboxes/{id}/files/mkdir":            {ctype: jsonType, body: `{"path":"/root/d"}`},
	"POST /v1/sandboxes/{id}/files/rename":           {ctype: jsonType, body: `{"from":"` + fileAt + `","to":"/root/moved.txt"}`},
	"GET /v1/sandboxes/{id}/files/tar":               {query: "path=/root"},
	"PUT /v1/sandboxes/{id}/files/tar":               {query: "path=/root", ctype: "application/x-tar", body: tarOf("x.txt", "x")},
	"POST /v1/webhooks":                              {ctype: jsonType, body: `{"url":"https://hooks.example.com/b"}`},
	"PUT /v1/sandboxes/{id}/wakeups":                 {ctype: jsonType, body: `{"wakeups":[{"wake_schedule":"@daily"}]}`},
	"POST /v1/sandboxes/{id}/wakeups":                {ctype: jsonType, body: `{"wake_schedule":"0 3 * * *","time_zone":"Europe/Paris"}`},
	"PUT /v1/secrets/{name}":                         {ctype: jsonType, body: `{"value":"bravo-or-alpha-value"}`},
	"POST /v1/volumes":                               {ctype: jsonType, body: `{"name":"made-here","size_mib":64}`},
	"PATCH /v1/volumes/{name}":                       {ctype: jsonType, body: `{"size_mib":128}`},
	"GET /v1/volumes/{name}/files":                   {query: "path=" + volumeFileAt},
	"PUT /v1/volumes/{name}/files":                   {query: "path=/new.txt", ctype: "application/octet-stream", body: "new"},
	"DELETE /v1/volumes/{name}/files":                {query: "path=" + volumeFileAt},
	"GET /v1/volumes/{name}/files/list":              {query: "path=/"},
	"GET /v1/volumes/{name}/files/stat":              {query: "path=" + volumeFileAt},
	"POST /v1/volumes/{name}/files/mkdir":            {ctype: jsonType, body: `{"path":"/d"}`},
	"POST /v1/volumes/{name}/files/rename":           {ctype: jsonType, body: `{"from":"` + volumeFileAt + `","to":"/moved.txt"}`},
	"GET /v1/volumes/{name}/files/tar":               {query: "path=/"},
	"PUT /v1/volumes/{name}/files/tar":               {query: "path=/in", ctype: "application/x-tar", body: tarOf("x.txt", "x")},
	"POST /ui/session":                               {ctype: jsonType, body: `{"key":"tpk_not-a-key"}`},
	// E2B's control plane.
	"POST /sandboxes":                       {ctype: jsonType, body: `{"templateID":"base"}`},
	"POST /v2/sandboxes":                    {ctype: jsonType, body: `{"templateID":"base"}`},
	"POST /sandboxes/{id}/resume":           {on: "paused", ctype: jsonType, body: `{"timeout":60}`},
	"POST /sandboxes/{id}/connect":          {ctype: jsonType, body: `{"timeout":60}`},
	"POST /v2/sandboxes/{id}/connect":       {ctype: jsonType, body: `{"timeout":60}`},
	"POST /sandboxes/{id}/timeout":          {ctype: jsonType, body: `{"timeout":60}`},
	"POST /sandboxes/{id}/refreshes":        {ctype: jsonType, body: `{"duration":60}`},
	"POST /sandboxes/{id}/snapshots":        {ctype: jsonType, body: `{"name":"e2b-snap"}`},
	"POST /secrets":                         {ctype: jsonType, body: `{"name":"e2b-made","value":"bravo-or-alpha-value"}`},
	"POST /secrets/{secretID}":              {ctype: jsonType, body: `{"value":"bravo-or-alpha-value"}`},
	"POST /volumes":                         {ctype: jsonType, body: `{"name":"e2b-made"}`},
	"GET /volumecontent/{volumeID}/dir":     {query: "path=/"},
	"POST /volumecontent/{volumeID}/dir":    {query: "path=/e2b-dir"},
	"GET /volumecontent/{volumeID}/path":    {query: "path=" + volumeFileAt},
	"PATCH /volumecontent/{volumeID}/path":  {query: "path=" + volumeFileAt, ctype: jsonType, body: `{"mode":420}`},
	"DELETE /volumecontent/{volumeID}/path": {query: "path=" + volumeFileAt},
	"GET /volumecontent/{volumeID}/file":    {query: "path=" + volumeFileAt},
	"PUT /volumecontent/{volumeID}/file":    {query: "path=/e2b.txt", ctype: "application/octet-stream", body: "new"},
	// The admin's routes, with bodies valid for the admin key.
	"POST /v1/templates":       {ctype: jsonType, body: `{"name":"imported","rootfs":"/nonexistent"}`},
	"POST /v1/templates/build": {ctype: jsonType, body: `{"name":"built"}`},
	"POST /v1/tenants":         {ctype: jsonType, body: `{"name":"charlie"}`},
	"PATCH /v1/tenants/{name}": {ctype: jsonType, body: `{"quota":{"max_sandboxes":5}}`},
	"PUT /v1/pools/{template}": {ctype: jsonType, body: `{"size":0}`},
	"POST /v1/keys":            {ctype: jsonType, body: `{"tenant":"charlie"}`},
}

// listCursorBefore is a GET /v1/sandboxes?after= cursor of a position
// before every sandbox (created at the epoch, id "sb_").
const listCursorBefore = "MDpzYl8"

// notTenantScoped are the routes whose answer is not about a tenant's
// objects, with the reason: the matrix still sends them with tenant B's
// key and checks that the answer is the same whether A's objects exist or
// not and that nothing of A changed, but it does not ask tenant A's key
// for a 2xx.
var notTenantScoped = map[string]string{
	"GET /healthz":                "unauthenticated liveness check: the same answer for everyone",
	"GET /metrics":                "unauthenticated aggregate figures (no ids); not mounted in the test listener",
	"GET /v1/tenants":             "admin only: a tenant key is refused with 403 before anything is read",
	"POST /v1/tenants":            "admin only: a tenant key is refused with 403 before anything is read",
	"PATCH /v1/tenants/{name}":    "admin only: a tenant key is refused with 403 before anything is read",
	"POST /v1/keys":               "admin only: a tenant key is refused with 403 before anything is read",
	"POST /v1/templates":          "admin only: a tenant key is refused with 403 before anything is read",
	"POST /v1/templates/build":    "admin only: a tenant key is refused with 403 before anything is read",
	"DELETE /v1/templates/{name}": "admin only: a tenant key is refused with 403 before anything is read",
	"PUT /v1/pools/{template}":    "admin only: a tenant key is refused with 403 before anything is read",
	"GET /v1/pools":               "the node's warm pools: sizes and counts of templates, aggregate like /metrics, with no sandbox ids",
	"POST /ui/session":            "signs in with the key in its body (none valid here): the answer is about that key only",
	"GET /ui/session":             "describes the session of the caller's own cookie (none here), never a tenant's objects",
	"DELETE /ui/session":          "ends the session of the caller's own cookie (none here), never a tenant's objects",
	"GET /ui":                     "redirects to the dashboard's page: the same answer for everyone",
	"GET /ui/":                    "the dashboard's static files: the same for everyone",
	// A fleet's nodes are the operator's.
	"GET /v1/nodes":                 "admin only: a tenant key is refused with 403 before anything is read",
	"POST /v1/nodes/{name}/drain":   "admin only: a tenant key is refused with 403 before anything is read",
	"POST /v1/nodes/{name}/undrain": "admin only: a tenant key is refused with 403 before anything is read",
}

// placeholders say what fills each path parameter, by the segment before
// it: an object tenant A owns (a sandbox, its process, a webhook), a
// shared one (a template) or A's tenant itself (an admin's route). A
// route with a parameter not named here fails the matrix until it is.
var placeholders = map[string]string{
	"sandboxes/{id}":         "sandbox",
	"processes/{pid}":        "process",
	"webhooks/{id}":          "webhook",
	"wakeups/{wakeup}":       "wakeup",
	"checkpoints/{name}":     "checkpoint",
	"templates/{templateID}": "snapshot",
	"secrets/{name}":         "secret",
	"secrets/{secretID}":     "secret",
	"volumes/{name}":         "volume",
	// E2B's volume routes take the volume's name as well as its id.
	"volumes/{volumeID}":       "volume",
	"volumecontent/{volumeID}": "volume",
	"templates/{name}":         "template",
	"pools/{template}":         "template",
	"nodes/{name}":             "node",
	"tenants/{name}":           "tenant",
}

// snapshotA is the E2B snapshot id of the checkpoint of A's running
// sandbox (e2b/snapshots.go).
func snapshotA(running string) string { return "snap-" + running + "-" + checkpointNameA }

// fillPattern substitutes the path parameters of pattern with vals (by
// kind) and returns the path and the kinds it holds.
func fillPattern(pattern string, vals map[string]string) (string, []string, error) {
	segs := strings.Split(pattern, "/")
	var kinds []string
	for i, s := range segs {
		if !strings.HasPrefix(s, "{") {
			continue
		}
		key := strings.TrimSuffix(s, "...}")
		key = strings.TrimSuffix(key, "}") + "}"
		if i > 0 {
			key = segs[i-1] + "/" + key
		}
		kind, ok := placeholders[key]
		if !ok {
			return "", nil, fmt.Errorf("the path parameter %s is not in placeholders", key)
		}
		segs[i] = vals[kind]
		kinds = append(kinds, kind)
	}
	return strings.Join(segs, "/"), kinds, nil
}

// splitRoute splits "METHOD PATTERN".
func splitRoute(rt string) (method, pattern string) {
	method, pattern, _ = strings.Cut(rt, " ")
	return method, pattern
}

// TestValidRequestsNameServedRoutes: the tables of the matrix name only
// routes the listener serves, so that a removed or renamed route does not
// leave a stale entry behind.
func TestValidRequestsNameServedRoutes(t *testing.T) {
	served := routeList()
	for rt := range validRequests {
		if !slices.Contains(served, rt) {
			t.Errorf("validRequests names %q, which is not served", rt)
		}
	}
	for rt := range notTenantScoped {
		if !slices.Contains(served, rt) {
			t.Errorf("notTenantScoped names %q, which is not served", rt)
		}
	}
}

// TestEveryRouteRefusesAnotherTenant sends every route of the API
// listener (the native table and E2B's), derived from the route tables
// themselves, with tenant B's key on tenant A's sandboxes (running,
// paused, terminated), process, webhook and the shared template. For
// each: B's answer is the answer B gets from a listener where A's objects
// do not exist (so an owned id is a 404 exactly as an unknown one), holds
// none of A's ids, tokens, metadata, env, file contents or URLs, touched
// none of A's instances on the host, and left A's rows in the store, A's
// instances, processes and files as they were. Each request is also sent
// with A's own key on A's objects (made again after a request that
// changed them), which must answer 2xx, so that the matrix proves the
// tenancy is what refused B. Every native route is sent by B a second
// time with ?tenant=A (docs/api.md, "Acting as a tenant"): where a route
// takes tenant (takesTenant) B is refused with 403, elsewhere with 400,
// and the same checks hold: B learns nothing of A and changes nothing.
func TestEveryRouteRefusesAnotherTenant(t *testing.T) { everyRouteRefusesAnotherTenant(t, false) }

// TestEveryRouteRefusesAnotherTenantByCookie is the same matrix on the
// native routes (/v1), with B and A authenticated by their dashboard
// sessions (the cookie and its CSRF token) instead of their keys: a
// session stands for its key, no more.
func TestEveryRouteRefusesAnotherTenantByCookie(t *testing.T) {
	everyRouteRefusesAnotherTenant(t, true)
}

func everyRouteRefusesAnotherTenant(t *testing.T, byCookie bool) {
	keys := newPrincipals()
	t.Cleanup(keys.remove)
	withA := newListener(t, t.TempDir(), keys)
	t.Cleanup(withA.close)
	a := seedA(t, withA)
	withoutA := newListener(t, t.TempDir(), keys)
	t.Cleanup(withoutA.close)
	aIDs := []string{a.running.ID, a.paused.ID, a.gone.ID}

	stateOfA := func() []string { return stateOf(t, withA, aIDs) }
	before := stateOfA()

	sandboxes := []struct {
		name string
		id   string
	}{{"running", a.running.ID}, {"paused", a.paused.ID}, {"terminated", a.gone.ID}}
	routes := routeList()
	if byCookie {
		// E2B's API takes no cookie, and the session routes are the
		// session's own business (TestSession*).
		routes = slices.DeleteFunc(routes, func(rt string) bool {
			_, pattern := splitRoute(rt)
			return !strings.HasPrefix(pattern, "/v1/")
		})
		withA.signIn(t, keys.b)
		withoutA.signIn(t, keys.b)
	}
	sent := 0
	for _, rt := range routes {
		method, pattern := splitRoute(rt)
		req := validRequests[rt]
		for _, sb := range sandboxes {
			vals := map[string]string{"sandbox": sb.id, "process": strconv.Itoa(a.pid), "webhook": a.webhook.ID, "template": "base", "tenant": tenantA, "node": "node-a", "secret": secretNameA, "wakeup": a.wakeup, "volume": volumeNameA, "checkpoint": checkpointNameA, "snapshot": snapshotA(a.running.ID)}
			path, kinds, err := fillPattern(pattern, vals)
			if err != nil {
				t.Fatalf("%s: %v", rt, err)
			}
			if !slices.Contains(kinds, "sandbox") && sb.name != "running" {
				continue
			}
			for _, naming := range []bool{false, true} {
				if naming && !strings.HasPrefix(pattern, "/v1/") {
					continue
				}
				target := path
				query := req.query
				if naming {
					// B names A's tenant (docs/api.md, "Acting as a
					// tenant"): a tenant key is refused before anything
					// is read.
					query = strings.TrimPrefix(query+"&tenant="+tenantA, "&")
				}
				if query != "" {
					target += "?" + query
				}
				name := rt
				if slices.Contains(kinds, "sandbox") {
					name += " on A's " + sb.name + " sandbox"
				}
				if naming {
					name += " with tenant=" + tenantA
				}
				withA.rt.watch(aIDs...)
				got := withA.do(keys.b, method, target, req.ctype, []byte(req.body))
				touched := withA.rt.noted()
				want := withoutA.do(keys.b, method, target, req.ctype, []byte(req.body))
				sent += 2
				raw := got.Body.String() + fmt.Sprint(got.Header())
				for _, s := range a.secrets {
					// The ids the request names may come back (as in "no
					// sandbox X"): B knew them already.
					if strings.Contains(raw, s) && !strings.Contains(target+req.body, s) {
						t.Errorf("%s: B's answer holds A's %q: %d %s", name, s, got.Code, got.Body)
					}
				}
				if got.Code != want.Code || jsonShape(got.Body.Bytes()) != jsonShape(want.Body.Bytes()) {
					t.Errorf("%s: B's answer depends on A's objects: %d %s; without them: %d %s", name, got.Code, got.Body, want.Code, want.Body)
				}
				owned := slices.Contains(kinds, "sandbox") || slices.Contains(kinds, "webhook") || slices.Contains(kinds, "volume")
				_, exempt := notTenantScoped[rt]
				switch {
				case naming && takesTenant(method, pattern) && got.Code != 403:
					t.Errorf("%s: B's answer %d %s, want 403 (a tenant key acts only as its own tenant)", name, got.Code, got.Body)
				case naming && !takesTenant(method, pattern) && got.Code != 403 && got.Code != 400:
					t.Errorf("%s: B's answer %d %s, want 400 (no tenant here) or 403 (admin only)", name, got.Code, got.Body)
				case naming:
				case exempt && strings.HasPrefix(notTenantScoped[rt], "admin only"):
					if got.Code != 403 {
						t.Errorf("%s: B's answer %d %s, want 403 (admin only)", name, got.Code, got.Body)
					}
				case owned && got.Code != 404:
					t.Errorf("%s: B's answer %d %s, want 404 (not B's)", name, got.Code, got.Body)
				case got.Code >= 500:
					t.Errorf("%s: B's answer %d %s", name, got.Code, got.Body)
				}
				if len(touched) > 0 {
					t.Errorf("%s: B's request reached A's instances: %v", name, touched)
				}
				if after := stateOfA(); !slices.Equal(before, after) {
					t.Errorf("%s: B's request changed A's state:\n%s", name, lineDiff(before, after))
					before = after
				}
			}
		}
	}

	// The control: each request is valid for A, on objects of A made
	// again after a request that changed them.
	controls := 0
	l := newListener(t, t.TempDir(), keys)
	t.Cleanup(l.close)
	if byCookie {
		l.signIn(t, keys.a)
	}
	var own objectsA
	var pristine []string
	for _, rt := range routes {
		if _, exempt := notTenantScoped[rt]; exempt {
			continue
		}
		if pristine == nil {
			own = seedA(t, l)
			pristine = stateOf(t, l, []string{own.running.ID, own.paused.ID, own.gone.ID})
		}
		method, pattern := splitRoute(rt)
		req := validRequests[rt]
		id := own.running.ID
		switch req.on {
		case "paused":
			id = own.paused.ID
		case "hibernated":
			id = own.paused.ID
			if _, err := l.eng.Hibernate(context.Background(), tenantA, id); err != nil {
				t.Fatalf("%s: hibernating A's sandbox for the control: %v", rt, err)
			}
			pristine = nil
		}
		path, _, _ := fillPattern(pattern, map[string]string{"sandbox": id, "process": strconv.Itoa(own.pid), "webhook": own.webhook.ID, "template": "base", "tenant": tenantA, "node": "node-a", "secret": secretNameA, "wakeup": own.wakeup, "volume": volumeNameA, "checkpoint": checkpointNameA, "snapshot": snapshotA(own.running.ID)})
		if req.query != "" {
			path += "?" + req.query
		}
		got := l.do(keys.a, method, path, req.ctype, []byte(req.body))
		controls++
		if got.Code < 200 || got.Code > 299 {
			t.Errorf("%s: A's own request %s answered %d %s: give the route a request valid for A in validRequests (or a reason in notTenantScoped)", rt, path, got.Code, got.Body)
		}
		if !slices.Equal(pristine, stateOf(t, l, []string{own.running.ID, own.paused.ID, own.gone.ID})) {
			pristine = nil
		}
	}
	t.Logf("%d routes, %d requests with B's key (to listeners with and without A's objects), %d controls with A's key", len(routes), sent, controls)
}

// takesTenant tells whether a native route takes ?tenant= (an admin
// names the tenant it acts as): a sandbox's routes, the list, the event
// stream and the usage report. Elsewhere the parameter is refused as
// invalid.
func takesTenant(method, pattern string) bool {
	switch {
	case strings.HasPrefix(pattern, "/v1/sandboxes/") || strings.HasPrefix(pattern, "/v1/secrets") || strings.HasPrefix(pattern, "/v1/volumes"):
		return true
	case method == "GET" && (pattern == "/v1/sandboxes" || pattern == "/v1/events" || pattern == "/v1/usage"):
		return true
	}
	return false
}

// stateOf is what a listener holds of tenant A: every row of the store
// but tenant B's and those of B's sandboxes (B's accepted requests change
// B's rows), and the host's instances, processes and files of A's
// sandboxes ids.
func stateOf(t testing.TB, l *listener, ids []string) []string {
	rows := l.dumpDB(t)
	var theirs []string
	for _, r := range rows {
		if strings.HasPrefix(r, "sandboxes ") && strings.Contains(r, " tenant="+tenantB+" ") {
			id, _, _ := strings.Cut(strings.TrimPrefix(r, "sandboxes id="), " ")
			theirs = append(theirs, id)
		}
		// B's volumes: their data on the host is named by their ids.
		if strings.HasPrefix(r, "volumes ") && strings.Contains(r, "tenant="+tenantB) {
			if _, rest, ok := strings.Cut(r, " id="); ok {
				id, _, _ := strings.Cut(rest, " ")
				theirs = append(theirs, id)
			}
		}
	}
	mine := rows[:0]
	for _, r := range rows {
		if !strings.Contains(r, tenantB) && !slices.ContainsFunc(theirs, func(id string) bool { return strings.Contains(r, id) }) {
			mine = append(mine, r)
		}
	}
	for _, h := range l.hostState(t, ids...) {
		if !slices.ContainsFunc(theirs, func(id string) bool { return strings.HasPrefix(h, "file .volumes/"+id) }) {
			mine = append(mine, h)
		}
	}
	return mine
}

// lineDiff lists the lines only in before (-) or only in after (+).
func lineDiff(before, after []string) string {
	var b strings.Builder
	for _, l := range before {
		if !slices.Contains(after, l) {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range after {
		if !slices.Contains(before, l) {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	return b.String()
}
