package runc

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
)

// bootSteps times the steps of one boot for the debug line that Boot logs
// ("runc: boot steps", with the sandbox, the whole boot and each step in
// milliseconds), which the create benchmark reads to break a create down
// (BENCHMARKS.md, "Create breakdown"). A log line rather than metrics: it
// costs nothing when debug logging is off, needs nothing of the runtime's
// configuration or of the engine's Observer, and gives each boot's own
// figures, from which a benchmark takes percentiles that a histogram's
// buckets would blur. Steps that run side by side (the network beside
// the disk) are timed each on its own, so the steps may add up to more
// than the whole.
type bootSteps struct {
	start time.Time
	mu    sync.Mutex
	steps []bootStep
}

type bootStep struct {
	name string
	took time.Duration
}

func newBootSteps() *bootSteps { return &bootSteps{start: time.Now()} }

// since records the step name as the time from t0 until now, and returns
// now, where the next step starts. A nil bootSteps records nothing.
func (s *bootSteps) since(name string, t0 time.Time) time.Time {
	now := time.Now()
	if s == nil {
		return now
	}
	s.mu.Lock()
	s.steps = append(s.steps, bootStep{name, now.Sub(t0)})
	s.mu.Unlock()
	return now
}

// String lists the steps as name=milliseconds, in the order they ended.
func (s *bootSteps) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for i, st := range s.steps {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(st.name)
		b.WriteByte('=')
		b.WriteString(millis(st.took))
	}
	return b.String()
}

// log writes the debug line of a boot that succeeded.
func (s *bootSteps) log(ctx context.Context, log *slog.Logger, id string) {
	if !log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	log.Debug("runc: boot steps", "sandbox", id, "ms", millis(time.Since(s.start)), "steps", s.String())
}

// millis formats d in milliseconds with two decimals.
func millis(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

type stepsKey struct{}

// withSteps carries a boot's steps down its calls; stepsOf finds them
// (nil, which records nothing, outside a boot).
func withSteps(ctx context.Context, s *bootSteps) context.Context {
	return context.WithValue(ctx, stepsKey{}, s)
}

func stepsOf(ctx context.Context) *bootSteps {
	s, _ := ctx.Value(stepsKey{}).(*bootSteps)
	return s
}
