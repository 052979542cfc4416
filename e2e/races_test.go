package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// TestPauseWaitsForAnExecInFlight: a pause that comes while a command
// runs returns only once the command ended; the command exits 0 with its
// output, and the sandbox is paused.
func TestPauseWaitsForAnExecInFlight(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	cl := d.client(t)
	ctx := context.Background()
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		res *client.ExecResult
		err error
		at  time.Time
	}
	execDone := make(chan outcome, 1)
	go func() {
		res, err := cl.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"sh", "-c", "sleep 0.5; echo done"}})
		execDone <- outcome{res, err, time.Now()}
	}()
	time.Sleep(50 * time.Millisecond)
	asked := time.Now()
	got, err := cl.Pause(ctx, sb.ID, "")
	pausedAt := time.Now()
	if err != nil {
		t.Fatalf("pause: %v\n%s", err, d.logs.String())
	}
	// The pause waited for the command: it cannot have returned before
	// the command's last 0.4 s had passed.
	if took := pausedAt.Sub(asked); took < 300*time.Millisecond {
		t.Fatalf("the pause returned after %s, before the command in flight ended", took)
	}
	var ex outcome
	select {
	case ex = <-execDone:
	case <-time.After(10 * time.Second):
		t.Fatalf("the exec under the pause did not return\n%s", d.logs.String())
	}
	if ex.err != nil || ex.res.ExitCode != 0 || ex.res.Stdout != "done\n" {
		t.Fatalf("the exec under the pause: %+v %v, %s after the pause was asked\n%s",
			ex.res, ex.err, ex.at.Sub(asked), d.logs.String())
	}
	if got.State != torpor.StatePaused {
		t.Fatalf("after the pause: %s", got.State)
	}
	if sb := d.get(sb.ID); sb.State != torpor.StatePaused {
		t.Fatalf("the sandbox is %s, want paused", sb.State)
	}
}

// TestPauseAndExecStorm: execs in a loop beside a pause/start loop on the
// same sandboxes. Every request comes back within a bound, and none is a
// server error: an exec that meets a pause either finishes before it or
// is a conflict.
func TestPauseAndExecStorm(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	cl := d.client(t)
	ctx := context.Background()
	const (
		sandboxes = 2
		storm     = 8 * time.Second
		bound     = 15 * time.Second
	)
	var ids []string
	for range sandboxes {
		sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	var (
		mu       sync.Mutex
		problems []string
		counts   = map[string]int{}
	)
	// call runs one request within the bound and records what is wrong
	// with its outcome.
	call := func(verb, id string, fn func(ctx context.Context) error) {
		cctx, cancel := context.WithTimeout(ctx, bound+5*time.Second)
		defer cancel()
		start := time.Now()
		err := fn(cctx)
		took := time.Since(start)
		mu.Lock()
		defer mu.Unlock()
		counts[verb]++
		switch code := torpor.ErrorCodeOf(err); {
		case took > bound:
			problems = append(problems, fmt.Sprintf("%s on %s took %s (%v)", verb, id, took, err))
		case code == torpor.EInternal || code == torpor.EUnavailable:
			problems = append(problems, fmt.Sprintf("%s on %s: %v", verb, id, err))
		case err != nil:
			counts[verb+" "+string(code)]++
		}
	}
	end := time.Now().Add(storm)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				call("exec", id, func(ctx context.Context) error {
					res, err := cl.Exec(ctx, id, client.ExecRequest{Cmd: []string{"true"}})
					if err == nil && res.ExitCode != 0 {
						return fmt.Errorf("true exited %d", res.ExitCode)
					}
					return err
				})
			}
		}()
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				call("pause", id, func(ctx context.Context) error { _, err := cl.Pause(ctx, id, ""); return err })
				call("start", id, func(ctx context.Context) error { _, err := cl.Start(ctx, id); return err })
			}
		}()
	}
	wg.Wait()
	t.Logf("requests: %v", counts)
	if len(problems) > 0 {
		t.Fatalf("%d requests went wrong, among them:\n%v\ndaemon log:\n%s", len(problems), problems[:min(len(problems), 20)], d.logs.String())
	}
	for _, id := range ids {
		if sb := d.get(id); sb.State != torpor.StateRunning && sb.State != torpor.StatePaused {
			t.Fatalf("sandbox %s ended the storm %s", id, sb.State)
		}
	}
}
