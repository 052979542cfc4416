package e2e

import (
	"context"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// TestUsageLedgerExactAcrossKillNine drives two sandboxes through random
// transitions while the daemon is killed with SIGKILL at random moments
// and started again, with a settlement every second so that kills land in
// settlements too. Afterwards each sandbox's ledger covers its life from
// creation to deletion with no gap and no overlap, as what its event log
// says it was, and its meters agree with the ledger.
func TestUsageLedgerExactAcrossKillNine(t *testing.T) {
	needs(t)
	bin := torporBin(t)
	dataDir := t.TempDir()
	env := "TORPOR_SETTLE_SECONDS=1"
	d := startDaemon(t, bin, dataDir, env)
	ctx := context.Background()
	var ids []string
	for range 2 {
		ids = append(ids, strings.TrimSpace(d.ok("create")))
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	kills := 0
	for round := range 8 {
		cl := d.client(t)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := ids[rng.IntN(len(ids))]
				switch rng.IntN(4) {
				case 0:
					_, _ = cl.Pause(ctx, id, "")
				case 1:
					_, _ = cl.Start(ctx, id)
				case 2:
					_, _ = cl.Hibernate(ctx, id)
				case 3:
					_, _ = cl.Restart(ctx, id)
				}
			}
		}()
		time.Sleep(time.Duration(200+rng.IntN(1300)) * time.Millisecond)
		if round%4 == 3 {
			d.stop() // a clean stop now and then
		} else {
			_ = d.cmd.Process.Kill()
			<-d.exited
			kills++
		}
		close(stop)
		<-done
		d = startDaemon(t, bin, dataDir, env)
	}
	cl := d.client(t)
	for _, id := range ids {
		if _, err := cl.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d kills", kills)
	for _, id := range ids {
		sb := d.get(id)
		rep, err := cl.Usage(ctx, client.UsageQuery{Sandbox: id})
		if err != nil {
			t.Fatal(err)
		}
		rows := rep.Rows
		slices.SortFunc(rows, func(a, b torpor.UsageRecord) int { return a.Start.Compare(b.Start) })
		for _, r := range rows {
			if r.Open {
				t.Fatalf("a deleted sandbox has an open interval: %+v", r)
			}
		}
		spans, err := torpor.SpansOfRows(rows)
		if err != nil {
			t.Fatal(err)
		}
		if len(spans) == 0 || !spans[0].Start.Equal(sb.CreatedAt) || !spans[len(spans)-1].End.Equal(*sb.TerminatedAt) {
			t.Fatalf("ledger of %s %v does not span its life %s - %s", id, spans, sb.CreatedAt, sb.TerminatedAt)
		}
		if want := torpor.SpansOfEvents(sandboxEvents(t, cl, id), *sb.TerminatedAt); !slices.Equal(spans, want) {
			t.Fatalf("ledger of %s\n%v\ndiffers from its event log\n%v", id, spans, want)
		}
		m := sb.Meters
		life := sb.TerminatedAt.Sub(sb.CreatedAt).Seconds()
		if got := m.RunningS + m.FrozenS + m.SnapshotPausedS + m.HibernatedS; got < life-1e-3 || got > life+1e-3 {
			t.Errorf("meters of %s count %.6fs of a %.6fs life", id, got, life)
		}
		if diff := m.Cost - rep.Total.Cost; diff > 1e-9 || diff < -1e-9 {
			t.Errorf("meters cost %.9f, ledger %.9f", m.Cost, rep.Total.Cost)
		}
		t.Logf("%s: %d rows, %d spans, %s", id, len(rows), len(spans), m)
	}
	if out := d.ok("usage", "--by", "day"); !strings.Contains(out, "TOTAL") || !strings.Contains(out, time.Now().UTC().Format(time.DateOnly)) {
		t.Errorf("torpor usage --by day:\n%s", out)
	}
}

// killSandboxProcesses SIGKILLs every process of a sandbox (its whole
// cgroup), as a host that lost it would.
func killSandboxProcesses(t *testing.T, id string) {
	t.Helper()
	var dirs []string
	_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, de fs.DirEntry, err error) error {
		if err == nil && de.IsDir() && strings.Contains(de.Name(), id) {
			dirs = append(dirs, p)
			return filepath.SkipDir
		}
		return nil
	})
	killed := 0
	for _, d := range dirs {
		data, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
	}
	if killed == 0 {
		t.Fatalf("found no process of sandbox %s to kill (cgroups %v)", id, dirs)
	}
}

// TestUsageOfASandboxLostWithTheDaemon: a sandbox whose processes die
// while the daemon is down stops being charged as running at its last
// sign of life, not when the daemon comes back.
func TestUsageOfASandboxLostWithTheDaemon(t *testing.T) {
	needs(t)
	bin := torporBin(t)
	dataDir := t.TempDir()
	d := startDaemon(t, bin, dataDir)
	id := strings.TrimSpace(d.ok("create"))
	_ = d.cmd.Process.Kill()
	<-d.exited
	killedAt := time.Now()
	killSandboxProcesses(t, id)
	time.Sleep(2 * time.Second) // the daemon is down for a while
	d = startDaemon(t, bin, dataDir)
	sb := d.waitState(id, torpor.StateFailed)
	rep, err := d.client(t).Usage(context.Background(), client.UsageQuery{Sandbox: id})
	if err != nil {
		t.Fatal(err)
	}
	var running []torpor.UsageRecord
	for _, r := range rep.Rows {
		if r.Kind == torpor.UsageRunning {
			running = append(running, r)
		}
	}
	if len(running) == 0 || running[len(running)-1].End.After(killedAt) {
		t.Fatalf("running rows %+v: the last must end at the last sign of life, before the kill at %s", running, killedAt)
	}
	if sb.Meters.RunningS > killedAt.Sub(sb.CreatedAt).Seconds() {
		t.Errorf("running_s %.3f counts the time the daemon was down", sb.Meters.RunningS)
	}
	var lost bool
	evs, _, _ := d.client(t).Events(context.Background(), id, 0)
	for _, ev := range evs {
		lost = lost || ev.Type == torpor.EventLost
	}
	if !lost {
		t.Error("no sandbox.lost event")
	}
	d.ok("rm", id)
}
