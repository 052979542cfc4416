package api_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
)

// statusLog records the status of every exec the server answers.
type statusLog chan int

func (s statusLog) Request(route string, status int, took time.Duration) {
	if strings.HasSuffix(route, "/exec") {
		s <- status
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestClientThatGoesAwayIsNoInternalError: an exec whose client hangs up
// while the command runs is logged as a client that went away and
// recorded as 499, not as an internal error (500).
func TestClientThatGoesAwayIsNoInternalError(t *testing.T) {
	var logs lockedBuffer
	statuses := make(statusLog, 1)
	f := newFixture(t, func(c *api.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.Requests = statuses
	})
	started := make(chan struct{}, 1)
	f.host.ExecFunc = func(ctx context.Context, id string, req torpor.ExecRequest) (torpor.ExecResult, error) {
		started <- struct{}{}
		<-ctx.Done()
		return torpor.ExecResult{}, ctx.Err()
	}
	sb, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	reqCtx, cancel := context.WithCancel(ctx)
	req, _ := http.NewRequestWithContext(reqCtx, "POST", f.url+"/v1/sandboxes/"+sb.ID+"/exec", strings.NewReader(`{"cmd":["sleep","60"]}`))
	req.Header.Set("Authorization", "Bearer "+f.acmeKey)
	req.Header.Set("Content-Type", "application/json")
	go func() {
		<-started
		cancel() // the client hangs up while the command runs
	}()
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the exec answered %s to a client that went away", resp.Status)
	}
	select {
	case status := <-statuses:
		if status != 499 {
			t.Fatalf("recorded status %d, want 499", status)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the exec of a client that went away was never answered")
	}
	if l := logs.String(); strings.Contains(l, "internal error") || !strings.Contains(l, "client went away") {
		t.Fatalf("log:\n%s", l)
	}
}
