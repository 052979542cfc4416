package files

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// MaxWatchedDirs bounds the directories one recursive watch follows (each
// costs an inotify watch of the host's).
const MaxWatchedDirs = 4096

// watchMask is what a watch asks inotify for on each directory.
const watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_EXCL_UNLINK

var _ Watcher = (*Root)(nil)

// Watch watches the directory p with inotify. Each directory is opened
// confined to the root, watched through its descriptor
// (/proc/self/fd/N, so no path is resolved on the host) and closed again:
// the watch holds no descriptor of the sandbox's file system, so it
// never keeps it mounted, and it ends when that file system is unmounted.
func (r *Root) Watch(p string, recursive bool) (Watch, error) {
	p, err := Clean("path", p)
	if err != nil {
		return nil, err
	}
	fd, err := r.open(p, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	ifd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		if err == unix.EMFILE || err == unix.ENFILE {
			return nil, torpor.Errorf(torpor.EUnavailable, "no inotify instance is left on the host (fs.inotify.max_user_instances, or the daemon's open files)")
		}
		return nil, fmt.Errorf("files: inotify: %w", err)
	}
	w := &inotifyWatch{
		ifd: ifd, top: p, recursive: recursive, dirs: map[int32]string{},
		events: make(chan Event, 256), done: make(chan struct{}),
	}
	if recursive {
		// New directories are opened from the root again later: by its
		// host path, checked to be the same directory.
		var st unix.Stat_t
		if err := unix.Fstat(r.fd, &st); err != nil {
			unix.Close(ifd)
			return nil, fmt.Errorf("files: stat root: %w", err)
		}
		host, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(r.fd))
		if err != nil {
			unix.Close(ifd)
			return nil, fmt.Errorf("files: root path: %w", err)
		}
		w.host, w.hostDev, w.hostIno = host, st.Dev, st.Ino
	}
	if err := w.addTree(fd, "", 0); err != nil {
		unix.Close(ifd)
		return nil, err
	}
	w.f = os.NewFile(uintptr(ifd), "inotify")
	go w.loop()
	return w, nil
}

type inotifyWatch struct {
	ifd       int
	f         *os.File
	top       string // the watched directory, as a sandbox path
	recursive bool
	host      string // the root's host path (recursive only)
	hostDev   uint64
	hostIno   uint64

	dirs   map[int32]string // watch descriptor → directory relative to top ("" for top)
	events chan Event
	err    error
	done   chan struct{}
	once   sync.Once
}

func (w *inotifyWatch) Events() <-chan Event { return w.events }

// Err is valid once Events is closed.
func (w *inotifyWatch) Err() error { return w.err }

func (w *inotifyWatch) Close() error {
	w.once.Do(func() {
		close(w.done)
		w.f.Close()
	})
	return nil
}

// control runs fn on the inotify descriptor, which stays open meanwhile.
func (w *inotifyWatch) control(fn func(fd int)) {
	if w.f == nil {
		fn(w.ifd)
		return
	}
	if rc, err := w.f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { fn(int(fd)) })
	}
}

// addTree watches the open directory fd, named rel below top, and with
// recursive every directory below it.
func (w *inotifyWatch) addTree(fd int, rel string, depth int) error {
	if len(w.dirs) >= MaxWatchedDirs {
		return torpor.Invalid("path", "more than %d directories to watch; watch a smaller tree", MaxWatchedDirs)
	}
	var wd int
	var err error
	w.control(func(ifd int) {
		wd, err = unix.InotifyAddWatch(ifd, "/proc/self/fd/"+strconv.Itoa(fd), watchMask)
	})
	if err != nil {
		if err == unix.ENOSPC {
			return torpor.Errorf(torpor.EUnavailable, "the host's inotify watches are used up (fs.inotify.max_user_watches)")
		}
		return pathError(path.Join(w.top, rel), err)
	}
	w.dirs[int32(wd)] = rel
	if !w.recursive || depth >= maxTreeDepth {
		return nil
	}
	dup, err := unix.Dup(fd)
	if err != nil {
		return fmt.Errorf("files: dup: %w", err)
	}
	f := os.NewFile(uintptr(dup), rel)
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil // gone meanwhile: its watch reports that
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		child, err := openat2(fd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, beneath)
		if err != nil {
			continue // swapped or removed meanwhile
		}
		err = w.addTree(child, path.Join(rel, e.Name()), depth+1)
		unix.Close(child)
		if err != nil {
			return err
		}
	}
	return nil
}

// addNew watches a directory made (or moved in) at rel below top: the
// root is opened again by its host path and must be the same directory.
func (w *inotifyWatch) addNew(rel string) error {
	root, err := OpenRoot(w.host)
	if err != nil {
		return nil // unmounted: the watch is ending
	}
	defer root.Close()
	var st unix.Stat_t
	if unix.Fstat(root.fd, &st) != nil || st.Dev != w.hostDev || st.Ino != w.hostIno {
		return nil
	}
	dir, name := path.Split(path.Join(w.top, rel))
	pfd, err := root.open(path.Clean(dir), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return nil
	}
	defer unix.Close(pfd)
	fd, err := openat2(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, beneath)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	return w.addTree(fd, rel, 0)
}

// forget stops watching rel and the directories below it (moved away).
func (w *inotifyWatch) forget(rel string) {
	for wd, r := range w.dirs {
		if r == rel || len(r) > len(rel) && r[:len(rel)] == rel && r[len(rel)] == '/' {
			w.control(func(ifd int) { _, _ = unix.InotifyRmWatch(ifd, uint32(wd)) })
			delete(w.dirs, wd)
		}
	}
}

func (w *inotifyWatch) loop() {
	defer close(w.events)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.err = fmt.Errorf("files: reading inotify events: %w", err)
			}
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			name := string(nameBytes)
			for i := 0; i < len(name); i++ {
				if name[i] == 0 {
					name = name[:i]
					break
				}
			}
			if !w.handle(ev.Wd, ev.Mask, name) {
				w.Close()
				return
			}
		}
	}
}

// handle reports one inotify event; false ends the watch.
func (w *inotifyWatch) handle(wd int32, mask uint32, name string) bool {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		w.err = torpor.Errorf(torpor.EUnavailable, "too many changes at once: events were lost; watch again")
		return false
	}
	rel, ok := w.dirs[wd]
	if mask&(unix.IN_UNMOUNT) != 0 {
		return false
	}
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd)
		return !(ok && rel == "")
	}
	if !ok || name == "" {
		// An event of a directory itself: its parent reports it, and the
		// watched directory's own removal ends the watch (IN_IGNORED).
		return true
	}
	rel = path.Join(rel, name)
	var op Op
	if mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
		op |= OpCreate
	}
	if mask&unix.IN_MODIFY != 0 {
		op |= OpWrite
	}
	if mask&unix.IN_DELETE != 0 {
		op |= OpRemove
	}
	if mask&unix.IN_MOVED_FROM != 0 {
		op |= OpRename
	}
	if mask&unix.IN_ATTRIB != 0 {
		op |= OpChmod
	}
	if w.recursive && mask&unix.IN_ISDIR != 0 {
		switch {
		case op.Has(OpCreate):
			if err := w.addNew(rel); err != nil {
				w.err = err
				return false
			}
		case op.Has(OpRename):
			w.forget(rel)
		}
	}
	if op == 0 {
		return true
	}
	select {
	case w.events <- Event{Name: rel, Op: op}:
		return true
	case <-w.done:
		return false
	}
}
