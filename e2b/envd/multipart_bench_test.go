package envd

import (
	"bytes"
	"io"
	"mime/multipart"
	"testing"
)

// BenchmarkFormReader: a 10 MiB part read by the fast reader and by
// mime/multipart, against copying the same bytes (go test -bench Form).
func BenchmarkFormReader(b *testing.B) {
	var w bytes.Buffer
	mw := multipart.NewWriter(&w)
	pw, _ := mw.CreateFormFile("file", "/home/user/x")
	pw.Write(bytes.Repeat([]byte("0123456789abcdef"), 10<<16))
	mw.Close()
	body, buf := w.Bytes(), make([]byte, 256<<10)
	drain := func(r io.Reader) {
		for {
			if _, err := io.ReadFull(r, buf); err != nil {
				return
			}
		}
	}
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			fr, _ := newFormReader(bytes.NewReader(body), mw.Boundary())
			p, _ := fr.NextPart()
			drain(p)
		}
	})
	b.Run("mime-multipart", func(b *testing.B) {
		for b.Loop() {
			p, _ := multipart.NewReader(bytes.NewReader(body), mw.Boundary()).NextPart()
			drain(p)
		}
	})
	b.Run("copy", func(b *testing.B) {
		for b.Loop() {
			drain(bytes.NewReader(body))
		}
	})
}
