package e2e

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// TestDiskMiBIsEnforced: a sandbox created with disk_mib 64 that writes
// 100 MiB gets "No space left on device" inside and keeps running; its
// files survive hibernation on the same limited disk.
func TestDiskMiBIsEnforced(t *testing.T) {
	needs(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs loop devices (modprobe loop)")
	}
	d := startDaemon(t, torporBin(t), t.TempDir())
	cl := d.client(t)
	ctx := context.Background()
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: &torpor.Resources{DiskMiB: 64}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := cl.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"dd", "if=/dev/zero", "of=/big", "bs=1M", "count=100"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
		t.Fatalf("dd of 100 MiB into 64: exit %d, %q", res.ExitCode, res.Stderr)
	}
	if out := d.ok("exec", sb.ID, "--", "sh", "-c", "rm /big; echo kept > /kept; echo ok"); out != "ok\n" {
		t.Fatalf("after the disk filled: %q", out)
	}
	if got := d.get(sb.ID); got.State != torpor.StateRunning {
		t.Fatalf("after the disk filled: %s", got.State)
	}
	d.ok("hibernate", sb.ID)
	d.ok("start", sb.ID)
	if out := d.ok("exec", sb.ID, "--", "cat", "/kept"); out != "kept\n" {
		t.Fatalf("after hibernation: %q", out)
	}
	if res, err := cl.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"dd", "if=/dev/zero", "of=/big", "bs=1M", "count=100"}}); err != nil || res.ExitCode == 0 {
		t.Fatalf("dd of 100 MiB into 64 after hibernation: %+v %v", res, err)
	}
	d.ok("rm", sb.ID)
	assertNoTrace(t, sb.ID)
}
