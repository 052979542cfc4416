package e2b_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/e2b"
)

// secretAnswer is what the SDK's Secret class reads.
type secretAnswer struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int64             `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      time.Time         `json:"createdAt"`
	UpdatedAt      time.Time         `json:"updatedAt"`
}

// secretLog serves the fixture's engine and store again with a logger
// that keeps every line, to search for values.
func secretLog(f *fixture) *bytes.Buffer {
	var buf bytes.Buffer
	api := e2b.New(e2b.Config{Engine: f.eng, Auth: f.store, TemplateStore: f.store, Templates: f.tmpls,
		Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	hs := httptest.NewServer(api)
	f.t.Cleanup(hs.Close)
	f.url = hs.URL
	return &buf
}

func (f *fixture) secret(r reply, status int) secretAnswer {
	f.t.Helper()
	if r.status != status {
		f.t.Fatalf("answer %d %s, want %d", r.status, r.body, status)
	}
	var s secretAnswer
	r.decode(f.t, &s)
	return s
}

func TestSecretsThroughE2B(t *testing.T) {
	f := newFixture(t)
	log := secretLog(f)
	const v1, v2 = "hunter2-e2b-first-value", "hunter2-e2b-second-value"
	var answers [][]byte
	do := func(method, path, key, body string) reply {
		r := f.do(method, path, key, body)
		answers = append(answers, r.body)
		return r
	}

	// Create: the name lower-cased, version 1, metadata empty, 201.
	created := f.secret(do("POST", "/secrets", f.acme, `{"name":"OpenAI-Key","value":"`+v1+`"}`), http.StatusCreated)
	if created.Name != "openai-key" || created.CurrentVersion != 1 || created.Metadata == nil || len(created.Metadata) != 0 ||
		!strings.HasPrefix(created.SecretID, "sec_") || created.CreatedAt.IsZero() || !created.UpdatedAt.Equal(created.CreatedAt) {
		t.Fatalf("created %+v", created)
	}
	// It is the native secret: same store, same value, sealed.
	if sec, err := f.eng.GetSecret(ctx, "acme", "openai-key"); err != nil || sec.Version != 1 {
		t.Fatalf("native view %+v %v", sec, err)
	}
	if v, err := f.store.SecretValue(ctx, "acme", "openai-key"); err != nil || string(v) != v1 {
		t.Fatalf("stored value %q %v", v, err)
	}
	// A second create of the name is a conflict and changes nothing.
	if r := do("POST", "/secrets", f.acme, `{"name":"openai-key","value":"other"}`); r.status != http.StatusConflict {
		t.Fatalf("second create: %d %s", r.status, r.body)
	}
	if v, _ := f.store.SecretValue(ctx, "acme", "openai-key"); string(v) != v1 {
		t.Fatalf("a refused create changed the value to %q", v)
	}

	// Get by identifier, by name, by the name as first written.
	for _, ref := range []string{created.SecretID, "openai-key", "OpenAI-Key"} {
		got := f.secret(do("GET", "/secrets/"+ref, f.acme, ""), http.StatusOK)
		if got.SecretID != created.SecretID || got.Name != "openai-key" || got.CurrentVersion != 1 {
			t.Fatalf("get %s: %+v", ref, got)
		}
	}

	// Update: the version moves, the identifier stays, the value rotates.
	f.clock.Advance(time.Minute)
	up := f.secret(do("POST", "/secrets/"+created.SecretID, f.acme, `{"value":"`+v2+`"}`), http.StatusOK)
	if up.SecretID != created.SecretID || up.CurrentVersion != 2 || !up.UpdatedAt.After(up.CreatedAt) {
		t.Fatalf("updated %+v", up)
	}
	if v, _ := f.store.SecretValue(ctx, "acme", "openai-key"); string(v) != v2 {
		t.Fatalf("value after update %q", v)
	}

	// A secret set natively, with capitals, is the SDK's too.
	if _, err := f.eng.SetSecret(ctx, "acme", "DB_PASSWORD", []byte("native-value")); err != nil {
		t.Fatal(err)
	}
	if got := f.secret(do("GET", "/secrets/DB_PASSWORD", f.acme, ""), http.StatusOK); got.Name != "DB_PASSWORD" {
		t.Fatalf("native secret through E2B: %+v", got)
	}
	var list []secretAnswer
	r := do("GET", "/secrets", f.acme, "")
	r.decode(t, &list)
	if r.status != http.StatusOK || len(list) != 2 || list[0].Name != "DB_PASSWORD" || list[1].Name != "openai-key" || r.header.Get("X-Next-Token") != "" {
		t.Fatalf("list %d %s", r.status, r.body)
	}

	// Delete: 204, then gone (destroy answers false on 404).
	if r := do("DELETE", "/secrets/"+created.SecretID, f.acme, ""); r.status != http.StatusNoContent {
		t.Fatalf("delete %d %s", r.status, r.body)
	}
	for _, rq := range [][2]string{{"GET", ""}, {"DELETE", ""}, {"POST", `{"value":"x"}`}} {
		if r := do(rq[0], "/secrets/"+created.SecretID, f.acme, rq[1]); r.status != http.StatusNotFound {
			t.Fatalf("%s of a deleted secret: %d %s", rq[0], r.status, r.body)
		}
	}
	if _, err := f.eng.GetSecret(ctx, "acme", "openai-key"); err == nil {
		t.Fatal("the native secret outlived an E2B delete")
	}
	// Made again, it is another secret: another identifier.
	again := f.secret(do("POST", "/secrets", f.acme, `{"name":"openai-key","value":"`+v1+`"}`), http.StatusCreated)
	if again.SecretID == created.SecretID || again.CurrentVersion != 1 {
		t.Fatalf("made again %+v (was %s)", again, created.SecretID)
	}

	for _, body := range answers {
		for _, v := range []string{v1, v2, "native-value"} {
			if bytes.Contains(body, []byte(v)) {
				t.Fatalf("an answer holds a value: %s", body)
			}
		}
	}
	for _, v := range []string{v1, v2, "native-value"} {
		if strings.Contains(log.String(), v) {
			t.Fatalf("the log holds a value:\n%s", log)
		}
	}
	if !strings.Contains(log.String(), "/secrets") {
		t.Fatalf("nothing was logged; the log check proves nothing:\n%s", log)
	}
}

func TestSecretsAreTheTenants(t *testing.T) {
	f := newFixture(t)
	mine := f.secret(f.do("POST", "/secrets", f.acme, `{"name":"token","value":"acme-value"}`), http.StatusCreated)
	// Another tenant finds it neither by identifier nor by name.
	for _, ref := range []string{mine.SecretID, "token"} {
		for _, rq := range [][2]string{{"GET", ""}, {"POST", `{"value":"stolen"}`}, {"DELETE", ""}} {
			if r := f.do(rq[0], "/secrets/"+ref, f.other, rq[1]); r.status != http.StatusNotFound {
				t.Fatalf("other tenant %s %s: %d %s", rq[0], ref, r.status, r.body)
			}
		}
	}
	var list []secretAnswer
	if r := f.do("GET", "/secrets", f.other, ""); r.status != http.StatusOK || json.Unmarshal(r.body, &list) != nil || len(list) != 0 {
		t.Fatalf("other tenant's list %d %s", r.status, r.body)
	}
	// Its own of the same name is another secret.
	theirs := f.secret(f.do("POST", "/secrets", f.other, `{"name":"token","value":"other-value"}`), http.StatusCreated)
	if theirs.SecretID == mine.SecretID {
		t.Fatal("two tenants' secrets share an identifier")
	}
	if v, _ := f.store.SecretValue(ctx, "acme", "token"); string(v) != "acme-value" {
		t.Fatalf("acme's value is now %q", v)
	}
	if r := f.do("GET", "/secrets", "", ""); r.status != http.StatusUnauthorized {
		t.Fatalf("no key: %d", r.status)
	}
}

func TestSecretsListPages(t *testing.T) {
	f := newFixture(t)
	names := []string{"a1", "b2", "c3", "d4", "e5"}
	for _, n := range names {
		f.secret(f.do("POST", "/secrets", f.acme, `{"name":"`+n+`","value":"v"}`), http.StatusCreated)
	}
	var seen []string
	token, pages := "", 0
	for {
		path := "/secrets?limit=2"
		if token != "" {
			path += "&nextToken=" + token
		}
		r := f.do("GET", path, f.acme, "")
		var page []secretAnswer
		r.decode(t, &page)
		if r.status != http.StatusOK || len(page) > 2 {
			t.Fatalf("page %d %s", r.status, r.body)
		}
		for _, s := range page {
			seen = append(seen, s.Name)
		}
		pages++
		if token = r.header.Get("X-Next-Token"); token == "" {
			break
		}
	}
	if strings.Join(seen, ",") != strings.Join(names, ",") || pages != 3 {
		t.Fatalf("pages gave %v in %d pages", seen, pages)
	}
}

func TestSecretsBadInput(t *testing.T) {
	f := newFixture(t)
	f.secret(f.do("POST", "/secrets", f.acme, `{"name":"kept","value":"kept-value"}`), http.StatusCreated)
	cases := []struct{ method, path, body, param string }{
		{"POST", "/secrets", `{"name":"x"}`, "value"},
		{"POST", "/secrets", `{"value":"v"}`, "name"},
		{"POST", "/secrets", `{"name":"a{b}","value":"v"}`, "name"},
		{"POST", "/secrets", `{"name":"sec_mine","value":"v"}`, "name"},
		{"POST", "/secrets", `{"name":"ok","value":""}`, "value"},
		{"POST", "/secrets", `{"name":"ok","value":"v","metadata":{"team":"a"}}`, "metadata"},
		{"POST", "/secrets", `{"name":"ok","value":"` + strings.Repeat("x", 64*1024+1) + `"}`, "value"},
		{"POST", "/secrets/kept", `{"value":""}`, "value"},
		{"POST", "/secrets/kept", `{"value":"v","metadata":{"a":"b"}}`, "metadata"},
		{"POST", "/secrets/kept", `{"value":1}`, "value"},
		{"GET", "/secrets?limit=0", "", "limit"},
		{"GET", "/secrets?limit=101", "", "limit"},
		{"GET", "/secrets?nextToken=%21%21", "", "nextToken"},
	}
	for _, c := range cases {
		r := f.do(c.method, c.path, f.acme, c.body)
		if r.status != http.StatusBadRequest {
			t.Errorf("%s %s %.60s: %d %s", c.method, c.path, c.body, r.status, r.body)
			continue
		}
		if msg, _ := r.errBody(t)["message"].(string); !strings.Contains(msg, c.param) {
			t.Errorf("%s %s: message %q does not name %s", c.method, c.path, msg, c.param)
		}
	}
	secs, _ := f.eng.ListSecrets(ctx, "acme")
	if len(secs) != 1 || secs[0].Version != 1 {
		t.Fatalf("bad input changed the secrets: %+v", secs)
	}
	if v, _ := f.store.SecretValue(ctx, "acme", "kept"); string(v) != "kept-value" {
		t.Fatalf("value %q", v)
	}
}
