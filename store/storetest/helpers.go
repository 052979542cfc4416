package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// base is the fixed instant the fixtures are built around. It has a
// non-zero microsecond part, which a store must keep.
func base() time.Time { return time.Date(2025, time.March, 14, 15, 9, 26, 535897000, time.UTC) }

// at returns base plus d.
func at(d time.Duration) time.Time { return base().Add(d) }

// fullSandbox returns a sandbox with every field set to a non-zero value
// (checked by requireAllSet), so that a round trip covers them all.
func fullSandbox(id, tenant string) *torpor.Sandbox {
	exit := 137
	wakeExit := 3
	autoResume := true
	terminated := at(3*time.Hour + 7*time.Microsecond)
	endAt := at(5*time.Hour + 9*time.Microsecond)
	return &torpor.Sandbox{
		ID:         id,
		Tenant:     tenant,
		Template:   "python-3.12",
		State:      torpor.StateTerminated,
		StateSince: at(3*time.Hour + 7*time.Microsecond),
		Failure: &torpor.Failure{
			Code:     torpor.FailureEntrypoint,
			Message:  "entrypoint exited with status 137",
			ExitCode: &exit,
		},
		CreatedAt:      at(0),
		LastActivityAt: at(90*time.Minute + 3*time.Microsecond),
		TerminatedAt:   &terminated,
		Resources:      torpor.Resources{VCPUs: 1.5, MemoryMiB: 2048, Pids: 512, DiskMiB: 10240},
		Metadata: map[string]string{
			"app.kubernetes.io/name": "web",
			"owner":                  "ada",
			"ünïcode key":            "✓ value",
		},
		Runtime: torpor.RuntimeConfig{
			Kind:       "runc",
			Setup:      []string{"pip install -r requirements.txt", `echo "ready" > /tmp/ready`},
			Entrypoint: []string{"python", "-m", "http.server", "8080"},
		},
		PauseModes:      []torpor.PauseMode{torpor.PauseFreeze, torpor.PauseSnapshot},
		PauseMode:       torpor.PauseSnapshot,
		Boots:           3,
		Env:             map[string]string{"API_TOKEN": "s3cr3t", "EMPTY": ""},
		Handle:          `{"bundle":"/var/lib/torpor/sandboxes/x","pid":4242}`,
		Timeout:         torpor.Seconds(300),
		EndAt:           &endAt,
		EndAfterSeconds: 900,
		OnEnd:           torpor.ActionPause,
		Lifecycle:       &torpor.Lifecycle{OnTimeout: torpor.ActionPause, AutoResume: &autoResume, PauseMode: torpor.PauseSnapshot},
		LifecyclePolicy: torpor.LifecyclePolicy{
			PauseAfterIdleSeconds:         torpor.Off(),
			HibernateAfterPausedSeconds:   torpor.Seconds(600),
			ConnectionIdleSeconds:         torpor.Seconds(30),
			ArchiveAfterHibernatedSeconds: torpor.Seconds(86400),
		},
		Archive:               &torpor.ArchiveInfo{Key: "archives/sb/3-abc.tar.zst", Kind: "snapshot", Bytes: 12345, ArchivedAt: at(2*time.Hour + 29*time.Microsecond)},
		RestoredFromArchiveAt: ptime(at(time.Hour + 31*time.Microsecond)),
		Checkpoints: []torpor.CheckpointInfo{{Name: "before", State: torpor.CheckpointReady, CreatedAt: at(time.Hour + 37*time.Microsecond),
			SizeBytes: 1 << 20, Kind: torpor.CheckpointDisk, Method: "reflink"}},
		Forking:             &torpor.ForkOp{ID: "fk1", Children: []string{"sb_kid1", "sb_kid2"}, TempCheckpoint: "fork-fk1"},
		ForkOp:              "fk0",
		RestoringCheckpoint: "before",
		Meters: torpor.Meters{UsageSeconds: torpor.UsageSeconds{RunningS: 1.5, FrozenS: 2.25, SnapshotPausedS: 3, HibernatedS: 4, ArchivedS: 5.5, ResidentS: 3.75, BilledS: 3.75}, Cost: 0.0125,
			Pauses: 1, AutoPaused: 2, Resumes: 3, AutoResumed: 4, Hibernations: 5, AutoHibernated: 6},
		Usage: torpor.UsageState{Kind: torpor.UsageSnapshotPaused, Since: at(2*time.Hour + 13*time.Microsecond),
			SeenAt: at(2*time.Hour + 17*time.Microsecond)},
		Snapshot:      &torpor.SnapshotInfo{Path: "/var/lib/torpor/sandboxes/x/snapshot", SizeBytes: 158 << 20},
		AllowInternet: true,
		Network:       &torpor.NetworkRules{AllowOut: []string{"203.0.113.0/24", "198.51.100.7"}, DenyOut: []string{"203.0.113.9"}},
		Accel:         &torpor.Accel{GPUs: 1, VRAMMiB: 16384, SuspendMode: "transparent", IdleTimeoutS: 900},
		KeyID:         "key_abc",
		Pool:          "base",
		FromPool:      true,
		Node:          "node-a",
		NodeEpoch:     3,
		NodeLabels:    map[string]string{"disk": "ssd"},
		Durability:    torpor.DurabilityRemote,
		Remote: &torpor.RemoteState{Manifest: "sandboxes/sb/manifest.json", Bytes: 1 << 30, Boots: 3,
			UploadedAt: at(2*time.Hour + 19*time.Microsecond), Host: "vm: qemu 7.2.22; accel kvm"},
		Hooks: []torpor.Hook{
			{Type: torpor.HookScript, On: torpor.HookOnStart, Path: "/app/restore.sh", Arguments: []string{"--from", "/data"}, Port: 1, Wait: true, TimeoutSeconds: 60},
			{Type: torpor.HookHTTP, On: torpor.HookOnPause, Path: "/hooks/flush", Port: 3000, TimeoutSeconds: 30},
		},
		IgnoreImageHooks: true,
		Ports:            []torpor.PortSpec{{Port: 8080, Public: true}, {Port: 9000}},
		TrafficToken:     "tt_abc",
		Secrets:          []torpor.SecretRef{{Name: "db", Env: "DB_PASSWORD"}, {Name: "tls.key", Path: "/run/secrets/tls.key"}},
		VolumeMounts:     []torpor.VolumeMount{{Name: "data", Path: "/data"}, {Name: "models", Path: "/models", ReadOnly: true}},
		Wakeups: []torpor.Wakeup{
			{ID: "wk_a", WakeupSpec: torpor.WakeupSpec{WakeSchedule: "0 3 * * *", TimeZone: "Europe/Paris", Cmd: []string{"./nightly.sh"}, TimeoutSeconds: 60},
				CreatedAt: at(time.Hour), NextAt: ptime(at(3 * time.Hour)), RetryAt: ptime(at(2*time.Hour + 23*time.Microsecond)), Waiting: "capacity", Runs: 2,
				LastResult: &torpor.WakeupResult{DueAt: at(2 * time.Hour), StartedAt: at(2*time.Hour + 21*time.Microsecond), Late: true, Missed: 1,
					WokeFrom: torpor.StateHibernated, Status: torpor.WakeupDone, FinishedAt: ptime(at(2*time.Hour + 22*time.Microsecond)),
					ExitCode: &wakeExit, TimedOut: true, Output: "ok\n", Error: "x"}},
			{ID: "wk_b", WakeupSpec: torpor.WakeupSpec{WakeAt: ptime(at(4 * time.Hour))}, CreatedAt: at(time.Hour), NextAt: ptime(at(4 * time.Hour))},
		},
		HookFailure: &torpor.HookFailure{On: torpor.HookOnStart, Index: 1, Type: torpor.HookScript,
			Message: "exited with status 2", At: at(2*time.Hour + 11*time.Microsecond)},
		// CreateSandbox ignores it and starts at 1.
		Version: 99,
	}
}

// newSandbox returns a plain sandbox in state st created at created.
func newSandbox(id, tenant string, st torpor.State, created time.Time) *torpor.Sandbox {
	return &torpor.Sandbox{
		ID:             id,
		Tenant:         tenant,
		Template:       "base",
		State:          st,
		StateSince:     created,
		CreatedAt:      created,
		LastActivityAt: created,
		PauseModes:     []torpor.PauseMode{torpor.PauseFreeze},
	}
}

// event returns an event of type typ about sb.
func event(sb *torpor.Sandbox, typ string, when time.Time, attrs map[string]string) torpor.Event {
	return torpor.Event{Type: typ, SandboxID: sb.ID, Tenant: sb.Tenant, Time: when, Attrs: attrs}
}

// create stores sb or fails the test.
func (h *harness) create(sb *torpor.Sandbox, events ...torpor.Event) {
	h.t.Helper()
	if err := h.s.CreateSandbox(h.t.Context(), sb, events...); err != nil {
		h.t.Fatalf("CreateSandbox(%q): %v", sb.ID, err)
	}
}

// update stores sb or fails the test.
func (h *harness) update(sb *torpor.Sandbox, events ...torpor.Event) {
	h.t.Helper()
	if err := h.s.UpdateSandbox(h.t.Context(), sb, events...); err != nil {
		h.t.Fatalf("UpdateSandbox(%q, version %d): %v", sb.ID, sb.Version, err)
	}
}

// get returns the stored sandbox or fails the test.
func (h *harness) get(id string) *torpor.Sandbox {
	h.t.Helper()
	sb, err := h.s.GetSandbox(h.t.Context(), id)
	if err != nil {
		h.t.Fatalf("GetSandbox(%q): %v", id, err)
	}
	if sb == nil {
		h.t.Fatalf("GetSandbox(%q) returned nil and no error", id)
	}
	return sb
}

// list returns the sandboxes that match f or fails the test.
func (h *harness) list(f torpor.SandboxFilter) []*torpor.Sandbox {
	h.t.Helper()
	sbs, err := h.s.ListSandboxes(h.t.Context(), f)
	if err != nil {
		h.t.Fatalf("ListSandboxes(%+v): %v", f, err)
	}
	return sbs
}

// events returns the events that match f or fails the test.
func (h *harness) events(f torpor.EventFilter) []torpor.Event {
	h.t.Helper()
	evs, err := h.s.ListEvents(h.t.Context(), f)
	if err != nil {
		h.t.Fatalf("ListEvents(%+v): %v", f, err)
	}
	return evs
}

// ids returns the ids of sbs, in order.
func ids(sbs []*torpor.Sandbox) []string {
	out := make([]string, len(sbs))
	for i, sb := range sbs {
		out[i] = sb.ID
	}
	return out
}

// types returns the types of evs, in order.
func types(evs []torpor.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// wantIDs fails the test unless got lists exactly the ids want, in order.
func wantIDs(t *testing.T, what string, got []*torpor.Sandbox, want ...string) {
	t.Helper()
	if g := ids(got); !slices.Equal(g, want) {
		t.Errorf("%s: got sandboxes %q, want %q", what, g, want)
	}
}

// wantCode fails the test unless err is (or wraps) a *torpor.Error with
// the given code.
func wantCode(t *testing.T, err error, code torpor.ErrorCode, what string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: succeeded, want a %s error", what, code)
	}
	var e *torpor.Error
	if !errors.As(err, &e) {
		t.Fatalf("%s: got %v (%T), want a *torpor.Error with code %s", what, err, err, code)
	}
	if e.Code != code {
		t.Fatalf("%s: got code %s (%v), want %s", what, e.Code, err, code)
	}
}

// checkSandbox fails the test if got differs from want in any field.
func checkSandbox(t *testing.T, what string, got, want *torpor.Sandbox) {
	t.Helper()
	checkSame(t, what, got, want)
}

// checkSame fails the test if the structs got and want (or pointers to
// them) differ in any field. Times must be in UTC and equal.
func checkSame(t *testing.T, what string, got, want any) {
	t.Helper()
	if d := diff(got, want); len(d) > 0 {
		t.Errorf("%s differs:\n\t%s", what, strings.Join(d, "\n\t"))
	}
}

// diff lists, field by field, how the structs got and want differ.
func diff(got, want any) []string {
	g, w := reflect.ValueOf(got), reflect.ValueOf(want)
	if g.Kind() == reflect.Pointer {
		if g.IsNil() || w.IsNil() {
			if g.IsNil() != w.IsNil() {
				return []string{fmt.Sprintf("got %s, want %s", show(g), show(w))}
			}
			return nil
		}
		g, w = g.Elem(), w.Elem()
	}
	var out []string
	for i := range g.NumField() {
		name := g.Type().Field(i).Name
		if d := diffValue(g.Field(i), w.Field(i)); d != "" {
			out = append(out, name+": "+d)
		}
	}
	return out
}

// diffValue says how one field differs, or returns "".
func diffValue(g, w reflect.Value) string {
	switch g.Type() {
	case reflect.TypeFor[time.Time]():
		return diffTime(g.Interface().(time.Time), w.Interface().(time.Time))
	case reflect.TypeFor[*time.Time]():
		gt, wt := g.Interface().(*time.Time), w.Interface().(*time.Time)
		if gt == nil || wt == nil {
			if gt != wt {
				return fmt.Sprintf("got %s, want %s", show(g), show(w))
			}
			return ""
		}
		return diffTime(*gt, *wt)
	}
	if !reflect.DeepEqual(g.Interface(), w.Interface()) {
		return fmt.Sprintf("got %s, want %s", show(g), show(w))
	}
	return ""
}

func diffTime(got, want time.Time) string {
	switch {
	case !got.Equal(want):
		return fmt.Sprintf("got %s, want %s", got.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano))
	case got.Location() != time.UTC:
		return fmt.Sprintf("got %s in %s, want it in UTC", got.Format(time.RFC3339Nano), got.Location())
	}
	return ""
}

// show formats v as JSON, which shows nil (null) apart from empty ({} or
// []) and follows pointers.
func show(v reflect.Value) string {
	b, err := json.Marshal(v.Interface())
	if err != nil {
		return fmt.Sprintf("%#v", v.Interface())
	}
	return string(b)
}

// requireAllSet fails the test if any field of the struct v points to,
// nested structs included, is zero: a fixture that leaves a field unset
// does not prove the store keeps it. A field added to torpor.Sandbox
// fails here until the fixture, and then the store, carry it.
func requireAllSet(t *testing.T, v any) {
	t.Helper()
	rv := reflect.Indirect(reflect.ValueOf(v))
	for _, path := range zeroFields(rv, rv.Type().Name()) {
		t.Fatalf("storetest: the fixture leaves %s unset; set it so the round trip covers it", path)
	}
}

func zeroFields(v reflect.Value, path string) []string {
	if v.Type() == reflect.TypeFor[time.Time]() {
		if v.IsZero() {
			return []string{path}
		}
		return nil
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return []string{path}
		}
		return zeroFields(v.Elem(), path)
	case reflect.Struct:
		switch v.Type() {
		case reflect.TypeFor[torpor.Schedule]():
			return nil // derived by the engine, never stored
		case reflect.TypeFor[torpor.OptSeconds]():
			if !v.Interface().(torpor.OptSeconds).Set {
				return []string{path}
			}
			return nil // its parts are a value, null or absent: Set is what counts
		}
		var out []string
		for i := range v.NumField() {
			if f := v.Type().Field(i).Name; v.Type() == reflect.TypeFor[torpor.Sandbox]() && (f == "GPU" || f == "Address") {
				continue // live views, never stored
			}
			out = append(out, zeroFields(v.Field(i), path+"."+v.Type().Field(i).Name)...)
		}
		return out
	case reflect.Map, reflect.Slice:
		if v.Len() == 0 {
			return []string{path}
		}
		return nil
	}
	if v.IsZero() {
		return []string{path}
	}
	return nil
}
