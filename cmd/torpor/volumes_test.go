package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

func TestParseVolumeMounts(t *testing.T) {
	ms, err := parseVolumeMounts([]string{"data:/data", "models:/models:ro", "x:/x:rw"})
	if err != nil || len(ms) != 3 || ms[0] != (torpor.VolumeMount{Name: "data", Path: "/data"}) ||
		ms[1] != (torpor.VolumeMount{Name: "models", Path: "/models", ReadOnly: true}) || ms[2].ReadOnly {
		t.Fatalf("mounts = %+v, %v", ms, err)
	}
	for _, bad := range []string{"data", ":/data", "data:", "data:/d:rx", "a:/b:ro:x"} {
		if _, err := parseVolumeMounts([]string{bad}); err == nil {
			t.Errorf("--volume %q accepted", bad)
		}
	}
}

// The volumes verbs send the routes of docs/api.md, and create's
// --volume the mounts.
func TestVolumesCommands(t *testing.T) {
	var sent []string
	var created map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sent = append(sent, r.Method+" "+r.URL.Path+" "+strings.TrimSpace(string(b)))
		w.Header().Set("Content-Type", "application/json")
		vol := `{"tenant":"acme","name":"data","id":"vol_1","size_mib":64,"node":"","created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z","used_bytes":1048576,"mounted_by":["sb1"]}`
		switch {
		case r.Method == "GET" && r.URL.Path == "/v1/volumes":
			w.Write([]byte(`{"volumes":[` + vol + `]}`))
		case r.Method == "DELETE":
			w.WriteHeader(204)
		case r.URL.Path == "/v1/sandboxes":
			_ = json.Unmarshal(b, &created)
			w.WriteHeader(201)
			w.Write([]byte(`{"id":"sb1","state":"running"}`))
		default:
			w.Write([]byte(vol))
		}
	}))
	defer srv.Close()
	run := func(args ...string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := Run(context.Background(), append([]string{"--url", srv.URL, "--api-key", "k"}, args...), nil, &stdout, &stderr, func(string) string { return "" }); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr.String())
		}
		return stdout.String()
	}
	run("volumes", "create", "data", "64")
	if out := run("volumes", "ls"); !strings.Contains(out, "data") || !strings.Contains(out, "sb1") || !strings.Contains(out, "1.0") {
		t.Fatalf("ls: %q", out)
	}
	run("volumes", "get", "data")
	run("volumes", "resize", "data", "128")
	run("volumes", "rm", "data")
	run("create", "--volume", "data:/data:ro")
	want := []string{
		`POST /v1/volumes {"name":"data","size_mib":64}`,
		`GET /v1/volumes `,
		`GET /v1/volumes/data `,
		`PATCH /v1/volumes/data {"size_mib":128}`,
		`DELETE /v1/volumes/data `,
	}
	for i, w := range want {
		if i >= len(sent) || sent[i] != w {
			t.Fatalf("request %d = %q, want %q (all: %q)", i, sent[min(i, len(sent)-1)], w, sent)
		}
	}
	if ms, _ := json.Marshal(created["volume_mounts"]); string(ms) != `[{"name":"data","path":"/data","read_only":true}]` {
		t.Fatalf("create sent volume_mounts %s", ms)
	}
}
