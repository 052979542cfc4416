package e2e

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// waitProcessOutput reads a process's output from offset until it holds
// want; it returns what it read and the offset after it.
func waitProcessOutput(t *testing.T, cl *client.Client, id string, pid int, offset int64, want string) (string, int64) {
	t.Helper()
	var got strings.Builder
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := cl.ProcessOutput(context.Background(), id, pid, offset)
		if err != nil {
			t.Fatalf("output of %d: %v", pid, err)
		}
		got.WriteString(out.Data)
		offset = out.Next
		if strings.Contains(got.String(), want) {
			return got.String(), offset
		}
		if out.Ended || time.Now().After(deadline) {
			t.Fatalf("output of %d: want %q, got %q (ended %v)", pid, want, got.String(), out.Ended)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestBackgroundProcesses(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	cl := d.client(t)
	ctx := context.Background()
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := cl.StartProcess(ctx, sb.ID, client.ProcessRequest{Cmd: []string{"sh", "-c", "while read l; do echo got $l; done"}})
	if err != nil || p.ID != 1 || p.Pid == 0 || p.State != torpor.ProcessRunning {
		t.Fatalf("spawn: %+v %v", p, err)
	}
	if err := cl.WriteProcessStdin(ctx, sb.ID, p.ID, "one\n", false); err != nil {
		t.Fatal(err)
	}
	if out, next := waitProcessOutput(t, cl, sb.ID, p.ID, 0, "got one\n"); out != "got one\n" || next != 8 {
		t.Fatalf("from 0: %q %d", out, next)
	}
	// The CLI sends too; a later offset reads only what follows.
	d.ok("send", sb.ID, "1", "two\n")
	if out, _ := waitProcessOutput(t, cl, sb.ID, p.ID, 8, "got two\n"); out != "got two\n" {
		t.Fatalf("from 8: %q", out)
	}
	if out := d.ok("logs", sb.ID, "1"); out != "got one\ngot two\n" {
		t.Fatalf("torpor logs: %q", out)
	}

	// Pause + resume keeps it running, same pid.
	if _, err := cl.Pause(ctx, sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	list, err := cl.ListProcesses(ctx, sb.ID)
	if err != nil || len(list) != 1 || list[0].State != torpor.ProcessRunning || list[0].Pid != p.Pid {
		t.Fatalf("after pause/resume: %+v (pid was %d) %v", list, p.Pid, err)
	}
	if err := cl.WriteProcessStdin(ctx, sb.ID, p.ID, "three\n", false); err != nil {
		t.Fatal(err)
	}
	waitProcessOutput(t, cl, sb.ID, p.ID, 16, "got three\n")

	// TERM ends it; following its output ends with the status.
	d.ok("kill", sb.ID, "1", "-s", "TERM")
	var buf bytes.Buffer
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	end, err := cl.FollowProcessOutput(fctx, sb.ID, p.ID, 8, &buf)
	cancel()
	if err != nil || !end.Ended || end.ExitCode == nil || *end.ExitCode != 128+15 || buf.String() != "got two\ngot three\n" {
		t.Fatalf("after TERM: %q %+v %v", buf.String(), end, err)
	}
	list, err = cl.ListProcesses(ctx, sb.ID)
	if err != nil || len(list) != 1 || list[0].State != torpor.ProcessExited {
		t.Fatalf("exited: %+v %v", list, err)
	}

	// Another one; hibernate + start: both listed as gone.
	if out := d.ok("spawn", sb.ID, "--", "sleep", "300"); strings.TrimSpace(out) != "2" {
		t.Fatalf("torpor spawn: %q", out)
	}
	if _, err := cl.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	list, err = cl.ListProcesses(ctx, sb.ID)
	if err != nil || len(list) != 2 || list[0].State != torpor.ProcessGone || list[1].State != torpor.ProcessGone {
		t.Fatalf("after hibernate: %+v %v", list, err)
	}
	if out := d.ok("ps", sb.ID); !strings.Contains(out, "gone") || !strings.Contains(out, "sleep 300") {
		t.Fatalf("torpor ps: %q", out)
	}
	if _, err := cl.ProcessOutput(ctx, sb.ID, 2, 0); !client.IsGone(err) {
		t.Fatalf("output of a gone process: %v", err)
	}
	// Clear 400s for what cannot start.
	if _, err := cl.StartProcess(ctx, sb.ID, client.ProcessRequest{Cmd: []string{"/nope"}}); !client.IsInvalid(err) {
		t.Fatalf("missing program: %v", err)
	}
	if _, err := cl.StartProcess(ctx, sb.ID, client.ProcessRequest{Cmd: []string{"true"}, Cwd: "/nope"}); !client.IsInvalid(err) || !strings.Contains(err.Error(), "cwd") {
		t.Fatalf("missing cwd: %v", err)
	}
}
