package e2b

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/torpor-dev/torpor"
)

// cpuSample is a sandbox's CPU time at a moment.
type cpuSample struct {
	used time.Duration
	at   time.Time
}

const (
	// cpuWindow is how long apart two samples are taken when there is no
	// recent one to compare with.
	cpuWindow = 100 * time.Millisecond
	// cpuSampleAge is how old a kept sample may be and still be compared
	// with; cpuSamplesKept bounds how many are kept.
	cpuSampleAge   = 5 * time.Minute
	cpuSamplesKept = 4096
)

// metrics answers GET /sandboxes/{id}/metrics with the sandbox's figures
// now, as its runtime measures them: CPU use since the caller's last look
// (or over a short window), memory and disk. A sandbox without a running
// instance has none: the list is empty.
func (a *API) metrics(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	q := r.URL.Query()
	var bounds [2]int64
	for i, name := range []string{"start", "end"} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return torpor.Invalid(name, "%s must be a Unix time in seconds", name)
			}
			bounds[i] = n
		}
	}
	id := sandboxID(r)
	if _, err := a.load(r.Context(), tenant, id); err != nil {
		return err
	}
	sb, u, err := a.eng.ResourceUsage(r.Context(), tenant, id)
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	out := []metric{}
	inRange := (bounds[0] == 0 || bounds[0] <= now.Unix()) && (bounds[1] == 0 || bounds[1] >= now.Add(-time.Minute).Unix())
	if inRange && (u.CPU != nil || u.MemoryBytes != nil || u.DiskBytes != nil) {
		m := metric{
			Timestamp: now, TimestampUnix: now.Unix(), CPUCount: cpuCount(sb.Resources),
			MemUsed: u.MemoryBytes, MemCache: u.MemoryCacheBytes, MemTotal: sb.Resources.MemoryMiB << 20,
			DiskUsed: u.DiskBytes, DiskTotal: sb.Resources.DiskMiB << 20,
		}
		m.CPUUsedPct = a.cpuPct(r.Context(), tenant, id, u, m.CPUCount)
		out = append(out, m)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// cpuPct is the share of the sandbox's CPUs its processes used, in
// percent, between the last sample of it and u (taking a second sample a
// moment later when there is no recent one).
func (a *API) cpuPct(ctx context.Context, tenant, id string, u torpor.ResourceUsage, cpus int) *float64 {
	if u.CPU == nil {
		return nil
	}
	cur := cpuSample{used: *u.CPU, at: time.Now()}
	prev, ok := a.swapSample(id, cur)
	if !ok || cur.at.Sub(prev.at) > cpuSampleAge || cur.at.Sub(prev.at) < cpuWindow/10 || cur.used < prev.used {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(cpuWindow):
		}
		_, u2, err := a.eng.ResourceUsage(ctx, tenant, id)
		if err != nil || u2.CPU == nil {
			return nil
		}
		prev, cur = cur, cpuSample{used: *u2.CPU, at: time.Now()}
		a.swapSample(id, cur)
	}
	span := cur.at.Sub(prev.at)
	if span <= 0 || cur.used < prev.used {
		return nil
	}
	pct := float64(cur.used-prev.used) / float64(span) / float64(cpus) * 100
	pct = math.Round(min(max(pct, 0), 100)*100) / 100
	return &pct
}

// swapSample keeps s as id's last sample and returns the one before.
func (a *API) swapSample(id string, s cpuSample) (cpuSample, bool) {
	a.cpuMu.Lock()
	defer a.cpuMu.Unlock()
	prev, ok := a.cpu[id]
	if len(a.cpu) >= cpuSamplesKept && !ok {
		for k, v := range a.cpu {
			if s.at.Sub(v.at) > cpuSampleAge {
				delete(a.cpu, k)
			}
		}
		if len(a.cpu) >= cpuSamplesKept {
			return prev, false // full of recent samples: do not keep this one
		}
	}
	a.cpu[id] = s
	return prev, ok
}
