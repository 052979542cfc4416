package storetest

import "time"

// ptime returns a pointer to t.
func ptime(t time.Time) *time.Time { return &t }
