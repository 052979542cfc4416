package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// TestRetriesAFullNode: a 409 capacity refusal is retried with backoff and
// reported; other errors are not retried.
func TestRetriesAFullNode(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch n := calls.Add(1); {
		case r.URL.Path == "/v1/sandboxes/nope":
			w.WriteHeader(404)
			w.Write([]byte(`{"error":{"code":"not_found","message":"no sandbox"}}`))
		case n <= 2:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(409)
			w.Write([]byte(`{"error":{"code":"conflict","reason":"capacity","message":"the node is full"}}`))
		default:
			w.WriteHeader(201)
			w.Write([]byte(`{"id":"abc","state":"running"}`))
		}
	}))
	defer srv.Close()
	cl, _ := client.New(srv.URL, "k")
	var waits []time.Duration
	cl = cl.WithRetry(client.RetryPolicy{Attempts: 5, MaxWait: time.Millisecond, OnRetry: func(err error, attempt int, wait time.Duration) {
		if !client.IsCapacity(err) {
			t.Errorf("retried a non-capacity error: %v", err)
		}
		waits = append(waits, wait)
	}})
	sb, err := cl.Create(context.Background(), torpor.CreateRequest{Template: "base"})
	if err != nil || sb.ID != "abc" {
		t.Fatalf("create: %+v %v", sb, err)
	}
	if len(waits) != 2 || calls.Load() != 3 {
		t.Fatalf("%d retries, %d calls; want 2 and 3", len(waits), calls.Load())
	}
	calls.Store(10)
	if _, err := cl.Get(context.Background(), "nope"); !client.IsNotFound(err) || len(waits) != 2 {
		t.Fatalf("not_found: %v after %d retries", err, len(waits))
	}
	// Out of attempts: the capacity error comes back.
	calls.Store(0)
	cl = cl.WithRetry(client.RetryPolicy{Attempts: 2, MaxWait: time.Millisecond})
	if _, err := cl.Create(context.Background(), torpor.CreateRequest{Template: "base"}); !client.IsCapacity(err) {
		t.Fatalf("after the last attempt: %v", err)
	}
}
