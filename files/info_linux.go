package files

import (
	"path"
	"time"

	"golang.org/x/sys/unix"
)

// infoOf describes a file from its stat, as the sandbox path p.
func infoOf(p string, st *unix.Stat_t) Info {
	name := path.Base(p)
	return Info{
		Name:    name,
		Path:    p,
		Type:    typeOf(st.Mode),
		Size:    st.Size,
		Mode:    Mode(st.Mode & MaxMode),
		UID:     st.Uid,
		GID:     st.Gid,
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC(),
	}
}

func typeOf(m uint32) Type {
	switch m & unix.S_IFMT {
	case unix.S_IFREG:
		return TypeFile
	case unix.S_IFDIR:
		return TypeDir
	case unix.S_IFLNK:
		return TypeSymlink
	case unix.S_IFIFO:
		return TypeFifo
	case unix.S_IFSOCK:
		return TypeSocket
	}
	return TypeDevice
}

// statAt describes name in dirfd without following a final symlink, as the
// sandbox path p.
func statAt(dirfd int, name, p string) (Info, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return Info{}, pathError(p, err)
	}
	info := infoOf(p, &st)
	if info.Type == TypeSymlink {
		target, err := readlinkAt(dirfd, name)
		if err != nil {
			return Info{}, pathError(p, err)
		}
		info.LinkTarget = target
	}
	return info, nil
}

// readlinkAt reads the target of the symlink name in dirfd.
func readlinkAt(dirfd int, name string) (string, error) {
	buf := make([]byte, MaxPath+1)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// fstatInfo describes the open file fd as the sandbox path p.
func fstatInfo(fd int, p string) (Info, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Info{}, pathError(p, err)
	}
	info := infoOf(p, &st)
	if p == "/" {
		info.Name = "/"
	}
	return info, nil
}
