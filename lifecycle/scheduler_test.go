package lifecycle

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/clocktest"
)

func TestSchedulerFiresInOrderAndOnlyWhenDue(t *testing.T) {
	clk := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	fired := make(chan string, 100)
	s := newScheduler(clk, func(_ context.Context, id string) { fired <- id })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	s.run(ctx, &wg)
	defer func() { cancel(); wg.Wait() }()

	now := clk.Now()
	s.set("c", now.Add(3*time.Second))
	s.set("a", now.Add(1*time.Second))
	s.set("b", now.Add(2*time.Second))
	s.set("gone", now.Add(time.Second))
	s.remove("gone")
	s.set("moved", now.Add(time.Second))
	s.set("moved", now.Add(time.Hour)) // replaced, not added
	if clk.Pending() != 1 {
		t.Fatalf("%d timers armed for 5 deadlines, want 1", clk.Pending())
	}
	for _, want := range []string{"a", "b", "c"} {
		clk.Advance(time.Second)
		select {
		case got := <-fired:
			if got != want {
				t.Fatalf("fired %s, want %s", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not fire", want)
		}
	}
	select {
	case id := <-fired:
		t.Fatalf("%s fired early", id)
	case <-time.After(20 * time.Millisecond):
	}
	if s.len() != 1 {
		t.Fatalf("%d deadlines left, want 1 (moved)", s.len())
	}
}

// BenchmarkScheduler100k holds 100,000 deadlines an hour away and reports
// the heap held per deadline, the CPU used in a second when nothing is due,
// and, for 1,000 deadlines falling due together while the rest wait, how
// late each was handed to its sweep.
func BenchmarkScheduler100k(b *testing.B) {
	const n = 100_000
	for range b.N {
		var mu sync.Mutex
		var lateness []time.Duration
		deadlines := map[string]time.Time{}
		clk := torpor.SystemClock{}
		s := newScheduler(clk, func(_ context.Context, id string) {
			mu.Lock()
			defer mu.Unlock()
			if at, ok := deadlines[id]; ok {
				lateness = append(lateness, time.Since(at))
			}
		})
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		far := clk.Now().Add(time.Hour)
		for i := range n {
			s.set(fmt.Sprintf("sandbox%015d", i), far.Add(time.Duration(i)*time.Millisecond))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/deadline")

		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		s.run(ctx, &wg)
		cpu0 := cpuTime()
		time.Sleep(time.Second)
		b.ReportMetric(float64((cpuTime() - cpu0).Microseconds()), "idle-cpu-us/s")

		due := clk.Now().Add(100 * time.Millisecond)
		mu.Lock()
		for i := range 1000 {
			deadlines[fmt.Sprintf("due%d", i)] = due
		}
		mu.Unlock()
		for i := range 1000 {
			s.set(fmt.Sprintf("due%d", i), due)
		}
		for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			got := len(lateness)
			mu.Unlock()
			if got == 1000 || time.Since(start) > 10*time.Second {
				break
			}
		}
		cancel()
		wg.Wait()
		sort.Slice(lateness, func(i, j int) bool { return lateness[i] < lateness[j] })
		if len(lateness) != 1000 {
			b.Fatalf("%d of 1000 due deadlines fired", len(lateness))
		}
		b.ReportMetric(float64(lateness[500].Microseconds())/1000, "late-p50-ms")
		b.ReportMetric(float64(lateness[990].Microseconds())/1000, "late-p99-ms")
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
