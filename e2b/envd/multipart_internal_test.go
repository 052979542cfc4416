package envd

import (
	"bytes"
	"errors"
	"io"
	"mime/multipart"
	"strings"
	"testing"
)

type formFile struct{ name, filename, content string }

// readForm reads every part with the fast reader, in reads of odd sizes.
func readForm(body []byte, boundary string, chunk int) ([]formFile, error) {
	fr, err := newFormReader(&oneByteAtTimes{r: bytes.NewReader(body), n: chunk}, boundary)
	if err != nil {
		return nil, err
	}
	var out []formFile
	for {
		p, err := fr.NextPart()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(p)
		if err != nil {
			return nil, err
		}
		out = append(out, formFile{p.FormName(), p.Header.Get("Content-Disposition"), string(b)})
	}
}

// stdForm reads the same body with mime/multipart.
func stdForm(body []byte, boundary string) ([]formFile, error) {
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	var out []formFile
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(p)
		if err != nil {
			return nil, err
		}
		out = append(out, formFile{p.FormName(), p.Header.Get("Content-Disposition"), string(b)})
	}
}

// oneByteAtTimes hands out at most n bytes per Read, as a slow network.
type oneByteAtTimes struct {
	r io.Reader
	n int
}

func (o *oneByteAtTimes) Read(b []byte) (int, error) { return o.r.Read(b[:min(len(b), o.n)]) }

func TestFormReader(t *testing.T) {
	var w bytes.Buffer
	mw := multipart.NewWriter(&w)
	big := strings.Repeat("x\r\n--almost\r", 50000)
	for _, f := range []formFile{{"file", "/home/user/a.txt", "A"}, {"other", "", "skip"}, {"file", "b/c.bin", big}, {"file", "empty", ""}} {
		pw, _ := mw.CreateFormFile(f.name, f.filename)
		io.WriteString(pw, f.content)
	}
	mw.Close()
	want, err := stdForm(w.Bytes(), mw.Boundary())
	if err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []int{1, 7, 73, 4096, 1 << 20} {
		got, err := readForm(w.Bytes(), mw.Boundary(), chunk)
		if err != nil || len(got) != len(want) {
			t.Fatalf("chunks of %d: %d parts, %v", chunk, len(got), err)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("chunks of %d: part %d differs", chunk, i)
			}
		}
	}
	bad := []string{
		"--b\r\nContent-Disposition: form-data; name=file\r\n\r\nno end",
		"--b\nContent-Disposition: form-data\n\nLF only\n--b--\n",
		"--b\r\n Folded: header\r\n\r\nx\r\n--b--",
		"no boundary at all",
		"--b\r\n" + strings.Repeat("H: v\r\n", 200) + "\r\nx\r\n--b--",
		"--bX\r\n\r\nx\r\n--b--",
	}
	for _, b := range bad {
		if _, err := readForm([]byte(b), "b", 5); err == nil {
			t.Errorf("%q was read", b)
		}
	}
	if got, err := readForm([]byte("preamble\r\n--b\r\n\r\nx\r\n--b--"), "b", 3); err != nil || len(got) != 1 || got[0].content != "x" {
		t.Errorf("no epilogue: %v %v", got, err)
	}
}

// FuzzFormReader: a body that both the fast reader and mime/multipart
// read is read the same way by both (mime/multipart takes some bodies the
// fast one refuses, LF line ends for one, and reads an empty part's
// content that begins with the boundary as a delimiter of its own).
func FuzzFormReader(f *testing.F) {
	f.Add([]byte("--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x\"\r\n\r\nhello\r\n--b--\r\n"), uint8(3))
	f.Add([]byte("pre\r\n--b \r\nA: 1\r\n\r\n\r\n--b\r\n\r\n--\r\n--b--"), uint8(1))
	f.Fuzz(func(t *testing.T, body []byte, chunk uint8) {
		got, err := readForm(body, "b", int(chunk)+1)
		if err != nil {
			if !errors.Is(err, errFormSyntax) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		want, err := stdForm(body, "b")
		if err != nil {
			return
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %d parts, mime/multipart %d", body, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%q: part %d: %+v, mime/multipart %+v", body, i, got[i], want[i])
			}
		}
	})
}
