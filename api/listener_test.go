package api_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"fmt"
	"github.com/torpor-dev/torpor/objstore"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite" // dumpDB reads the store's file as it is

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/clocktest"
	"github.com/torpor-dev/torpor/e2b"
	"github.com/torpor-dev/torpor/files"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/sqlite"
	"github.com/torpor-dev/torpor/template"
	"github.com/torpor-dev/torpor/ui"
)

// The tenants of a listener: A owns the objects, B is the other tenant,
// and the admin key belongs to the tenant "default".
const (
	tenantA = "alpha"
	tenantB = "bravo"
)

// listener is the daemon's API listener in a test: the native API and,
// beside it, E2B's control plane on E2B's own paths, mounted as
// daemon.apiHandler mounts them, over one store and one engine whose
// runtime is the fake (behind a spy) on a stopped clock, with a template
// manager whose builder runs nothing.
type listener struct {
	h     http.Handler
	st    *sqlite.Store
	db    string
	eng   *lifecycle.Engine
	host  *fake.Host
	rt    *spyRuntime
	clock *clocktest.Clock
	keys  *principals
	// ro reads the database file for dumpDB, which keeps its rows as
	// last read, at the database's data version rowsAt.
	ro     *sql.DB
	rows   []string
	rowsAt int64
	close  func()
	// sessions are the dashboard sessions signed in on this listener,
	// by the key that opened each (signIn): do sends a key found here as
	// the session's cookie and CSRF token instead.
	sessions map[string]uiSession
}

// principals are the keys of a listener, made once so that two
// listeners accept the same secrets.
type principals struct {
	a, b, admin string
	records     []torpor.APIKey
	// store is the directory of the store listeners start from (see
	// copyStore); the test removes it (remove).
	store string
}

// remove removes the directory of the store listeners start from.
func (p *principals) remove() {
	if p.store != "" {
		os.RemoveAll(p.store)
	}
}

func newPrincipals() *principals {
	now := listenerEpoch
	p := &principals{}
	for _, k := range []struct {
		tenant string
		admin  bool
		secret *string
	}{{tenantA, false, &p.a}, {tenantB, false, &p.b}, {"default", true, &p.admin}} {
		secret, rec := torpor.NewAPIKey(k.tenant, k.admin, now)
		*k.secret = secret
		p.records = append(p.records, rec)
	}
	return p
}

// copyStore puts in dir the store every listener of p starts from (the
// template "base", the three tenants and p's keys), made once in a
// directory of its own: copying its files is much cheaper than
// migrating and filling a new database, and a fuzzing run makes
// thousands.
func (p *principals) copyStore(t testing.TB, dir string) {
	t.Helper()
	if p.store == "" {
		proto, err := os.MkdirTemp("", "torpor-listener-store")
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		st, err := sqlite.Open(ctx, filepath.Join(proto, "torpor.db"))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/x", Source: torpor.TemplateSource{Kind: torpor.SourceBuiltin}, CreatedAt: listenerEpoch}); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{tenantA, tenantB, "default"} {
			if err := st.CreateTenant(ctx, torpor.Tenant{Name: name, CreatedAt: listenerEpoch}); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range p.records {
			if err := st.CreateAPIKey(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		p.store = proto
	}
	entries, err := os.ReadDir(p.store)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(p.store, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// listenerEpoch is the stopped clock's time: two listeners built with it
// stamp the same times.
var listenerEpoch = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// routeList is every "METHOD PATTERN" the API listener serves: the native
// table (api.Routes) and E2B's (e2b.Routes).
func routeList() []string {
	return append(api.Routes(), e2b.Routes()...)
}

// newListener builds a listener in dir (which the caller removes; close
// releases the rest).
func newListener(t testing.TB, dir string, p *principals) *listener {
	t.Helper()
	ctx := context.Background()
	l := &listener{db: filepath.Join(dir, "torpor.db"), keys: p, clock: clocktest.New(listenerEpoch), host: fake.NewHost()}
	p.copyStore(t, dir)
	st, err := sqlite.Open(ctx, l.db)
	if err != nil {
		t.Fatal(err)
	}
	l.st = st
	l.host.FilesDir = filepath.Join(dir, "files")
	l.rt = &spyRuntime{Runtime: fake.New(l.host)}
	// Archives go to a directory of the listener's own, as a daemon's do.
	if err := os.MkdirAll(filepath.Join(dir, "archive"), 0o755); err != nil {
		t.Fatal(err)
	}
	archives, err := objstore.Open(ctx, (&url.URL{Scheme: "file", Path: filepath.Join(dir, "archive")}).String())
	if err != nil {
		t.Fatal(err)
	}
	l.eng, err = lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{l.rt}, Clock: l.clock, Archives: archives})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.eng.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	tm, err := template.New(ctx, template.Config{Store: st, Dir: filepath.Join(dir, "templates"), Builder: nothingBuilder{},
		Limits: template.Limits{MaxLayerBytes: 1 << 20, MaxImageBytes: 1 << 20, MaxEntries: 1000, MaxLayers: 4}, Now: l.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{Engine: l.eng, Auth: st, Templates: st, TemplateManager: tm, Clock: l.clock,
		Webhooks: st, WebhookGuard: webhookGuard, MaxUploadBytes: 1 << 20, UI: ui.Handler()})
	srv.SetReady()
	e2bAPI := e2b.New(e2b.Config{Engine: l.eng, Auth: st, TemplateStore: st, Domain: "sb.example.test"})
	mux := http.NewServeMux()
	mux.Handle("/", srv)
	for _, rt := range e2b.Routes() {
		mux.Handle(rt, e2bAPI)
	}
	l.h = mux
	l.close = func() {
		l.eng.Close()
		if l.ro != nil {
			l.ro.Close()
		}
		st.Close()
	}
	return l
}

// nothingBuilder "builds" a Debian template as an empty root with a shell,
// without debootstrap.
type nothingBuilder struct{}

func (nothingBuilder) Check() error { return nil }

func (nothingBuilder) Build(ctx context.Context, req torpor.TemplateBuildRequest, dir string, progress template.Progress) error {
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "bin/sh"), []byte("#!"), 0o755)
}

// do serves one request on the listener with key (none when empty), or
// with the session key opened (signIn).
func (l *listener) do(key, method, target, ctype string, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, bytes.NewReader(body))
	if sess, ok := l.sessions[key]; ok {
		req.AddCookie(&http.Cookie{Name: api.SessionCookie, Value: sess.cookie})
		req.Header.Set(api.CSRFHeader, sess.csrf)
	} else if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	rec := httptest.NewRecorder()
	l.h.ServeHTTP(rec, req)
	return rec
}

// objectsA are tenant A's objects in a listener, and the strings that
// must never reach tenant B.
type objectsA struct {
	running, paused, gone *torpor.Sandbox
	pid                   int
	webhook               torpor.Webhook
	secrets               []string
	// wakeup is the id of the running sandbox's wake-up.
	wakeup string
}

// Strings only tenant A's objects hold.
const (
	metaA = "alpha-metadata-value"
	envA  = "alpha-env-secret"
	// secretA is the value of A's secret secretNameA, which A's
	// sandboxes get as SECRET_A.
	secretA     = "alpha-secret-value"
	secretNameA = "alpha-db"
	fileA       = "alpha-file-content"
	hookA       = "https://hooks.example.com/alpha-hook-path"
	procA       = "alpha-process-secret"
	fileAt      = "/root/alpha.txt"
	// volumeNameA is A's volume, which holds fileA at volumeFileAt.
	volumeNameA = "alpha-vol"
	// checkpointNameA names the checkpoint of A's running sandbox.
	checkpointNameA = "cp-a"
	volumeFileAt    = "/alpha-data.txt"
)

// seedA gives tenant A a running sandbox (with metadata, env, a file and
// a process), a paused one, a terminated one and a webhook.
func seedA(t testing.TB, l *listener) objectsA {
	t.Helper()
	ctx := context.Background()
	var a objectsA
	off := false
	if _, err := l.eng.SetSecret(ctx, tenantA, secretNameA, []byte(secretA)); err != nil {
		t.Fatal(err)
	}
	mk := func() *torpor.Sandbox {
		sb, err := l.eng.Create(ctx, tenantA, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"owner": metaA},
			Env: map[string]string{"SECRET": envA}, Secrets: []torpor.SecretRef{{Name: secretNameA, Env: "SECRET_A"}}, PolicyRequest: torpor.PolicyRequest{Lifecycle: &torpor.Lifecycle{AutoResume: &off}}})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	a.running, a.paused, a.gone = mk(), mk(), mk()
	// A wake-up of A's, which the stopped clock never brings.
	withWakeup, err := l.eng.AddWakeup(ctx, tenantA, a.running.ID, torpor.WakeupSpec{WakeSchedule: "@daily", Cmd: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	a.running, a.wakeup = withWakeup, withWakeup.Wakeups[0].ID
	if _, err := l.eng.CreateCheckpoint(ctx, tenantA, a.running.ID, checkpointNameA); err != nil {
		t.Fatal(err)
	}
	if a.running, err = l.eng.Get(ctx, tenantA, a.running.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := l.eng.Pause(ctx, tenantA, a.paused.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := l.eng.Delete(ctx, tenantA, a.gone.ID); err != nil {
		t.Fatal(err)
	}
	// A runtime's root file system is there from the boot; the fake's
	// is made at the first use, unless made here.
	l.makeRoot(t, a.paused.ID)
	root := filepath.Join(l.host.FilesDir, a.running.ID, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, filepath.Base(fileAt)), []byte(fileA), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := l.eng.StartProcess(ctx, tenantA, a.running.ID, torpor.ProcessRequest{Cmd: []string{"cat", procA}, Env: map[string]string{"TOKEN": envA}})
	if err != nil {
		t.Fatal(err)
	}
	a.pid = p.ID
	a.webhook = torpor.Webhook{ID: torpor.NewID("wh_", 16), Tenant: tenantA, URL: hookA, Secret: "whsec_" + torpor.NewID("", 40), CreatedAt: listenerEpoch}
	if err := l.st.CreateWebhook(ctx, a.webhook); err != nil {
		t.Fatal(err)
	}
	// Seeded again (after a control changed A's objects), the volume is
	// made anew.
	if err := l.eng.DeleteVolume(ctx, tenantA, volumeNameA); err != nil && !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatal(err)
	}
	vol, err := l.eng.CreateVolume(ctx, tenantA, volumeNameA, 64)
	if err != nil {
		t.Fatal(err)
	}
	vfs, err := l.eng.VolumeFS(ctx, tenantA, volumeNameA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vfs.Write(volumeFileAt, strings.NewReader(fileA), files.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	vfs.Close()
	a.secrets = []string{metaA, envA, fileA, "alpha-hook-path", procA, a.webhook.ID, a.webhook.Secret, tenantA, secretA, secretNameA, volumeNameA, vol.ID}
	for _, sb := range []*torpor.Sandbox{a.running, a.paused, a.gone} {
		a.secrets = append(a.secrets, sb.ID, sb.TrafficToken)
	}
	return a
}

// makeRoot makes the directory of sandbox id's root file system.
func (l *listener) makeRoot(t testing.TB, id string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(l.host.FilesDir, id), 0o755); err != nil {
		t.Fatal(err)
	}
}

// reader is the listener's read-only connection to its database file:
// one connection, so that dataVersion asks the same one every time.
func (l *listener) reader(t testing.TB) *sql.DB {
	t.Helper()
	if l.ro == nil {
		db, err := sql.Open("sqlite", "file:"+l.db+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		l.ro = db
	}
	return l.ro
}

// dataVersion changes whenever another connection (the store's) commits
// a change to the database (SQLite's PRAGMA data_version).
func (l *listener) dataVersion(t testing.TB) int64 {
	t.Helper()
	var v int64
	if err := l.reader(t).QueryRow("PRAGMA data_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// dumpDB returns every row of every table of the listener's database, one
// line a row ("table col=value ..."), sorted. It reads them again only
// after the store committed something since the last call.
func (l *listener) dumpDB(t testing.TB) []string {
	t.Helper()
	if v := l.dataVersion(t); l.rows == nil || v != l.rowsAt {
		l.rows, l.rowsAt = l.readDB(t), v
	}
	return slices.Clone(l.rows)
}

func (l *listener) readDB(t testing.TB) []string {
	t.Helper()
	db := l.reader(t)
	tables, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for tables.Next() {
		var n string
		if err := tables.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	tables.Close()
	var out []string
	for _, n := range names {
		rows, err := db.Query(`SELECT * FROM "` + n + `"`)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			b.WriteString(n)
			for i, c := range cols {
				v := vals[i]
				if raw, ok := v.([]byte); ok {
					v = string(raw)
				}
				fmt.Fprintf(&b, " %s=%v", c, v)
			}
			out = append(out, b.String())
		}
		rows.Close()
	}
	sort.Strings(out)
	return out
}

// hostState describes what the fake host holds for the sandboxes ids: the
// instance, its processes and their output, and every file under the
// host's FilesDir (path, type, mode, content), read past the spy.
func (l *listener) hostState(t testing.TB, ids ...string) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	for _, id := range ids {
		out = append(out, fmt.Sprintf("instance %s %s boots=%d disk=%v snapshot=%v", id, l.host.State(id), l.host.Boots(id), l.host.HasDisk(id), l.host.HasSnapshot(id)))
		sb, err := l.st.GetSandbox(ctx, id)
		if err != nil {
			continue
		}
		ref := torpor.InstanceRef{SandboxID: id, Handle: sb.Handle}
		procs, _ := l.rt.Runtime.ListProcesses(ctx, ref)
		for _, p := range procs {
			o, _ := l.rt.Runtime.ProcessOutput(ctx, ref, p.ID, 0)
			out = append(out, fmt.Sprintf("process %s/%d %s exit=%v output=%q ended=%v", id, p.ID, p.State, p.ExitCode, o.Data, o.Ended))
		}
	}
	_ = filepath.WalkDir(l.host.FilesDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(l.host.FilesDir, p)
		line := fmt.Sprintf("file %s %v", rel, info.Mode())
		if info.Mode().IsRegular() {
			data, _ := os.ReadFile(p)
			line += fmt.Sprintf(" %x", sha256.Sum256(data))
		} else if info.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(p)
			line += " -> " + target
		}
		out = append(out, line)
		return nil
	})
	return out
}

// spyRuntime is the fake runtime that notes each call on the instance of
// a watched sandbox (every verb and every read or write of its files,
// processes, code, ports and usage; not the engine's own Inspect and
// Wait).
type spyRuntime struct {
	*fake.Runtime
	mu      sync.Mutex
	watched map[string]bool
	calls   []string
}

// watch starts noting the calls on ids (and forgets earlier notes).
func (s *spyRuntime) watch(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watched = map[string]bool{}
	for _, id := range ids {
		s.watched[id] = true
	}
	s.calls = nil
}

// noted returns the calls noted since watch.
func (s *spyRuntime) noted() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

func (s *spyRuntime) note(op, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watched[id] {
		s.calls = append(s.calls, op+" "+id)
	}
}

func (s *spyRuntime) Boot(ctx context.Context, spec torpor.BootSpec) (string, error) {
	s.note("Boot", spec.SandboxID)
	return s.Runtime.Boot(ctx, spec)
}

func (s *spyRuntime) Freeze(ctx context.Context, ref torpor.InstanceRef) error {
	s.note("Freeze", ref.SandboxID)
	return s.Runtime.Freeze(ctx, ref)
}

func (s *spyRuntime) Thaw(ctx context.Context, ref torpor.InstanceRef) error {
	s.note("Thaw", ref.SandboxID)
	return s.Runtime.Thaw(ctx, ref)
}

func (s *spyRuntime) Stop(ctx context.Context, ref torpor.InstanceRef) error {
	s.note("Stop", ref.SandboxID)
	return s.Runtime.Stop(ctx, ref)
}

func (s *spyRuntime) Destroy(ctx context.Context, ref torpor.InstanceRef) error {
	s.note("Destroy", ref.SandboxID)
	return s.Runtime.Destroy(ctx, ref)
}

func (s *spyRuntime) Snapshot(ctx context.Context, ref torpor.InstanceRef) (torpor.SnapshotInfo, error) {
	s.note("Snapshot", ref.SandboxID)
	return s.Runtime.Snapshot(ctx, ref)
}

func (s *spyRuntime) Restore(ctx context.Context, ref torpor.InstanceRef) (string, error) {
	s.note("Restore", ref.SandboxID)
	return s.Runtime.Restore(ctx, ref)
}

func (s *spyRuntime) Exec(ctx context.Context, ref torpor.InstanceRef, req torpor.ExecRequest) (torpor.ExecResult, error) {
	s.note("Exec", ref.SandboxID)
	return s.Runtime.Exec(ctx, ref, req)
}

func (s *spyRuntime) RunCode(ctx context.Context, ref torpor.InstanceRef, req torpor.CodeRequest) (torpor.CodeResult, error) {
	s.note("RunCode", ref.SandboxID)
	return s.Runtime.RunCode(ctx, ref, req)
}

func (s *spyRuntime) RootFS(ctx context.Context, ref torpor.InstanceRef) (string, error) {
	s.note("RootFS", ref.SandboxID)
	return s.Runtime.RootFS(ctx, ref)
}

func (s *spyRuntime) DialContext(ctx context.Context, ref torpor.InstanceRef, network, addr string) (net.Conn, error) {
	s.note("Dial", ref.SandboxID)
	return s.Runtime.DialContext(ctx, ref, network, addr)
}

func (s *spyRuntime) ResourceUsage(ctx context.Context, ref torpor.InstanceRef) (torpor.ResourceUsage, error) {
	s.note("ResourceUsage", ref.SandboxID)
	return s.Runtime.ResourceUsage(ctx, ref)
}

func (s *spyRuntime) CPUUsage(ctx context.Context, ref torpor.InstanceRef) (time.Duration, error) {
	s.note("CPUUsage", ref.SandboxID)
	return s.Runtime.CPUUsage(ctx, ref)
}

func (s *spyRuntime) StartProcess(ctx context.Context, ref torpor.InstanceRef, req torpor.ProcessRequest) (torpor.ProcessInfo, error) {
	s.note("StartProcess", ref.SandboxID)
	return s.Runtime.StartProcess(ctx, ref, req)
}

func (s *spyRuntime) ListProcesses(ctx context.Context, ref torpor.InstanceRef) ([]torpor.ProcessInfo, error) {
	s.note("ListProcesses", ref.SandboxID)
	return s.Runtime.ListProcesses(ctx, ref)
}

func (s *spyRuntime) ProcessOutput(ctx context.Context, ref torpor.InstanceRef, id int, offset int64) (torpor.ProcessOutput, error) {
	s.note("ProcessOutput", ref.SandboxID)
	return s.Runtime.ProcessOutput(ctx, ref, id, offset)
}

func (s *spyRuntime) ReadProcess(ctx context.Context, ref torpor.InstanceRef, id int, req torpor.ProcessRead) (torpor.ProcessOutput, error) {
	s.note("ReadProcess", ref.SandboxID)
	return s.Runtime.ReadProcess(ctx, ref, id, req)
}

func (s *spyRuntime) WriteProcessStdin(ctx context.Context, ref torpor.InstanceRef, id int, data []byte, close bool) error {
	s.note("WriteProcessStdin", ref.SandboxID)
	return s.Runtime.WriteProcessStdin(ctx, ref, id, data, close)
}

func (s *spyRuntime) SignalProcess(ctx context.Context, ref torpor.InstanceRef, id int, signal string) error {
	s.note("SignalProcess", ref.SandboxID)
	return s.Runtime.SignalProcess(ctx, ref, id, signal)
}

// tarOf is a tar stream of one regular file per name/content pair
// (writing to memory cannot fail).
func tarOf(pairs ...string) string {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(pairs); i += 2 {
		_ = tw.WriteHeader(&tar.Header{Name: pairs[i], Mode: 0o644, Size: int64(len(pairs[i+1])), Typeflag: tar.TypeReg})
		_, _ = io.WriteString(tw, pairs[i+1])
	}
	_ = tw.Close()
	return buf.String()
}

// jsonShape decodes a JSON answer for comparison with another, with the
// values each object gets at random (ids, tokens, secrets) and the global
// event cursors replaced by their names, and lists in a fixed order; an
// answer that is not JSON is returned as it is.
func jsonShape(body []byte) string {
	var v any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return string(body)
	}
	var walk func(v any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if randomFields[k] {
					x[k] = "<" + k + ">"
					continue
				}
				x[k] = walk(e)
			}
		case []any:
			// Lists are compared as sets: objects made at the same
			// instant of the stopped clock sort by their random ids.
			keys := make([]string, len(x))
			for i, e := range x {
				b, _ := json.Marshal(walk(e))
				keys[i] = string(b)
			}
			sort.Strings(keys)
			out := make([]any, len(keys))
			for i, k := range keys {
				out[i] = json.RawMessage(k)
			}
			return out
		}
		return v
	}
	out, _ := json.Marshal(walk(v))
	return string(out)
}

// randomFields are the fields whose values a new object gets at random,
// in either API's answers, and the event cursors (an event's seq, a
// list's next, a new webhook's cursor): one sequence numbers the events
// of every tenant, so a tenant's cursors grow with the others' events, a
// known side channel of volume only.
var randomFields = map[string]bool{
	"id": true, "sandbox_id": true, "traffic_token": true, "secret": true, "key": true,
	"sandboxID": true, "clientID": true, "envdAccessToken": true, "trafficAccessToken": true,
	"seq": true, "next": true, "cursor": true,
	"volumeID": true, "token": true,
}
