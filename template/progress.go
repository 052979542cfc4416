package template

import (
	"bytes"
	"io"
	"time"
)

// progressEvery is how often a long unpack reports how far it got.
const progressEvery = 2 * time.Second

// ticker counts the bytes read through it and reports the count at most
// every progressEvery.
type ticker struct {
	r    io.ReadCloser
	n    int64
	last time.Time
	tell func(n int64)
}

func newTicker(r io.ReadCloser, tell func(n int64)) *ticker {
	return &ticker{r: r, last: time.Now(), tell: tell}
}

func (t *ticker) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	t.n += int64(n)
	if now := time.Now(); now.Sub(t.last) >= progressEvery {
		t.last = now
		t.tell(t.n)
	}
	return n, err
}

func (t *ticker) Close() error { return t.r.Close() }

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
