package ratelimit

// Len returns how many buckets are kept, for tests of the pruning.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
