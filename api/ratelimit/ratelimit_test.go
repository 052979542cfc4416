package ratelimit_test

import (
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/ratelimit"
	"github.com/torpor-dev/torpor/clocktest"
)

// The bucket, step by step on a manual clock: a burst goes through, the
// next request is refused with the wait until the next token, tokens come
// back at the rate and never pile up past the burst, and keys do not
// share buckets.
func TestBucket(t *testing.T) {
	type step struct {
		advance time.Duration
		key     string
		n       int           // requests sent at this instant
		allowed int           // how many of them go through
		retry   time.Duration // RetryAfter of the first refused one
	}
	cases := []struct {
		name  string
		rate  float64
		burst int
		steps []step
	}{
		{"burst then refused", 10, 3, []step{
			{0, "a", 4, 3, 100 * time.Millisecond},
		}},
		{"refills at the rate", 10, 3, []step{
			{0, "a", 3, 3, 0},
			{50 * time.Millisecond, "a", 1, 0, 50 * time.Millisecond},
			{50 * time.Millisecond, "a", 2, 1, 100 * time.Millisecond},
			{250 * time.Millisecond, "a", 3, 2, 50 * time.Millisecond},
		}},
		{"never more than the burst", 10, 3, []step{
			{time.Hour, "a", 4, 3, 100 * time.Millisecond},
		}},
		{"keys apart", 1, 2, []step{
			{0, "a", 3, 2, time.Second},
			{0, "b", 3, 2, time.Second},
		}},
		{"slow rate", 0.5, 1, []step{
			{0, "a", 2, 1, 2 * time.Second},
			{1500 * time.Millisecond, "a", 1, 0, 500 * time.Millisecond},
			{500 * time.Millisecond, "a", 1, 1, 0},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			l := ratelimit.New(ratelimit.Config{PerSecond: c.rate, Burst: c.burst, Clock: clock})
			for i, s := range c.steps {
				clock.Advance(s.advance)
				allowed := 0
				var refused *torpor.Error
				for range s.n {
					err := l.Take(s.key)
					if err == nil {
						if refused != nil {
							t.Fatalf("step %d: a request went through after one was refused at the same instant", i)
						}
						allowed++
						continue
					}
					te, ok := err.(*torpor.Error)
					if !ok || te.Code != torpor.ERateLimited {
						t.Fatalf("step %d: refused with %v, want rate_limited", i, err)
					}
					if refused == nil {
						refused = te
					}
				}
				if allowed != s.allowed {
					t.Fatalf("step %d: %d of %d went through, want %d", i, allowed, s.n, s.allowed)
				}
				if refused != nil && refused.RetryAfter != s.retry {
					t.Errorf("step %d: RetryAfter %s, want %s", i, refused.RetryAfter, s.retry)
				}
			}
		})
	}
}

// A refusal says the limit and when to come back.
func TestRefusalMessage(t *testing.T) {
	l := ratelimit.New(ratelimit.Config{PerSecond: 50, Burst: 1, Clock: clocktest.New(time.Unix(0, 0))})
	_ = l.Take("k")
	err := l.Take("k")
	te, ok := err.(*torpor.Error)
	if !ok || te.Message != "too many requests with this API key: at most 50 a second, in bursts of up to 1; retry after 20ms" {
		t.Fatalf("got %v", err)
	}
}

// No limiter (rate 0) lets everything through.
func TestOff(t *testing.T) {
	l := ratelimit.New(ratelimit.Config{PerSecond: 0, Burst: 1})
	for range 1000 {
		if err := l.Take("k"); err != nil {
			t.Fatal(err)
		}
	}
}

// Buckets of keys that went quiet are dropped once full again, so a
// stream of one-off keys keeps memory bounded, and dropping one changes
// nothing for its key.
func TestQuietKeysAreForgotten(t *testing.T) {
	clock := clocktest.New(time.Unix(0, 0))
	l := ratelimit.New(ratelimit.Config{PerSecond: 10, Burst: 20, Clock: clock})
	for i := range 1000 {
		if err := l.Take(string(rune('a'+i%26)) + time.Duration(i).String()); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(1500 * time.Millisecond)
	for range 20 {
		_ = l.Take("busy")
	}
	if n := l.Len(); n != 1001 {
		t.Fatalf("%d buckets, want 1001", n)
	}
	// At 2 s the one-off keys are full again; busy, emptied at 1.5 s, is
	// not.
	clock.Advance(500 * time.Millisecond)
	_ = l.Take("probe")
	if n := l.Len(); n != 2 {
		t.Fatalf("%d buckets after the quiet keys refilled, want busy and probe", n)
	}
	clock.Advance(2 * time.Second)
	_ = l.Take("probe")
	if n := l.Len(); n != 1 {
		t.Fatalf("%d buckets once busy refilled too, want only probe", n)
	}
	for range 20 {
		if err := l.Take("busy"); err != nil {
			t.Fatalf("a forgotten key lost its burst: %v", err)
		}
	}
}
