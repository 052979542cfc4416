package files

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// sandbox is a root directory with a host directory next to it holding a
// secret that nothing may reach through the root.
type sandbox struct {
	root    *Root
	dir     string // host path of the root
	outside string // host directory outside the root
	secret  string // host path of the secret file
}

const secretText = "HOST-SECRET"

func newSandbox(t *testing.T) *sandbox {
	t.Helper()
	base := t.TempDir()
	s := &sandbox{dir: filepath.Join(base, "root"), outside: filepath.Join(base, "outside")}
	s.secret = filepath.Join(s.outside, "secret")
	for _, d := range []string{s.dir, s.outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(s.secret, []byte(secretText), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRoot(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	s.root = r
	return s
}

// host makes a file in the root the way a process in the sandbox would.
func (s *sandbox) host(t *testing.T, p, content string) {
	t.Helper()
	full := filepath.Join(s.dir, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (s *sandbox) symlink(t *testing.T, target, p string) {
	t.Helper()
	full := filepath.Join(s.dir, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, full); err != nil {
		t.Fatal(err)
	}
}

// secretIntact fails the test when the host secret changed or the outside
// directory gained files.
func (s *sandbox) secretIntact(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(s.secret)
	if err != nil || string(b) != secretText {
		t.Fatalf("the host secret changed: %q %v", b, err)
	}
	ents, _ := os.ReadDir(s.outside)
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("the outside directory changed: %v", names)
	}
}

func (s *sandbox) read(p string) (string, error) {
	f, _, err := s.root.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	return string(b), err
}

func wantCode(t *testing.T, err error, code torpor.ErrorCode) {
	t.Helper()
	if !torpor.IsCode(err, code) {
		t.Fatalf("got %v, want %s", err, code)
	}
}

func TestWriteReadStatListRoundTrip(t *testing.T) {
	s := newSandbox(t)
	mode := Mode(0o640)
	info, err := s.root.Write("/root/deep/er/x.txt", strings.NewReader("hello"), WriteOptions{Mode: &mode})
	if err != nil {
		t.Fatal(err)
	}
	if info.Path != "/root/deep/er/x.txt" || info.Name != "x.txt" || info.Size != 5 || info.Mode != 0o640 || info.Type != TypeFile {
		t.Fatalf("write info %+v", info)
	}
	if got, err := s.read("root/deep/er/x.txt"); got != "hello" || err != nil {
		t.Fatalf("read %q %v", got, err)
	}
	st, err := s.root.Stat("/root/deep")
	if err != nil || st.Type != TypeDir || st.Mode != 0o755 {
		t.Fatalf("stat dir %+v %v", st, err)
	}
	// A replaced file keeps its mode unless told.
	if info, err = s.root.Write("/root/deep/er/x.txt", strings.NewReader("bye"), WriteOptions{}); err != nil || info.Mode != 0o640 || info.Size != 3 {
		t.Fatalf("rewrite %+v %v", info, err)
	}
	l, err := s.root.List("/", 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range l.Entries {
		paths = append(paths, e.Path)
	}
	if strings.Join(paths, " ") != "/root /root/deep /root/deep/er /root/deep/er/x.txt" || l.Truncated {
		t.Fatalf("list %v truncated=%v", paths, l.Truncated)
	}
	if l, _ := s.root.List("/root", 1, 0); len(l.Entries) != 1 || l.Entries[0].Path != "/root/deep" {
		t.Fatalf("depth 1: %+v", l.Entries)
	}
	if st, err := s.root.Stat("/"); err != nil || st.Type != TypeDir || st.Name != "/" {
		t.Fatalf("stat / %+v %v", st, err)
	}
}

func TestListIsBounded(t *testing.T) {
	s := newSandbox(t)
	for i := 0; i < 30; i++ {
		s.host(t, filepath.Join("d", string(rune('a'+i%26))+strings.Repeat("x", i/26)), "")
	}
	l, err := s.root.List("/d", 1, 10)
	if err != nil || len(l.Entries) != 10 || !l.Truncated {
		t.Fatalf("%d entries truncated=%v %v", len(l.Entries), l.Truncated, err)
	}
	if l, _ := s.root.List("/d", 1, 30); len(l.Entries) != 30 || l.Truncated {
		t.Fatalf("exactly 30: %d %v", len(l.Entries), l.Truncated)
	}
	_, err = s.root.List("/d/a", 1, 0)
	wantCode(t, err, torpor.EConflict)
	for _, d := range []int{0, 11, -1} {
		_, err := s.root.List("/", d, 0)
		wantCode(t, err, torpor.EInvalid)
	}
}

func TestInputValidation(t *testing.T) {
	s := newSandbox(t)
	for _, p := range []string{"", "a\x00b", "/" + strings.Repeat("a", MaxPath), "/proc", "/proc/1/environ", "/sys/kernel", "/dev/sda", "/.torpor/run", "/x/../proc/self"} {
		_, err := s.root.Stat(p)
		wantCode(t, err, torpor.EInvalid)
		_, err = s.root.Write(p, strings.NewReader("x"), WriteOptions{})
		wantCode(t, err, torpor.EInvalid)
	}
	if _, err := s.root.Stat("/processes"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("/processes is not /proc: %v", err)
	}
	for _, m := range []string{"", "8", "10000", "-1", "rwx", "0o7777x"} {
		if _, err := ParseMode("mode", m); !torpor.IsCode(err, torpor.EInvalid) {
			t.Fatalf("mode %q: %v", m, err)
		}
	}
	for m, want := range map[string]Mode{"644": 0o644, "0755": 0o755, "0o7777": 0o7777, "0": 0} {
		if got, err := ParseMode("mode", m); err != nil || got != want {
			t.Fatalf("mode %q: %v %v", m, got, err)
		}
	}
	_, err := s.root.Write("/", strings.NewReader(""), WriteOptions{})
	wantCode(t, err, torpor.EInvalid)
	wantCode(t, s.root.Remove("/", true), torpor.EInvalid)
}

// failingReader yields some data, then an error, as a connection that
// breaks does.
type failingReader struct{ n int }

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("connection reset")
	}
	n := min(len(p), f.n)
	f.n -= n
	return n, nil
}

func TestFailedWriteLeavesNothing(t *testing.T) {
	s := newSandbox(t)
	s.host(t, "keep", "old")
	_, err := s.root.Write("/keep", &failingReader{n: 1 << 20}, WriteOptions{})
	var re *ReadError
	if !errors.As(err, &re) {
		t.Fatalf("want a ReadError, got %v", err)
	}
	if got, _ := s.read("/keep"); got != "old" {
		t.Fatalf("the old file changed: %q", got)
	}
	if _, err := s.root.Write("/new", &failingReader{n: 10}, WriteOptions{}); err == nil {
		t.Fatal("a failed write succeeded")
	}
	ents, _ := os.ReadDir(s.dir)
	if len(ents) != 1 || ents[0].Name() != "keep" {
		t.Fatalf("leftovers: %v", ents)
	}
	// A directory in the way is refused before any data is read.
	s.host(t, "dir/f", "")
	fr := &failingReader{n: 10}
	_, err = s.root.Write("/dir", fr, WriteOptions{})
	wantCode(t, err, torpor.EConflict)
	if fr.n != 10 {
		t.Fatal("data was read for a write that could not succeed")
	}
}

func TestMkdirRenameRemove(t *testing.T) {
	s := newSandbox(t)
	if _, err := s.root.Mkdir("/a/b", MkdirOptions{}); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("mkdir without parents: %v", err)
	}
	mode := Mode(0o700)
	info, err := s.root.Mkdir("/a/b", MkdirOptions{Parents: true, Mode: &mode})
	if err != nil || info.Type != TypeDir || info.Mode != 0o700 {
		t.Fatalf("mkdir -p %+v %v", info, err)
	}
	if _, err := s.root.Mkdir("/a/b", MkdirOptions{Parents: true}); err != nil {
		t.Fatalf("mkdir -p of an existing dir: %v", err)
	}
	_, err = s.root.Mkdir("/a/b", MkdirOptions{})
	wantCode(t, err, torpor.EConflict)
	s.host(t, "a/file", "x")
	_, err = s.root.Mkdir("/a/file/sub", MkdirOptions{Parents: true})
	wantCode(t, err, torpor.EConflict)

	s.host(t, "a/b/c", "c")
	_, err = s.root.Rename("/a/file", "/a/b/c", false)
	wantCode(t, err, torpor.EConflict)
	if info, err := s.root.Rename("/a/file", "/a/b/c", true); err != nil || info.Path != "/a/b/c" || info.Size != 1 {
		t.Fatalf("rename overwrite %+v %v", info, err)
	}
	_, err = s.root.Rename("/a", "/a/b/inside", false)
	wantCode(t, err, torpor.EInvalid)
	_, err = s.root.Rename("/missing", "/x", false)
	wantCode(t, err, torpor.ENotFound)

	wantCode(t, s.root.Remove("/a", false), torpor.EConflict)
	if err := s.root.Remove("/a", true); err != nil {
		t.Fatal(err)
	}
	wantCode(t, s.root.Remove("/a", true), torpor.ENotFound)
}

func TestFifoIsRefusedWithoutBlocking(t *testing.T) {
	s := newSandbox(t)
	if err := syscall.Mkfifo(filepath.Join(s.dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := s.read("/fifo"); done <- err }()
	select {
	case err := <-done:
		wantCode(t, err, torpor.EConflict)
	case <-time.After(5 * time.Second):
		t.Fatal("reading a fifo blocked")
	}
	if info, err := s.root.Stat("/fifo"); err != nil || info.Type != TypeFifo {
		t.Fatalf("stat fifo %+v %v", info, err)
	}
}

// TestEscapes tries every way out of the root that a process inside the
// sandbox can prepare: none reaches the host's files.
func TestEscapes(t *testing.T) {
	s := newSandbox(t)
	s.host(t, "etc/hostname", "sandbox")
	s.symlink(t, s.secret, "abs")                                // absolute symlink to the host path
	s.symlink(t, "../outside/secret", "rel")                     // relative symlink climbing out
	s.symlink(t, "../../../../../../../../"+s.secret, "deeprel") // climbing far
	s.symlink(t, s.outside, "absdir")                            // a parent component
	s.symlink(t, "../outside", "reldir")                         // a relative parent component
	s.symlink(t, "/etc/shadow", "shadow")                        // the classic
	s.symlink(t, "/etc/hostname", "hostname")                    // confined, and fine
	s.symlink(t, "/proc/self/root"+s.secret, "magic")            // through /proc
	s.symlink(t, "loop2", "loop1")                               // loops
	s.symlink(t, "loop1", "loop2")                               //
	for _, p := range []string{
		"/../outside/secret", "../../outside/secret", "/abs", "/rel", "/deeprel",
		"/absdir/secret", "/reldir/secret", "/shadow", "/magic", "/loop1",
	} {
		got, err := s.read(p)
		if strings.Contains(got, secretText) {
			t.Fatalf("%s read the host's secret", p)
		}
		if err == nil {
			t.Fatalf("%s: read %q, want an error (nothing there inside the root)", p, got)
		}
		if torpor.ErrorCodeOf(err) == torpor.EInternal {
			t.Fatalf("%s: internal error %v", p, err)
		}
	}
	if got, err := s.read("/hostname"); got != "sandbox" || err != nil {
		t.Fatalf("a confined absolute symlink: %q %v", got, err)
	}
	// What the escapes point at, made inside the root, is what they read.
	s.host(t, "outside/secret", "inside")
	s.host(t, "etc/shadow", "sandbox shadow")
	for p, want := range map[string]string{"/rel": "inside", "/reldir/secret": "inside", "/shadow": "sandbox shadow", "/../outside/secret": "inside"} {
		if got, err := s.read(p); got != want || err != nil {
			t.Fatalf("%s: %q %v, want %q", p, got, err, want)
		}
	}

	// Writes, mkdirs, renames and removes through the same links stay
	// inside: first with the links dangling inside the root, then with
	// what they point at made inside it.
	writes := []string{"/abs", "/absdir/secret", "/reldir/new", "/absdir/sub/new", "/shadow"}
	for _, p := range writes {
		if _, err := s.root.Write(p, strings.NewReader("pwned"), WriteOptions{}); err != nil && torpor.ErrorCodeOf(err) == torpor.EInternal {
			t.Fatalf("write %s: %v", p, err)
		}
	}
	_, err := s.root.Mkdir("/absdir/made", MkdirOptions{Parents: true})
	wantCode(t, err, torpor.ENotFound)
	s.secretIntact(t)
	if err := os.MkdirAll(filepath.Join(s.dir, s.outside), 0o755); err != nil {
		t.Fatal(err)
	}
	s.symlink(t, s.secret, "abs1")
	for _, p := range append(writes, "/abs1") {
		if _, err := s.root.Write(p, strings.NewReader("pwned"), WriteOptions{}); err != nil {
			t.Fatalf("write %s: %v", p, err)
		}
	}
	if _, err := s.root.Mkdir("/absdir/made", MkdirOptions{Parents: true}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.read(s.outside + "/sub/new"); got != "pwned" || err != nil {
		t.Fatalf("the write through /absdir did not land inside the root: %q %v", got, err)
	}
	s.secretIntact(t)
	// The final symlink was replaced, not written through.
	if info, _ := s.root.Stat("/abs"); info.Type != TypeFile {
		t.Fatalf("/abs is a %s after a write", info.Type)
	}
	s.symlink(t, s.secret, "abs2")
	if err := s.root.Remove("/abs2", false); err != nil {
		t.Fatal(err)
	}
	s.symlink(t, s.outside, "tree/link")
	if err := s.root.Remove("/tree", true); err != nil {
		t.Fatal(err)
	}
	s.symlink(t, s.secret, "abs3")
	if _, err := s.root.Rename("/abs3", "/moved", false); err != nil {
		t.Fatal(err)
	}
	if info, err := s.root.Stat("/moved"); err != nil || info.Type != TypeSymlink || info.LinkTarget != s.secret {
		t.Fatalf("stat of a moved symlink: %+v %v", info, err)
	}
	l, err := s.root.List("/", MaxDepth, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range l.Entries {
		if strings.HasPrefix(e.Path, "/absdir/") || strings.HasPrefix(e.Path, "/reldir/") {
			t.Fatalf("listing followed a symlink: %s", e.Path)
		}
	}
	s.secretIntact(t)
}

// swapLoop swaps the root's entry name between a real thing (made by
// real) and a symlink to target, as fast as it can, until stop closes.
func swapLoop(t *testing.T, dir, name, target string, real func(p string) error, stop chan struct{}) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		p := filepath.Join(dir, name)
		tmpLink, tmpReal := p+".link", p+".real"
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			os.RemoveAll(tmpLink)
			os.RemoveAll(tmpReal)
			if i%2 == 0 {
				if err := os.Symlink(target, tmpLink); err == nil {
					os.Rename(tmpLink, p)
				}
			} else {
				os.RemoveAll(p)
				if err := real(tmpReal); err == nil {
					os.Rename(tmpReal, p)
				}
			}
		}
	}()
	return done
}

// TestSymlinkSwappedDuringCalls: a file and a parent directory are
// swapped with symlinks out of the root, in a loop, while reads, writes
// and listings run: none ever touches the host.
func TestSymlinkSwappedDuringCalls(t *testing.T) {
	s := newSandbox(t)
	stop := make(chan struct{})
	fileSwap := swapLoop(t, s.dir, "f", s.secret, func(p string) error {
		return os.WriteFile(p, []byte("inside"), 0o644)
	}, stop)
	dirSwap := swapLoop(t, s.dir, "d", s.outside, func(p string) error {
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(p, "secret"), []byte("inside"), 0o644)
	}, stop)
	relSwap := swapLoop(t, s.dir, "r", "../outside", func(p string) error {
		return os.Mkdir(p, 0o755)
	}, stop)
	reads := 0
	readAll := func(i int) {
		for _, p := range []string{"/f", "/d/secret", "/r/secret"} {
			got, err := s.read(p)
			if strings.Contains(got, secretText) {
				t.Fatalf("read %d of %s returned the host's secret", i, p)
			}
			if err == nil {
				reads++
			}
		}
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	for i := 0; i < 20000 && time.Now().Before(deadline); i++ {
		readAll(i)
	}
	deadline = time.Now().Add(1500 * time.Millisecond)
	for i := 0; i < 2000 && time.Now().Before(deadline); i++ {
		readAll(i)
		_, _ = s.root.Write("/d/secret", strings.NewReader("written"), WriteOptions{})
		_, _ = s.root.Write("/r/new", strings.NewReader("written"), WriteOptions{})
		_, _ = s.root.Mkdir("/d/sub", MkdirOptions{Parents: true})
		if l, err := s.root.List("/", 3, 0); err == nil {
			for _, e := range l.Entries {
				if e.Name == "secret" && e.Size == int64(len(secretText)) {
					t.Fatalf("listing reached the host's secret at %s", e.Path)
				}
			}
		}
		var buf bytes.Buffer
		if err := s.root.WriteTar(&buf, "/"); err == nil && bytes.Contains(buf.Bytes(), []byte(secretText)) {
			t.Fatal("a tar of the root holds the host's secret")
		}
	}
	close(stop)
	<-fileSwap
	<-dirSwap
	<-relSwap
	if reads == 0 {
		t.Fatal("no read succeeded: the race was not exercised")
	}
	t.Logf("%d successful reads while swapping", reads)
	s.secretIntact(t)
}
