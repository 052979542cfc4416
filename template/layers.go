package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// A layer is kept in DIR/sha256-<hex of its uncompressed tar>/: the
// files in fs/ (an overlayfs lower directory) and what unpacking learned
// in info.json. It is written under a temporary name and renamed into
// place, so a layer directory is either absent or complete.
const (
	layerPrefix = "sha256-"
	layerFS     = "fs"
	layerInfo   = "info.json"
	tmpPrefix   = ".tmp-"
	trashPrefix = ".trash-"
)

var hexDigestRe = regexp.MustCompile(`^[0-9a-f]{64}$`)

// layer is an unpacked layer.
type layer struct {
	// Digest is "sha256:<hex>" of the uncompressed tar stream (the diff id).
	Digest string `json:"digest"`
	// Size is the bytes of file contents.
	Size    int64 `json:"size"`
	Entries int   `json:"entries"`
	// dir is the layer's directory; FS() its files.
	dir string
}

// FS is the layer's files: the overlayfs lower directory.
func (l layer) FS() string { return filepath.Join(l.dir, layerFS) }

// layerStore unpacks layers once per digest and shares them.
type layerStore struct {
	dir string
	lim Limits

	mu    sync.Mutex
	locks map[string]*lockEntry
	// pins count the imports that use a layer they have not yet stored
	// in a template; gc keeps pinned layers.
	pins map[string]int
}

type lockEntry struct {
	mu   sync.Mutex
	refs int
}

func newLayerStore(dir string, lim Limits) (*layerStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("layers: %w", err)
	}
	s := &layerStore{dir: dir, lim: lim, locks: map[string]*lockEntry{}, pins: map[string]int{}}
	// Leftovers of imports that a crash interrupted.
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("layers: %w", err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tmpPrefix) || strings.HasPrefix(e.Name(), trashPrefix) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, fmt.Errorf("layers: remove leftover: %w", err)
			}
		}
	}
	return s, nil
}

// path is the directory of the layer with hex digest h.
func (s *layerStore) path(h string) string { return filepath.Join(s.dir, layerPrefix+h) }

// lock serializes work on one digest.
func (s *layerStore) lock(h string) func() {
	s.mu.Lock()
	e := s.locks[h]
	if e == nil {
		e = &lockEntry{}
		s.locks[h] = e
	}
	e.refs++
	s.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		s.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(s.locks, h)
		}
		s.mu.Unlock()
	}
}

// pin keeps gc away from a layer until unpin.
func (s *layerStore) pin(h string) {
	s.mu.Lock()
	s.pins[h]++
	s.mu.Unlock()
}

func (s *layerStore) unpin(h string) {
	s.mu.Lock()
	if s.pins[h]--; s.pins[h] <= 0 {
		delete(s.pins, h)
	}
	s.mu.Unlock()
}

// get returns the layer with hex digest h when it is unpacked.
func (s *layerStore) get(h string) (layer, bool) {
	data, err := os.ReadFile(filepath.Join(s.path(h), layerInfo))
	if err != nil {
		return layer{}, false
	}
	var l layer
	if json.Unmarshal(data, &l) != nil || l.Digest != "sha256:"+h {
		return layer{}, false
	}
	l.dir = s.path(h)
	return l, true
}

// ensure returns the layer whose uncompressed digest is want ("sha256:…"),
// unpacking it from open when it is not there yet, and pins it (the caller
// unpins it once a template that uses it is stored). With want empty the
// digest is computed while unpacking. The stream's digest is checked as it
// is read; a mismatch, like any failure, leaves nothing behind.
func (s *layerStore) ensure(ctx context.Context, want string, budget *int64, open func() (io.ReadCloser, error)) (layer, error) {
	var h string
	if want != "" {
		var ok bool
		if h, ok = strings.CutPrefix(want, "sha256:"); !ok || !hexDigestRe.MatchString(h) {
			return layer{}, badLayer("unsupported layer digest %q (sha256 only)", shorten(want))
		}
		s.pin(h)
		unlock := s.lock(h)
		defer unlock()
		if l, ok := s.get(h); ok {
			if err := chargeExisting(l, budget, s.lim); err != nil {
				s.unpin(h)
				return layer{}, err
			}
			return l, nil
		}
	}
	l, tmp, err := s.unpackTemp(ctx, want, budget, open)
	if err != nil {
		if h != "" {
			s.unpin(h)
		}
		return layer{}, err
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	if h == "" {
		h = strings.TrimPrefix(l.Digest, "sha256:")
		s.pin(h)
		unlock := s.lock(h)
		defer unlock()
		if have, ok := s.get(h); ok {
			return have, nil
		}
	}
	if err := s.clearBroken(h); err != nil {
		s.unpin(h)
		return layer{}, err
	}
	if err := os.Rename(tmp, s.path(h)); err != nil {
		s.unpin(h)
		return layer{}, fmt.Errorf("layers: %w", err)
	}
	l.dir = s.path(h)
	return l, nil
}

// clearBroken removes a directory in the place of layer h that get does
// not accept (no info.json: not written by this store).
func (s *layerStore) clearBroken(h string) error {
	if _, err := os.Lstat(s.path(h)); err != nil {
		return nil
	}
	trash, err := os.MkdirTemp(s.dir, trashPrefix)
	if err != nil {
		return fmt.Errorf("layers: %w", err)
	}
	if err := os.Rename(s.path(h), filepath.Join(trash, "old")); err != nil {
		return fmt.Errorf("layers: %w", err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("layers: %w", err)
	}
	return nil
}

// chargeExisting counts a shared layer against the image's byte budget,
// as if it were unpacked again.
func chargeExisting(l layer, budget *int64, lim Limits) error {
	if budget == nil {
		return nil
	}
	if *budget -= l.Size; *budget < 0 {
		return badLayer("more than %d bytes of files in the image", lim.MaxImageBytes)
	}
	return nil
}

// unpackTemp unpacks the stream into a new temporary layer directory and
// checks its digest; it returns the layer and the directory.
func (s *layerStore) unpackTemp(ctx context.Context, want string, budget *int64, open func() (io.ReadCloser, error)) (layer, string, error) {
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix)
	if err != nil {
		return layer{}, "", fmt.Errorf("layers: %w", err)
	}
	l, err := s.fill(ctx, tmp, want, budget, open)
	if err != nil {
		os.RemoveAll(tmp)
		return layer{}, "", err
	}
	return l, tmp, nil
}

func (s *layerStore) fill(ctx context.Context, tmp, want string, budget *int64, open func() (io.ReadCloser, error)) (layer, error) {
	fsDir := filepath.Join(tmp, layerFS)
	if err := os.Mkdir(fsDir, 0o755); err != nil {
		return layer{}, fmt.Errorf("layers: %w", err)
	}
	rc, err := open()
	if err != nil {
		return layer{}, err
	}
	defer rc.Close()
	dr := newDigestReader(rc, s.streamLimit())
	st, err := unpack(ctx, dr, fsDir, s.lim, budget)
	if err == nil {
		// What follows the end of the archive is part of the digest.
		_, err = io.Copy(io.Discard, dr)
	}
	if err != nil {
		if errors.Is(err, errStreamTooLong) {
			return layer{}, badLayer("the layer stream is longer than %d bytes", s.streamLimit())
		}
		return layer{}, err
	}
	got := dr.digest()
	if want != "" && got != want {
		return layer{}, badLayer("digest mismatch: the layer's content is %s, the image says %s", got, want)
	}
	l := layer{Digest: got, Size: st.Bytes, Entries: st.Entries}
	data, err := json.Marshal(l)
	if err != nil {
		return layer{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, layerInfo), data, 0o600); err != nil {
		return layer{}, fmt.Errorf("layers: %w", err)
	}
	return l, nil
}

// streamLimit bounds a layer's tar stream: its file contents plus room
// for the headers of the most entries it may have.
func (s *layerStore) streamLimit() int64 {
	return s.lim.MaxLayerBytes + int64(s.lim.MaxEntries)*2048 + 1<<20
}

// gc removes the layers that no template uses (keep holds the hex
// digests of those that do) and no import has pinned. The check and the
// removal happen under the store's lock, so a layer pinned after it was
// judged unused is not removed.
func (s *layerStore) gc(keep map[string]bool) (removed int, err error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, fmt.Errorf("layers: %w", err)
	}
	var doomed []string
	s.mu.Lock()
	for _, e := range entries {
		h, ok := strings.CutPrefix(e.Name(), layerPrefix)
		if !ok || !hexDigestRe.MatchString(h) || keep[h] || s.pins[h] > 0 || s.locks[h] != nil {
			continue
		}
		trash := filepath.Join(s.dir, trashPrefix+h)
		if err := os.Rename(s.path(h), trash); err != nil {
			continue
		}
		doomed = append(doomed, trash)
	}
	s.mu.Unlock()
	for _, d := range doomed {
		if rerr := os.RemoveAll(d); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = fmt.Errorf("layers: %w", rerr)
		}
	}
	return len(doomed), err
}

// digestOf returns the hex digest of the layer whose files are at
// fsPath, when fsPath is a layer of this store.
func (s *layerStore) digestOf(fsPath string) (string, bool) {
	if filepath.Base(fsPath) != layerFS {
		return "", false
	}
	dir := filepath.Dir(fsPath)
	if filepath.Dir(dir) != s.dir {
		return "", false
	}
	h, ok := strings.CutPrefix(filepath.Base(dir), layerPrefix)
	return h, ok && hexDigestRe.MatchString(h)
}

// errStreamTooLong: a layer stream went past streamLimit.
var errStreamTooLong = errors.New("layer stream too long")

// digestReader hashes and counts what is read through it.
type digestReader struct {
	r     io.Reader
	h     hash.Hash
	n     int64
	limit int64
}

func newDigestReader(r io.Reader, limit int64) *digestReader {
	return &digestReader{r: r, h: sha256.New(), limit: limit}
}

func (d *digestReader) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	d.h.Write(p[:n])
	if d.n += int64(n); d.n > d.limit {
		return n, errStreamTooLong
	}
	return n, err
}

func (d *digestReader) digest() string { return "sha256:" + hex.EncodeToString(d.h.Sum(nil)) }
