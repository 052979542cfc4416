package e2e

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/store/postgres/pgtest"
)

// postgresEnv, set to 1, runs every daemon of the e2e tests on the
// PostgreSQL store: each data dir gets a database of its own on one server
// (stopped when the test binary ends). scripts/test.sh runs the lifecycle,
// idle, hooks, ledger, webhook and E2B tests so, after their SQLite run.
const postgresEnv = "TORPOR_E2E_POSTGRES"

// storeDBs maps a data dir to its database's URL, so that a daemon
// restarted over a data dir finds its state.
var storeDBs sync.Map

// storeEnv is the environment that puts a daemon over dataDir on the
// PostgreSQL store when postgresEnv asks for it (none otherwise). An
// explicit TORPOR_STORE given to startDaemon comes later and wins.
func storeEnv(t testing.TB, dataDir string) []string {
	if os.Getenv(postgresEnv) == "" {
		return nil
	}
	url, ok := storeDBs.Load(dataDir)
	if !ok {
		// The database goes when the test that made the data dir ends,
		// after its daemons' cleanups (registered later, run earlier).
		url, _ = storeDBs.LoadOrStore(dataDir, pgtest.NewDatabase(t))
	}
	return []string{"TORPOR_STORE=" + url.(string)}
}

// startPostgresDaemon starts `torpor serve --store URL` with a data dir of
// its own (templates, sandboxes, keys) and its state in PostgreSQL.
func startPostgresDaemon(t *testing.T, bin, dataDir, url string, env ...string) *daemon {
	t.Helper()
	return startDaemon(t, bin, dataDir, append([]string{"TORPOR_STORE=" + url}, env...)...)
}

// The daemon on the PostgreSQL store: create, exec, pause, resume, a
// daemon restart that finds the sandbox and its events where they were,
// and a ledger that charges each second of its life once.
func TestPostgresStoreLifecycle(t *testing.T) {
	needs(t)
	srv := pgtest.New(t)
	url := srv.NewDatabase(t)
	// The password is not needed (the test server trusts its socket) but
	// must never reach the log.
	url = strings.Replace(url, "postgres@", "postgres:pg-s3cret@", 1)
	bin, dataDir := torporBin(t), t.TempDir()
	env := "TORPOR_SETTLE_SECONDS=1"
	d := startPostgresDaemon(t, bin, dataDir, url, env)
	if _, err := os.Stat(dataDir + "/torpor.db"); err == nil {
		t.Errorf("the daemon made a SQLite file although its store is PostgreSQL")
	}
	// A second daemon on the same database, with the same node name (the
	// host's), is refused: it would take the first one's sandboxes for
	// lost.
	second := exec.Command(bin, "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--proxy-listen", "")
	second.Env = append(os.Environ(), "TORPOR_STORE="+url)
	if out, err := second.CombinedOutput(); err == nil || !strings.Contains(string(out), "another torpor daemon runs as this node on this database") ||
		strings.Contains(string(out), "pg-s3cret") {
		t.Fatalf("a second daemon on the same database: %v\n%s", err, out)
	}
	id := strings.TrimSpace(d.ok("create"))
	if out := d.ok("exec", id, "--", "echo", "hello"); strings.TrimSpace(out) != "hello" {
		t.Fatalf("exec: %q", out)
	}
	d.ok("pause", id)
	d.waitState(id, torpor.StatePaused)
	d.ok("start", id)
	d.waitState(id, torpor.StateRunning)
	d.ok("exec", id, "--", "sh", "-c", "echo kept > /tmp/kept")
	time.Sleep(1500 * time.Millisecond) // a settlement or two
	cl := d.client(t)
	before := sandboxEvents(t, cl, id)
	d.stop()

	d = startPostgresDaemon(t, bin, dataDir, url, env)
	if sb := d.get(id); sb.State != torpor.StateRunning {
		t.Fatalf("after a daemon restart the sandbox is %s, want running", sb.State)
	}
	if out := d.ok("exec", id, "--", "cat", "/tmp/kept"); strings.TrimSpace(out) != "kept" {
		t.Fatalf("the sandbox lost its file across a daemon restart: %q", out)
	}
	cl = d.client(t)
	after := sandboxEvents(t, cl, id)
	if len(after) < len(before) || !slices.EqualFunc(before, after[:len(before)], func(a, b torpor.Event) bool { return a.Seq == b.Seq && a.Type == b.Type }) {
		t.Fatalf("events before the restart %v are not the start of those after %v", types(before), types(after))
	}
	if _, err := cl.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	checkLedgerOnce(t, d, cl, id)
	for _, log := range []string{d.logs.String(), d.stdout.String()} {
		if strings.Contains(log, "pg-s3cret") {
			t.Fatalf("the daemon logged the database password:\n%s", log)
		}
	}
	if !strings.Contains(d.logs.String(), `store="postgres://postgres:xxxxx@`) {
		t.Errorf("the daemon's log does not name its store, redacted:\n%s", d.logs.String())
	}
}

// checkLedgerOnce checks a deleted sandbox's ledger: closed rows that
// cover its life from creation to deletion without a gap or an overlap,
// as its event log says it was.
func checkLedgerOnce(t *testing.T, d *daemon, cl *client.Client, id string) {
	t.Helper()
	sb := d.get(id)
	rep, err := cl.Usage(context.Background(), client.UsageQuery{Sandbox: id})
	if err != nil {
		t.Fatal(err)
	}
	rows := rep.Rows
	slices.SortFunc(rows, func(a, b torpor.UsageRecord) int { return a.Start.Compare(b.Start) })
	spans, err := torpor.SpansOfRows(rows)
	if err != nil {
		t.Fatalf("ledger of %s: %v", id, err)
	}
	if want := torpor.SpansOfEvents(sandboxEvents(t, cl, id), *sb.TerminatedAt); !slices.Equal(spans, want) {
		t.Fatalf("ledger of %s\n%v\ndiffers from its event log\n%v", id, spans, want)
	}
}

func types(evs []torpor.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// PostgreSQL restarted under a running daemon: the sandbox keeps running;
// a call that needs the store while the server is down is 503 with
// Retry-After and changes nothing; once the server is back the pool
// reconnects by itself and the same calls work, with nothing lost, stuck
// or billed twice.
func TestPostgresRestartUnderDaemon(t *testing.T) {
	needs(t)
	srv := pgtest.New(t)
	url := srv.NewDatabase(t)
	bin, dataDir := torporBin(t), t.TempDir()
	d := startPostgresDaemon(t, bin, dataDir, url, "TORPOR_SETTLE_SECONDS=1")
	// Registered after the daemon's own cleanup, so it runs before it: a
	// test that fails while the server is down still brings it back, and
	// the daemon can then delete its sandboxes.
	t.Cleanup(func() {
		if err := srv.Start(); err != nil {
			t.Error(err)
		}
	})
	id := strings.TrimSpace(d.ok("create"))
	read := counter(t, d, id)
	n0, pid := read()
	// A sandbox whose idle pause falls due while the database is down:
	// the idle engine's pause fails then, and must catch up once the
	// database is back.
	idler := strings.TrimSpace(d.ok("create", "--pause-after", "1", "--auto-resume=false"))

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/sandboxes"},
		{"POST", "/v1/sandboxes/" + id + "/pause"},
	} {
		req, _ := http.NewRequest(c.method, "http://"+d.addr+c.path, strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+d.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s %s with the database down: %d, Retry-After %q; want 503 with Retry-After\n%s",
				c.method, c.path, resp.StatusCode, resp.Header.Get("Retry-After"), d.logs.String())
		}
	}
	// Settlement ticks and idle checks fail meanwhile; the sandbox, which
	// counts every 100 ms, does not notice.
	down := time.Now()
	time.Sleep(2 * time.Second)
	downFor := time.Since(down)

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, code := d.cli("pause", id)
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pause still fails 30 s after the database came back:\n%s", d.logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	d.waitState(id, torpor.StatePaused)
	d.waitState(idler, torpor.StatePaused)
	d.ok("start", id)
	d.waitState(id, torpor.StateRunning)
	n1, pid2 := read2(t, d, id)
	if pid2 != pid {
		t.Errorf("the sandbox's process changed across the database restart: %s -> %s", pid, pid2)
	}
	// Counted on through the outage: at least half the ticks of its
	// length (the machine is noisy; a stopped loop counts none).
	if min := n0 + int(downFor/(200*time.Millisecond)); n1 < min {
		t.Errorf("the counter went from %d to %d over a %s outage; it stopped while the database was down", n0, n1, downFor)
	}
	cl := d.client(t)
	if sbs, err := cl.List(context.Background(), client.ListOptions{}); err != nil || len(sbs) != 2 {
		t.Errorf("after the refused create the daemon lists %d sandboxes (%v), want 2", len(sbs), err)
	}
	if _, err := cl.Delete(context.Background(), idler); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	checkLedgerOnce(t, d, cl, id)
}

// `torpor store copy` moves a daemon's SQLite state into PostgreSQL: a
// daemon started on the copy finds every sandbox in its state (the
// running one adopted, not rebooted), its key, its events and its ledger,
// and carries on. A second copy into the same database is refused.
func TestStoreCopyToPostgres(t *testing.T) {
	needs(t)
	bin, dataDir := torporBin(t), t.TempDir()
	d := startDaemon(t, bin, dataDir, "TORPOR_SETTLE_SECONDS=1")
	run := strings.TrimSpace(d.ok("create"))
	read := counter(t, d, run)
	_, pid := read()
	paused := strings.TrimSpace(d.ok("create"))
	d.ok("pause", paused)
	d.waitState(paused, torpor.StatePaused)
	time.Sleep(1500 * time.Millisecond) // ledger rows
	cl := d.client(t)
	eventsBefore := sandboxEvents(t, cl, run)
	usageBefore, err := cl.Usage(context.Background(), client.UsageQuery{Sandbox: run})
	if err != nil {
		t.Fatal(err)
	}
	d.stop()

	url := pgtest.New(t).NewDatabase(t)
	copyCmd := func() (string, string, int) {
		cmd := exec.Command(bin, "store", "copy", "--from", filepath.Join(dataDir, "torpor.db"), "--to", url)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	out, errs, code := copyCmd()
	if code != 0 || !strings.Contains(out, "copied") || !strings.Contains(errs, "copying events") {
		t.Fatalf("torpor store copy: exit %d\n%s%s", code, out, errs)
	}
	if out, errs, code := copyCmd(); code == 0 || !strings.Contains(out+errs, "empty") {
		t.Fatalf("a second copy into the same database: exit %d\n%s%s", code, out, errs)
	}

	d = startPostgresDaemon(t, bin, dataDir, url, "TORPOR_SETTLE_SECONDS=1")
	if sb := d.get(paused); sb.State != torpor.StatePaused {
		t.Fatalf("the paused sandbox is %s after the copy", sb.State)
	}
	if sb := d.get(run); sb.State != torpor.StateRunning {
		t.Fatalf("the running sandbox is %s after the copy", sb.State)
	}
	if _, pid2 := read2(t, d, run); pid2 != pid {
		t.Errorf("the running sandbox was rebooted by the move: %s -> %s", pid, pid2)
	}
	cl = d.client(t)
	eventsAfter := sandboxEvents(t, cl, run)
	if len(eventsAfter) < len(eventsBefore) || !slices.EqualFunc(eventsBefore, eventsAfter[:len(eventsBefore)], func(a, b torpor.Event) bool { return a.Seq == b.Seq && a.Type == b.Type }) {
		t.Fatalf("events before the copy %v are not the start of those after %v", types(eventsBefore), types(eventsAfter))
	}
	usageAfter, err := cl.Usage(context.Background(), client.UsageQuery{Sandbox: run})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range usageBefore.Rows {
		if r.Open {
			continue
		}
		if !slices.ContainsFunc(usageAfter.Rows, func(a torpor.UsageRecord) bool { return a.Seq == r.Seq && a.Start.Equal(r.Start) && a.End.Equal(r.End) }) {
			t.Errorf("ledger row %+v did not move", r)
		}
	}
	d.ok("start", paused)
	d.ok("exec", paused, "--", "true")
	for _, id := range []string{run, paused} {
		if _, err := cl.Delete(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		checkLedgerOnce(t, d, cl, id)
	}
}

// TestCrashMatrixRuncPostgres is TestCrashMatrixRunc on the PostgreSQL
// store: a daemon killed at every failpoint reconciles from PostgreSQL
// exactly as it does from SQLite.
func TestCrashMatrixRuncPostgres(t *testing.T) {
	needs(t)
	url := pgtest.New(t).NewDatabase(t)
	// The rig's cleanup, registered after the server's, runs before it.
	rig := newCrashRig(t, "runc", []string{"TORPOR_STORE=" + url}, nil)
	cases := crashCases([]torpor.PauseMode{torpor.PauseFreeze})
	rig.mustCoverFailpoints(cases, lifecycle.InBetweenFailpoints()...)
	rig.run(t, cases)
}

// BenchmarkStorePostgresVsSQLite: pause + resume and create-to-running
// through the API on a daemon whose store is SQLite and on one whose store
// is PostgreSQL (a local server with fsync on, as SQLite's synchronous=FULL
// is), taking turns iteration by iteration so that a noisy machine's load
// falls on both alike. It reports each one's p50 and p99 and the ratios
// PostgreSQL over SQLite (BENCHMARKS.md). Run with -benchtime=200x.
func BenchmarkStorePostgresVsSQLite(b *testing.B) {
	needsB(b)
	url := pgtest.NewDurable(b).NewDatabase(b)
	bin := torporBin(b)
	stores := []struct {
		name string
		d    *daemon
	}{
		{"sqlite", startDaemon(b, bin, b.TempDir())},
		{"postgres", startDaemon(b, bin, b.TempDir(), "TORPOR_STORE="+url)},
	}
	ctx := context.Background()
	type lat struct{ pause, resume, create latencies }
	got := make([]lat, len(stores))
	ids := make([]string, len(stores))
	for i, s := range stores {
		sb, err := s.d.client(b).Create(ctx, torpor.CreateRequest{Template: "base"})
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = sb.ID
	}
	for b.Loop() {
		for i, s := range stores {
			cl := s.d.client(b)
			t0 := time.Now()
			if _, err := cl.Pause(ctx, ids[i], ""); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if _, err := cl.Start(ctx, ids[i]); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
			if err != nil {
				b.Fatal(err)
			}
			t3 := time.Now()
			if _, err := cl.Delete(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			got[i].pause = append(got[i].pause, t1.Sub(t0))
			got[i].resume = append(got[i].resume, t2.Sub(t1))
			got[i].create = append(got[i].create, t3.Sub(t2))
		}
	}
	for i, s := range stores {
		got[i].pause.report(b, s.name+"-pause-")
		got[i].resume.report(b, s.name+"-resume-")
		got[i].create.report(b, s.name+"-create-")
	}
	sq, pg := got[0], got[1]
	for _, m := range []struct {
		name   string
		pg, sq latencies
	}{{"pause", pg.pause, sq.pause}, {"resume", pg.resume, sq.resume}, {"create", pg.create, sq.create}} {
		b.ReportMetric(m.pg.pct(0.5)/m.sq.pct(0.5), m.name+"-p50-pg/sqlite")
		b.ReportMetric(m.pg.pct(0.99)/m.sq.pct(0.99), m.name+"-p99-pg/sqlite")
	}
}

// With TORPOR_E2E_POSTGRES=1 a plain startDaemon is on the PostgreSQL
// store, and a restart over the same data dir finds the same database.
func TestPostgresModeUsesPostgres(t *testing.T) {
	needs(t)
	if os.Getenv(postgresEnv) == "" {
		t.Skip(postgresEnv + " is not set: the e2e daemons use SQLite")
	}
	bin, dataDir := torporBin(t), t.TempDir()
	d := startDaemon(t, bin, dataDir)
	id := strings.TrimSpace(d.ok("create"))
	d.stop()
	if !strings.Contains(d.logs.String(), `store="postgres://`) {
		t.Fatalf("the daemon's store is not PostgreSQL:\n%s", d.logs.String())
	}
	if _, err := os.Stat(filepath.Join(dataDir, "torpor.db")); err == nil {
		t.Error("the daemon made a SQLite file")
	}
	d = startDaemon(t, bin, dataDir)
	if sb := d.get(id); sb.State != torpor.StateRunning {
		t.Fatalf("after a restart the sandbox is %s", sb.State)
	}
}
