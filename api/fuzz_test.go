package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// fuzzWorld is a listener with tenant A's objects (seedA) and tenant B's
// running sandbox and webhook, and the state it started in.
type fuzzWorld struct {
	l        *listener
	dir      string
	a        objectsA
	b        *torpor.Sandbox
	bHook    string
	pristine []string
	// history lists the last requests this world answered without a
	// change, for the report of a change found later.
	history []string
}

func newFuzzWorld(t testing.TB, base string, keys *principals) *fuzzWorld {
	t.Helper()
	dir, err := os.MkdirTemp(base, "world")
	if err != nil {
		t.Fatal(err)
	}
	w := &fuzzWorld{l: newListener(t, dir, keys), dir: dir}
	w.a = seedA(t, w.l)
	ctx := context.Background()
	if w.b, err = w.l.eng.Create(ctx, tenantB, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"owner": "bravo"}}); err != nil {
		t.Fatal(err)
	}
	w.l.makeRoot(t, w.b.ID)
	hook := torpor.Webhook{ID: torpor.NewID("wh_", 16), Tenant: tenantB, URL: "https://hooks.example.com/bravo", Secret: "whsec_" + torpor.NewID("", 40), CreatedAt: listenerEpoch}
	if err := w.l.st.CreateWebhook(ctx, hook); err != nil {
		t.Fatal(err)
	}
	w.bHook = hook.ID
	if _, err := w.l.eng.SetSecret(ctx, tenantB, secretNameB, []byte("bravo-secret-value")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.l.eng.CreateVolume(ctx, tenantB, volumeNameB, 32); err != nil {
		t.Fatal(err)
	}
	w.pristine = w.state(t)
	return w
}

func (w *fuzzWorld) close() {
	w.l.close()
	os.RemoveAll(w.dir)
}

// version is a sandbox row's version column.
var version = regexp.MustCompile(` version=\d+`)

// state is everything the store holds and the host's instances,
// processes and files. A sandbox row's version is left out: an operation
// refused inside the sandbox (a missing file, an exited process) was an
// attempt to use it, which the engine records as activity
// (lifecycle.Engine.operate), bumping the version; on the stopped clock
// the activity time itself stays, so any other change shows.
func (w *fuzzWorld) state(t testing.TB) []string {
	rows := w.l.dumpDB(t)
	for i, r := range rows {
		rows[i] = version.ReplaceAllString(r, "")
	}
	return append(rows, w.l.hostState(t, w.a.running.ID, w.a.paused.ID, w.a.gone.ID, w.b.ID)...)
}

// secretNameB is tenant B's secret in a fuzz world, volumeNameB its
// volume.
const (
	secretNameB = "bravo-db"
	volumeNameB = "bravo-vol"
)

// fuzzCallers are the keys a fuzzed request may carry: A's, the admin's,
// none, one that is no key.
func fuzzCallers(k *principals) []string { return []string{k.a, k.admin, "", "tpk_not-a-key"} }

// fuzzTypes are the content types a fuzzed request may declare, after
// the route's own (index 0).
var fuzzTypes = []string{"", "", "application/json; charset=utf-8", "text/plain", "multipart/form-data; boundary=x", "application/x-tar"}

// fuzzRequest builds the request of one input: the route's pattern with
// its parameters filled as who says (0: A's running sandbox and the rest
// of A's objects, 1: A's paused sandbox, 2: tenant B's objects, 3: seg),
// the raw query and the body as they are.
func (w *fuzzWorld) fuzzRequest(rt string, who, caller, ctype uint8, seg, query string, body []byte) (req *http.Request, sandbox string, err error) {
	method, pattern := splitRoute(rt)
	vals := map[string]string{"sandbox": w.a.running.ID, "process": strconv.Itoa(w.a.pid), "webhook": w.a.webhook.ID, "template": "base", "tenant": tenantA, "node": "node-a", "secret": secretNameA, "volume": volumeNameA, "checkpoint": checkpointNameA, "snapshot": snapshotA(w.a.running.ID)}
	switch who % 4 {
	case 1:
		vals["sandbox"] = w.a.paused.ID
	case 2:
		vals["sandbox"], vals["webhook"], vals["tenant"], vals["secret"], vals["volume"] = w.b.ID, w.bHook, tenantB, secretNameB, volumeNameB
	case 3:
		for k := range vals {
			vals[k] = seg
		}
	}
	path, _, err := fillPattern(pattern, vals)
	if err != nil {
		return nil, "", err
	}
	escaped, _, _ := fillPattern(pattern, escapeAll(vals))
	u := &url.URL{Path: path, RawPath: escaped, RawQuery: query}
	req = &http.Request{Method: method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Host: "api.test",
		Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)),
		RemoteAddr: "192.0.2.1:4321", RequestURI: u.RequestURI()}
	if key := fuzzCallers(w.l.keys)[int(caller)%4]; key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	ct := validRequests[rt].ctype
	if i := int(ctype) % len(fuzzTypes); i > 0 {
		ct = fuzzTypes[i]
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	return req, vals["sandbox"], nil
}

func escapeAll(vals map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range vals {
		out[k] = url.PathEscape(v)
	}
	return out
}

// readsTheHost tells whether an admin's template import would read a
// host path or a registry: importing is the admin's right, and such an
// input would copy the fuzzing machine's files, so it is not sent.
func readsTheHost(rt string, caller uint8, body []byte) bool {
	if rt != "POST /v1/templates" || caller%4 != 1 {
		return false
	}
	var req torpor.TemplateImportRequest
	return json.Unmarshal(body, &req) == nil && req.Validate() == nil
}

// FuzzAPIRequest sends fuzzed requests to every route of the API listener
// (the native table and E2B's, as TestEveryRouteRefusesAnotherTenant
// derives them): any route, with its parameters naming the caller's own
// objects, another tenant's or a fuzzed segment, any query, any body, any
// content type, any of four callers. The answer is never a 5xx nor a
// panic, tenant A's key never reaches tenant B's sandbox or webhook, and
// a refused request (4xx) changes nothing the store or the host holds,
// but for the one refusal documented to keep changes (partialExtraction).
// A request that changed something gets a fresh world for the next
// input.
func FuzzAPIRequest(f *testing.F) {
	routes := routeList()
	index := func(rt string) uint16 {
		i := slices.Index(routes, rt)
		if i < 0 {
			f.Fatalf("no route %q", rt)
		}
		return uint16(i)
	}
	// Every route as A would send it.
	for i, rt := range routes {
		req := validRequests[rt]
		f.Add(uint16(i), uint8(0), uint8(0), uint8(0), "", req.query, []byte(req.body))
		if req.on == "paused" {
			f.Add(uint16(i), uint8(1), uint8(0), uint8(0), "", req.query, []byte(req.body))
		}
	}
	// Each field of each route's valid body and query, in turn made
	// hostile (bodyVariants, queryVariants), with A's key or, on the
	// routes that are not a tenant's, the admin's.
	for i, rt := range routes {
		req := validRequests[rt]
		caller := uint8(0)
		if _, exempt := notTenantScoped[rt]; exempt {
			caller = 1
		}
		if req.ctype == jsonType {
			for _, body := range bodyVariants(req.body) {
				f.Add(uint16(i), uint8(0), caller, uint8(0), "", req.query, []byte(body))
			}
		}
		for _, q := range queryVariants(req.query) {
			f.Add(uint16(i), uint8(0), caller, uint8(0), "", q, []byte(req.body))
		}
	}
	// The hostile bodies, each on both creates and on two more of the
	// routes that read a JSON body, in turn.
	var jsonRoutes []uint16
	for i, rt := range routes {
		if validRequests[rt].ctype == jsonType && !slices.Contains([]string{"POST /v1/sandboxes", "POST /v2/sandboxes"}, rt) {
			jsonRoutes = append(jsonRoutes, uint16(i))
		}
	}
	for i, body := range hostileBodies {
		for _, r := range []uint16{index("POST /v1/sandboxes"), index("POST /v2/sandboxes"), jsonRoutes[(2*i)%len(jsonRoutes)], jsonRoutes[(2*i+1)%len(jsonRoutes)]} {
			f.Add(r, uint8(0), uint8(0), uint8(0), "", "", []byte(body))
		}
	}
	// The hostile queries, each on two of the routes that read one, in
	// turn.
	queryRoutes := []string{"GET /v1/sandboxes", "GET /v1/events", "GET /v1/usage", "GET /v1/sandboxes/{id}/files",
		"PUT /v1/sandboxes/{id}/files", "DELETE /v1/sandboxes/{id}/files", "GET /v1/sandboxes/{id}/files/list",
		"GET /v1/sandboxes/{id}/files/tar", "PUT /v1/sandboxes/{id}/files/tar", "GET /v1/sandboxes/{id}/processes/{pid}/output",
		"GET /v2/sandboxes", "GET /sandboxes", "GET /sandboxes/{id}/metrics",
		"GET /v1/volumes/{name}/files", "PUT /v1/volumes/{name}/files", "GET /v1/volumes/{name}/files/list", "PUT /v1/volumes/{name}/files/tar"}
	for i, q := range hostileQueries {
		for _, rt := range []string{queryRoutes[(2*i)%len(queryRoutes)], queryRoutes[(2*i+1)%len(queryRoutes)]} {
			f.Add(index(rt), uint8(0), uint8(0), uint8(0), "", q, []byte(validRequests[rt].body))
		}
	}
	// Hostile path parameters, each on two routes of the kinds that take
	// one, in turn.
	segRoutes := []string{"GET /v1/sandboxes/{id}", "POST /v1/sandboxes/{id}/exec", "GET /v1/sandboxes/{id}/processes/{pid}/output",
		"DELETE /v1/webhooks/{id}", "GET /v1/secrets/{name}", "PUT /v1/secrets/{name}", "DELETE /v1/secrets/{name}", "GET /v1/templates/{name}", "DELETE /v1/templates/{name}", "PATCH /v1/tenants/{name}",
		"GET /sandboxes/{id}", "POST /sandboxes/{id}/timeout", "GET /v1/volumes/{name}", "PATCH /v1/volumes/{name}", "DELETE /v1/volumes/{name}",
		"GET /v1/volumes/{name}/files", "GET /v1/sandboxes/{id}/checkpoints/{name}", "DELETE /v1/sandboxes/{id}/checkpoints/{name}"}
	for i, seg := range hostileSegments {
		for _, rt := range []string{segRoutes[(2*i)%len(segRoutes)], segRoutes[(2*i+1)%len(segRoutes)]} {
			caller := uint8(0)
			if strings.Contains(rt, "templates") || strings.Contains(rt, "tenants") {
				caller = 1
			}
			req := validRequests[rt]
			f.Add(index(rt), uint8(3), caller, uint8(0), seg, req.query, []byte(req.body))
		}
	}
	// The admin routes' hostile bodies, with the admin's key.
	for _, c := range hostileAdmin {
		f.Add(index(c.route), uint8(0), uint8(1), uint8(0), "", "", []byte(c.body))
	}
	// Checkpoints, fork and restore (docs/fork.md), with the tenant's key.
	for _, c := range hostileCheckpoints {
		f.Add(index(c.route), uint8(0), uint8(0), uint8(0), "", "", []byte(c.body))
	}
	// Uploads: tars that climb out, are cut short or are no tar, files
	// with a NUL or a bad mode.
	for _, c := range []struct{ rt, query, body string }{
		{"PUT /v1/sandboxes/{id}/files/tar", "path=/root", tarOf("../../../etc/evil", "x")},
		{"PUT /v1/sandboxes/{id}/files/tar", "path=/root", tarOf("/etc/evil", "x")},
		{"PUT /v1/sandboxes/{id}/files/tar", "path=/root", tarOf("a.txt", "hello")[:700]},
		{"PUT /v1/sandboxes/{id}/files/tar", "path=/root", strings.Repeat("\x00", 2048)},
		// Found by this target: a first block that is no tar header, and a
		// body shorter than one, made the target directory, then 400.
		{"PUT /v1/sandboxes/{id}/files/tar", "path=/root/new", "x.txt" + strings.Repeat("\x00", 507)},
		{"PUT /v1/sandboxes/{id}/files/tar", "path=/root/new", "0"},
		{"PUT /v1/sandboxes/{id}/files/tar", "path=/root/new", tarOf("x.txt", "x")[:1024] + "x.txt" + strings.Repeat("\x00", 507)},
		{"PUT /v1/sandboxes/{id}/files", "path=/root/a%00b", "x"},
		{"PUT /v1/sandboxes/{id}/files", "path=/root/new.txt&mode=-1", "x"},
		{"PUT /v1/sandboxes/{id}/files", "path=/root/new.txt&mode=99999999999", "x"},
		{"PUT /v1/volumes/{name}/files/tar", "path=/", tarOf("../../../etc/evil", "x")},
		{"PUT /v1/volumes/{name}/files/tar", "path=/", tarOf("/../../evil", "x")},
		{"GET /v1/volumes/{name}/files", "path=/../../../etc/passwd", ""},
		{"PUT /v1/volumes/{name}/files", "path=/../escape.txt", "x"},
	} {
		f.Add(index(c.rt), uint8(0), uint8(0), uint8(0), "", c.query, []byte(c.body))
	}
	// The other tenant's objects, and no key.
	for i := range routes {
		f.Add(uint16(i), uint8(2), uint8(0), uint8(0), "", validRequests[routes[i]].query, []byte(validRequests[routes[i]].body))
	}
	f.Add(index("GET /v1/sandboxes"), uint8(0), uint8(2), uint8(0), "", "", []byte(nil))

	keys := newPrincipals()
	f.Cleanup(keys.remove)
	base := f.TempDir()
	var w *fuzzWorld
	f.Cleanup(func() {
		if w != nil {
			w.close()
		}
	})
	f.Fuzz(func(t *testing.T, route uint16, who, caller, ctype uint8, seg, query string, body []byte) {
		if w == nil {
			w = newFuzzWorld(t, base, keys)
		}
		// A failed input may have left its change: the next one (the
		// minimizer's, say) gets a fresh world.
		defer func() {
			if t.Failed() {
				w.close()
				w = nil
			}
		}()
		rt := routes[int(route)%len(routes)]
		if readsTheHost(rt, caller, body) {
			return
		}
		if os.Geteuid() != 0 && (rt == "POST /v1/templates/build" || rt == "POST /v1/templates") {
			// A template that gets as far as its layer sets the owners of
			// its files, which needs root (TestTemplateImportUseAndDelete
			// skips so too); without root these inputs are not fuzzed.
			return
		}
		req, sandbox, err := w.fuzzRequest(rt, who, caller, ctype, seg, query, body)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rec := httptest.NewRecorder()
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("%s %s: panic %v", req.Method, req.URL, p)
				}
			}()
			w.l.h.ServeHTTP(rec, req.WithContext(ctx))
		}()
		desc := fmt.Sprintf("%s %s (%s) %q", req.Method, req.URL.String(), req.Header.Get("Content-Type"), truncate(body, 200))
		if rec.Code >= 500 {
			t.Fatalf("%s: %d %s", desc, rec.Code, rec.Body)
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: took more than 10 s", desc)
		}
		_, pattern := splitRoute(rt)
		_, kinds, _ := fillPattern(pattern, nil)
		owned := slices.Contains(kinds, "sandbox") || slices.Contains(kinds, "webhook") || slices.Contains(kinds, "volume")
		if who%4 == 2 && caller%4 == 0 && owned && rec.Code < 400 {
			t.Fatalf("%s: tenant A's key on tenant B's object answered %d %s", desc, rec.Code, rec.Body)
		}
		after := w.state(t)
		if slices.Equal(after, w.pristine) {
			w.history = append(w.history, fmt.Sprintf("%s: %d", desc, rec.Code))
			if len(w.history) > 20 {
				w.history = w.history[1:]
			}
			return
		}
		if rec.Code >= 400 && !partialExtraction(rt, rec, sandbox, lineDiff(w.pristine, after)) {
			t.Fatalf("%s: refused with %d %s, but changed:\n%s\nthe requests before it on this world:\n%s", desc, rec.Code, rec.Body,
				lineDiff(w.pristine, after), strings.Join(w.history, "\n"))
		}
		w.close()
		w = newFuzzWorld(t, base, keys)
	})
}

// partialExtraction tells whether a refusal is a tar upload found
// malformed after its first entries, whose changes (diff, of lineDiff)
// are all to the files of the sandbox it was sent to: as docs/files.md
// says, the entries before the fault stay. (One malformed from its first
// block changes nothing: api.checkTarStart.)
func partialExtraction(rt string, rec *httptest.ResponseRecorder, sandbox, diff string) bool {
	if rt != "PUT /v1/sandboxes/{id}/files/tar" || rec.Code != http.StatusBadRequest ||
		!strings.Contains(rec.Body.String(), "was cut after ") || strings.Contains(rec.Body.String(), "after 0 entries") {
		return false
	}
	for _, line := range strings.Split(strings.TrimSpace(diff), "\n") {
		if !strings.HasPrefix(line, "+ file "+sandbox+"/") && !strings.HasPrefix(line, "- file "+sandbox+"/") {
			return false
		}
	}
	return true
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// hostileBodies are the JSON bodies of issue #16's hostile cases: keys
// twice (also in another case and nested), numbers past every bound,
// wrong types, NUL bytes, host paths and file URLs, paths that climb,
// negative sizes, unicode, deep nesting, and bodies that are not one
// JSON value.
var hostileBodies = []string{
	`{"template":"base","network":{"allow_out":["2001:db8::/32","10.0.0.0/33","http://x"]}}`,
	`{"template":"base","network":{"deny_out":["a\u0000b",""]}}`,
	`{"template":"base","network":{"allow_out":"10.0.0.1"}}`,
	`{"template":"base","network":{"allow_out":[1]}}`,
	`{"network":{"allow_out":["` + strings.Repeat("a.", 200) + `com"]}}`,
	`{"template":"base","network":{"allow_out":["*.com","a.*.example.com","*"]}}`,
	`{"template":"base","network":{"allow_out":["*.example.com"],"deny_out":["bad.example.com"]}}`,
	`{"template":"base","volume_mounts":[{"name":"alpha-vol","path":"/proc/self"}]}`,
	`{"template":"base","volume_mounts":[{"name":"bravo-vol","path":"/data"}]}`,
	`{"template":"base","volume_mounts":[{"name":"alpha-vol","path":"/a/../../etc"},{"name":"../alpha-vol","path":"/"}]}`,
	`{"template":"base","volume_mounts":[{"name":"alpha-vol","path":"/x","read_only":"yes"}]}`,
	`{"name":"../../etc","size_mib":64}`,
	`{"name":"alpha-vol","size_mib":-1}`,
	`{"name":"huge","size_mib":9223372036854775807}`,
	`{"size_mib":1e309}`,
	`{"template":"base","secrets":[{"name":"alpha-db","env":"PATH"}]}`,
	`{"template":"base","secrets":[{"name":"bravo-db","path":"/run/secrets/x"}]}`,
	`{"template":"base","secrets":[{"name":"../alpha-db","path":"/proc/self/environ"},{"name":"alpha-db","env":"A","path":"/x"}]}`,
	`{"value":""}`,
	`{"value":1}`,
	`{"template":"base","template":"base"}`,
	`{"templateID":"base","templateID":"base"}`,
	`{"template":"base","Template":"base"}`,
	`{"cmd":["true"],"cmd":["false"]}`,
	`{"metadata":{"k":"a","k":"b"}}`,
	`{"timeout":1e309}`,
	`{"timeout":99999999999999999999}`,
	`{"timeout":-9223372036854775808}`,
	`{"duration":1e-400}`,
	`{"template":"base","resources":{"vcpus":1e308,"memory_mib":9223372036854775807,"disk_mib":-1,"pids":-1}}`,
	`{"cmd":"true"}`,
	`{"metadata":[1,2]}`,
	`{"timeout":"60"}`,
	`{"path":{"a":1}}`,
	`{"signal":9}`,
	`{"data":null,"close":"yes"}`,
	`{"path":"/root/a\u0000b"}`,
	`{"cmd":["true\u0000"],"env":{"A\u0000":"b"}}`,
	"{\"template\":\"ba\x00se\"}",
	`{"template":"file:///etc/shadow"}`,
	`{"templateID":"file:///etc/shadow"}`,
	`{"url":"file:///etc/shadow"}`,
	`{"path":"../../../etc/shadow"}`,
	`{"from":"../../../etc/passwd","to":"/root/x"}`,
	`{"from":"/root/alpha.txt","to":"/../../../tmp/x"}`,
	`{"cmd":["cat","/etc/shadow"],"cwd":"../../.."}`,
	`{"offset":-1,"timeout_seconds":-1}`,
	`{"language":"python","code":"print 1","timeout_seconds":-1}`,
	`{"metadata":{"ключ":"значение","🔑":"‮"}}`,
	`{"url":"https://hооks.example.com/x"}`,
	`{"path":"/root/ünï‮cödé"}`,
	`{"template":"base","env":{"PATH":"` + strings.Repeat("é", 5000) + `"}}`,
	strings.Repeat(`{"a":`, 10000) + `1` + strings.Repeat(`}`, 10000),
	strings.Repeat(`[`, 100000),
	`{"metadata":` + strings.Repeat(`{"k":`, 500) + `"v"` + strings.Repeat(`}`, 500) + `}`,
	`{}{}`, `[]`, `null`, `"x"`, `{`, ``, "\xff\xfe{}", `{"timeout":60}` + strings.Repeat(" ", 1<<20),
}

// hostileQueries are query strings of the same kinds.
var hostileQueries = []string{
	"path=../../../etc/shadow", "path=%00", "path=/root/%2e%2e/%2e%2e/etc", "path=" + strings.Repeat("a/", 300),
	"depth=99999999999999999999", "depth=-1", "offset=-1", "offset=1e9", "limit=-1", "limit=1.5", "limit=99999999999999999999",
	"since=-4", "since=abc", "state=running,sleeping", "all=maybe", "metadata.k=%00", "metadata=%25", "metadata=k%3Dv%3Dw",
	"from=2026-13-45", "to=yesterday", "tenant=alpha", "tenant=default", "sandbox=../x", "group_by=nothing",
	"start=-1", "end=99999999999999999999", "nextToken=" + strings.Repeat("A", 5000), "path=/root/alpha.txt&path=/etc/shadow",
	"%zz=1", "a=%", strings.Repeat("x=1&", 5000),
	// The list's paging and the events' newest read.
	"limit=0", "limit=1001", "limit=", "limit=2&limit=x", "after=", "after=%00", "after=!!!", "after=" + strings.Repeat("A", 5000),
	"after=LTE6c2Jf", "after=MTpzYl8%3D", "after=OTk5OTk5OTk5OTk5OTk5OTk5OTk6c2Jf", "after=MTo", "after=MTpzYgBf", "limit=1&after=" + listCursorBefore + "&after=x",
	"latest=maybe", "latest=1&since=-1", "latest=true&limit=0",
}

// hostileSegments are path parameters of the same kinds.
var hostileSegments = []string{
	"..", "../../etc/shadow", "\x00", "a\x00b", strings.Repeat("a", 10000), "ünï‮", "-1", "99999999999999999999",
	"0", "%00", " ", "base/../base", "wh_", "sandbox-with-dash-client",
}

// hostileAdmin are hostile bodies for the admin's routes.
var hostileAdmin = []struct{ route, body string }{
	{"POST /v1/templates", `{"name":"x","image":"file:///etc/shadow"}`},
	{"POST /v1/templates", `{"name":"x","rootfs":"../../etc"}`},
	{"POST /v1/templates", `{"name":"x","oci_layout":"relative/path"}`},
	{"POST /v1/templates", `{"name":"../x","rootfs":"/"}`},
	{"POST /v1/templates", `{"name":"x","name":"y","rootfs":"/"}`},
	{"POST /v1/templates/build", `{"name":"x","debian":"../../etc"}`},
	{"POST /v1/templates/build", `{"name":"x","mirror":"file:///etc/shadow"}`},
	{"POST /v1/templates/build", `{"name":"x","users":[{"name":"root","uid":0}]}`},
	{"POST /v1/templates/build", `{"name":"x","users":[{"name":"u","uid":-1}]}`},
	{"POST /v1/templates/build", `{"name":"x","packages":["a;rm -rf /"]}`},
	{"POST /v1/templates/build", `{"name":"ok"}`},
	{"POST /v1/tenants", `{"name":"Bad Name"}`},
	{"POST /v1/tenants", `{"name":"alpha"}`},
	{"POST /v1/tenants", `{"name":"a\u0000b"}`},
	{"POST /v1/keys", `{"tenant":"x","tier":"platinum"}`},
	{"POST /v1/keys", `{"tenant":"alpha","admin":"yes"}`},
	{"POST /v1/keys", `{"tenant":"../default"}`},
	{"PATCH /v1/tenants/{name}", `{"quota":{"max_sandboxes":-1}}`},
	{"PATCH /v1/sandboxes/{id}", `{"network":{"allow_out":["10.0.0.0/40"]}}`},
	{"PATCH /v1/sandboxes/{id}", `{"network":{"deny_out":["::1"]}}`},
	{"PATCH /v1/sandboxes/{id}", `{"network":{"allow_out":["**.example.com","*example.com"]}}`},
	{"PATCH /v1/sandboxes/{id}", `{"network":{"allow_out":["*.example.com"],"deny_out":["bad.example.com"]}}`},
	{"PATCH /v1/sandboxes/{id}", `{"network":{"allow_out":null,"deny_out":{"a":1}}}`},
	{"PATCH /v1/tenants/{name}", `{"quota":{"max_vcpus":1e309}}`},
	{"PATCH /v1/tenants/{name}", `{"quota":{"max_memory_mib":"lots"}}`},
	{"PATCH /v1/tenants/{name}", `{"quota":{"max_disk_mib":99999999999999999999}}`},
	{"PATCH /v1/tenants/{name}", `{"quota":{"max_sandboxes":1,"max_sandboxes":2}}`},
	{"PATCH /v1/tenants/{name}", `{"quota":null}`},
	{"DELETE /v1/templates/{name}", `{"x":1}`},
	{"DELETE /v1/templates/{name}", ``},
}

// hostileCheckpoints are bodies of the checkpoint, fork and restore
// routes that must be refused with a 4xx and change nothing.
var hostileCheckpoints = []struct{ route, body string }{
	{"POST /v1/sandboxes/{id}/checkpoints", `{"name":"../../etc"}`},
	{"POST /v1/sandboxes/{id}/checkpoints", `{"name":"a/b"}`},
	{"POST /v1/sandboxes/{id}/checkpoints", `{"name":"x~tmp"}`},
	{"POST /v1/sandboxes/{id}/checkpoints", `{"name":""}`},
	{"POST /v1/sandboxes/{id}/checkpoints", `{"name":"` + strings.Repeat("a", 64) + `"}`},
	{"POST /v1/sandboxes/{id}/checkpoints", `{"name":"-rf"}`},
	{"POST /v1/sandboxes/{id}/fork", `{"count":0}`},
	{"POST /v1/sandboxes/{id}/fork", `{"count":17}`},
	{"POST /v1/sandboxes/{id}/fork", `{"count":-1}`},
	{"POST /v1/sandboxes/{id}/fork", `{"count":1e9}`},
	{"POST /v1/sandboxes/{id}/fork", `{"count":2,"checkpoint":"../x"}`},
	{"POST /v1/sandboxes/{id}/fork", `{"count":2,"checkpoint":"nope"}`},
	{"POST /v1/sandboxes/{id}/restore", `{"checkpoint":"../../x"}`},
	{"POST /v1/sandboxes/{id}/restore", `{}`},
	{"POST /v1/sandboxes/{id}/restore", `{"checkpoint":"nope"}`},
	// E2B's snapshots (e2b/snapshots.go).
	{"POST /sandboxes/{id}/snapshots", `{"name":"../x"}`},
	{"POST /sandboxes/{id}/snapshots", `{"name":7}`},
	{"POST /sandboxes", `{"templateID":"snap-nosuchsandbox-cp"}`},
	{"POST /sandboxes", `{"templateID":"snap--"}`},
	{"POST /sandboxes", `{"templateID":"snap-a-../../x"}`},
}

// hostileValues are what bodyVariants puts in place of a field's value,
// as JSON: wrong types, numbers past every bound, negative sizes, NUL
// bytes, host paths and file URLs, paths that climb, unicode, long and
// nested values.
var hostileValues = []string{
	`null`, `{}`, `"60"`, `-1`, `1.5`, `1e309`, `99999999999999999999`, `"a\u0000b"`, `"file:///etc/shadow"`,
	`"../../../etc/shadow"`, `"‮ünïcödé🔑"`, `"` + strings.Repeat("é", 3000) + `"`, `[["a\u0000"],{"k":{"k":[[1]]}}]`,
}

// bodyVariants are a JSON object body with, in turn, each field's value
// (at any depth) replaced by each hostile value, and each top-level key
// given twice (as it is and in another case).
func bodyVariants(body string) []string {
	var top map[string]any
	if json.Unmarshal([]byte(body), &top) != nil {
		return nil
	}
	var out []string
	var walk func(path []string, m map[string]any)
	walk = func(path []string, m map[string]any) {
		for k, e := range m {
			p := append(append([]string(nil), path...), k)
			if sub, ok := e.(map[string]any); ok {
				walk(p, sub)
			}
			for _, h := range hostileValues {
				out = append(out, replaceAt(top, p, json.RawMessage(h)))
			}
		}
	}
	walk(nil, top)
	inner := strings.TrimPrefix(body, "{")
	for k, e := range top {
		raw, _ := json.Marshal(e)
		out = append(out, fmt.Sprintf("{%q:%s,%s", k, raw, inner), fmt.Sprintf("{%q:%s,%s", strings.ToUpper(k[:1])+k[1:], raw, inner))
	}
	sort.Strings(out)
	return out
}

// replaceAt returns m as JSON with the value at path replaced by v.
func replaceAt(m map[string]any, path []string, v json.RawMessage) string {
	cp := map[string]any{}
	for k, e := range m {
		cp[k] = e
	}
	if len(path) == 1 {
		cp[path[0]] = v
	} else {
		sub, _ := cp[path[0]].(map[string]any)
		cp[path[0]] = json.RawMessage(replaceAt(sub, path[1:], v))
	}
	b, _ := json.Marshal(cp)
	return string(b)
}

// hostileQueryValues are what queryVariants puts in place of a query
// parameter's value (already escaped).
var hostileQueryValues = []string{
	"", "..%2F..%2F..%2Fetc%2Fshadow", "%00", "a%00b", "-1", "1.5", "99999999999999999999", "%zz", "%E2%80%AE%C3%BC",
	strings.Repeat("a%2F", 300), "file%3A%2F%2F%2Fetc%2Fshadow",
}

// queryVariants are a query with, in turn, each parameter's value
// replaced by each hostile value, and each parameter given twice.
func queryVariants(query string) []string {
	if query == "" {
		return nil
	}
	var out []string
	params := strings.Split(query, "&")
	for i, p := range params {
		name, _, _ := strings.Cut(p, "=")
		for _, h := range hostileQueryValues {
			cp := append([]string(nil), params...)
			cp[i] = name + "=" + h
			out = append(out, strings.Join(cp, "&"))
		}
		out = append(out, query+"&"+name+"=/etc/shadow")
	}
	return out
}
