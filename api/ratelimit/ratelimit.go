// Package ratelimit holds the per-key request rate limits of torpor's
// APIs: a token bucket per API key, shared by the native API and E2B's
// control plane, so that a key's rate is one rate whichever surface it
// calls. A request takes one token when it starts (a stream, however long
// it lives, counts once); a key without a token left is refused with
// rate_limited and the time until its next token. The APIs do not ask it
// about admin keys, which are exempt (docs/limits.md).
package ratelimit

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
)

// Defaults: generous enough that no ordinary program meets them, low
// enough that a runaway loop does not take the daemon from the others.
const (
	DefaultPerSecond = 50
	DefaultBurst     = 200
)

// Config is what a Limiter is built from.
type Config struct {
	// PerSecond is the sustained rate of each key; 0 turns limits off.
	PerSecond float64
	// Burst is how many requests a key that was quiet may send at once
	// (at least 1).
	Burst int
	Clock torpor.Clock
}

// Limiter keeps a token bucket per key. A nil *Limiter lets everything
// through.
type Limiter struct {
	rate  float64
	burst float64
	clock torpor.Clock

	mu      sync.Mutex
	buckets map[string]*bucket
	// swept is when buckets were last pruned of full ones.
	swept time.Time
}

// bucket is one key's tokens as of last.
type bucket struct {
	tokens float64
	last   time.Time
}

// New returns a limiter, or nil (no limits) when cfg.PerSecond is 0.
func New(cfg Config) *Limiter {
	if cfg.PerSecond <= 0 {
		return nil
	}
	if cfg.Clock == nil {
		cfg.Clock = torpor.SystemClock{}
	}
	return &Limiter{rate: cfg.PerSecond, burst: float64(max(cfg.Burst, 1)), clock: cfg.Clock, buckets: map[string]*bucket{}}
}

// Take takes one token from key's bucket, or refuses with rate_limited
// and RetryAfter set to when the bucket has one again.
func (l *Limiter) Take(key string) error {
	if l == nil {
		return nil
	}
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweepLocked(now)
	b, ok := l.buckets[key]
	if !ok {
		b = &bucket{tokens: l.burst, last: now}
		l.buckets[key] = b
	}
	b.tokens = l.fill(b, now)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return nil
	}
	wait := time.Duration(math.Ceil((1 - b.tokens) / l.rate * float64(time.Second)))
	return &torpor.Error{Code: torpor.ERateLimited, RetryAfter: wait,
		Message: fmt.Sprintf("too many requests with this API key: at most %s a second, in bursts of up to %d; retry after %s",
			strconv.FormatFloat(l.rate, 'f', -1, 64), int(l.burst), wait.Round(time.Millisecond))}
}

// fill returns b's tokens at now: what it had, plus what the time since
// brought, up to the burst.
func (l *Limiter) fill(b *bucket, now time.Time) float64 {
	elapsed := now.Sub(b.last).Seconds()
	if elapsed < 0 {
		elapsed = 0 // a clock that stepped back brings nothing
	}
	return math.Min(l.burst, b.tokens+elapsed*l.rate)
}

// sweepLocked drops, at most once per refill time (and at most once a
// second), the buckets that are full again: such a bucket is the same as
// none, so forgetting it changes no answer, and memory stays bounded by
// the keys active lately.
func (l *Limiter) sweepLocked(now time.Time) {
	every := max(time.Duration(l.burst/l.rate*float64(time.Second)), time.Second)
	if now.Sub(l.swept) < every {
		return
	}
	l.swept = now
	for k, b := range l.buckets {
		if l.fill(b, now) >= l.burst {
			delete(l.buckets, k)
		}
	}
}
