package sqlite_test

import (
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// BenchmarkUpdateSandbox measures one durable state change: an update of a
// sandbox with metadata and one event, committed with synchronous=FULL.
// "serial" is one caller; "parallel" is GOMAXPROCS callers on different
// sandboxes, queueing for the single writer.
func BenchmarkUpdateSandbox(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		s := open(b, filepath.Join(b.TempDir(), "torpor.db"))
		defer s.Close()
		sb := benchSandbox(b, s, "sb_bench")
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			updateOnce(b, s, sb, i)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		s := open(b, filepath.Join(b.TempDir(), "torpor.db"))
		defer s.Close()
		var next atomic.Int64
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			sb := benchSandbox(b, s, fmt.Sprintf("sb_bench%d", next.Add(1)))
			for i := 0; pb.Next(); i++ {
				updateOnce(b, s, sb, i)
			}
		})
	})
}

// benchSandbox creates a sandbox shaped like a real one.
func benchSandbox(b *testing.B, s torpor.Store, id string) *torpor.Sandbox {
	b.Helper()
	now := time.Now().UTC()
	sb := &torpor.Sandbox{
		ID: id, Tenant: "acme", Template: "python-3.12", State: torpor.StateRunning,
		StateSince: now, CreatedAt: now, LastActivityAt: now,
		Resources:  torpor.Resources{VCPUs: 2, MemoryMiB: 2048, Pids: 1024, DiskMiB: 10240},
		Metadata:   map[string]string{"app": "agent", "owner": "ada", "run": id},
		Runtime:    torpor.RuntimeConfig{Kind: "runc", Entrypoint: []string{"python", "main.py"}},
		PauseModes: []torpor.PauseMode{torpor.PauseFreeze},
		Env:        map[string]string{"API_TOKEN": "secret"},
		Handle:     `{"bundle":"/var/lib/torpor/x"}`,
	}
	if err := s.CreateSandbox(b.Context(), sb); err != nil {
		b.Fatal(err)
	}
	return sb
}

// updateOnce flips the sandbox between running and paused, with an event.
func updateOnce(b *testing.B, s torpor.Store, sb *torpor.Sandbox, i int) {
	sb.State = torpor.StateRunning
	if i%2 == 1 {
		sb.State = torpor.StatePaused
	}
	sb.LastActivityAt = time.Now().UTC()
	e := torpor.Event{Type: torpor.EventStateChange, SandboxID: sb.ID, Tenant: sb.Tenant,
		Time: sb.LastActivityAt, Attrs: map[string]string{"to": string(sb.State)}}
	if err := s.UpdateSandbox(b.Context(), sb, e); err != nil {
		b.Fatal(err)
	}
}
